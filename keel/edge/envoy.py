"""Envoy's configuration for keel's edge, from the gateway policy: what the real Envoy in front of the gateway's
worker processes does in C++ (docs/serving.md, "The edge").

Pure: values in, Envoy v3 resources (dicts, as Envoy reads them from JSON) out. gpu_runtime/edge.py writes them
and runs Envoy. The split follows how a policy change reaches Envoy without a restart — **file-based xDS**: the
bootstrap (admin address, node, where the dynamic resources are) is written once at start; the listener (LDS: routes,
timeouts, header and body limits, the access log) and the cluster of the gateway's workers (CDS: circuit breakers
per priority, the retry budget, outlier detection) are files in a watched directory, replaced atomically (written
beside, then renamed in): Envoy re-reads them and applies the new listener and cluster draining the old ones, so no
request in flight is dropped. Hot restart (a second Envoy process taking the sockets over) would do the same with a
process more at every policy change; file xDS needs none, and is what a control plane speaking gRPC xDS replaces
later without changing the resources.

- **Routes per served model**: ``/v1/models/<model>/…`` goes to the workers with the model's tier's timeout (twice
  the tier's ``timeout_ms``, the gateway's own deadline for it: the gateway answers its own ``deadline_exceeded``
  first, even late on a starved machine; Envoy's timeout only cuts off a worker that answers nothing) and the tier's Envoy priority (L1 → HIGH: its own circuit-breaker thresholds, never
  queued behind L2's), retries of what never reached a worker (connect failure, reset before an answer, refused
  stream) within the cluster's retry budget. ``/v1/predict`` (the model named in the body) and the operational
  endpoints go to the workers at the lowest tier's timeout.
- **Limits at the edge**: request headers complete within ``header_timeout_s`` (a slowloris client is cut off by
  Envoy, the workers never see it), header size, the body limit (413 before a byte reaches a worker), open
  connections per listener, idle timeouts.
- **Outlier detection over the workers and the replicas**: a worker that stops answering (refused connections,
  resets, timeouts — failures of the connection, *not* the 503 a worker sheds with on purpose under overload) is
  ejected and its requests retried on another. Other replicas' edges (``peers``) stand behind this replica's
  workers at Envoy priority 1: they take traffic as the local workers fail (Envoy's priority spill-over), and are
  ejected the same way when they fail.
- **One id from the edge to the ledger**: Envoy generates ``x-request-id`` (keeping a valid one the caller sent) and
  passes ``traceparent``; its JSON access log carries both, and the gateway keeps them in the exposure log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keel.edge.filters import local_replies, tenant_rate_limit, wasm_filter
from keel.policies.gateway import GatewayPolicy, RateLimit

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
PREVIOUS_PRIORITIES = (
    "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig"
)
HTTP_PROTOCOL_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
DOWNSTREAM_CONNECTIONS = (
    "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)
UPSTREAM = "keel_gateway"  # the cluster of the gateway's worker processes
LISTENER_NAME = "keel_edge"
# Envoy's route timeout: the tier's deadline plus as much again (at least this) — a backstop for a worker that does
# not answer at all, never a race with the gateway's own deadline: a worker that answers late on a starved machine
# (its 200, or its own deadline_exceeded) is heard; one that answers nothing is cut off
DEADLINE_MARGIN_MS = 50
# Envoy's priority per tier: L1 is HIGH (its own circuit-breaker thresholds), every other tier DEFAULT
PRIORITY = {"L1": "HIGH"}
# What Envoy retries: failures before a worker answered (never a request a worker answered, even with an error)
RETRY_ON = "connect-failure,refused-stream,reset"
# The access log: one JSON line per request, the id that follows it into the exposure log and the ledger
ACCESS_LOG_FORMAT = {
    "start": "%START_TIME%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "traceparent": "%REQ(TRACEPARENT)%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(:PATH)%",
    "status": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "route": "%ROUTE_NAME%",
    "upstream": "%UPSTREAM_HOST%",
    "duration_ms": "%DURATION%",
    "upstream_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "bytes_in": "%BYTES_RECEIVED%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
}


# The lower tiers' requests in flight per worker at most, whatever the policy's caps: one Python process cannot use
# more (at ~1 ms of its own per request, 32 are 32 ms of its queue) — the rest would wait in its waiting room and be
# refused there, in Python, on the cores L1 needs. A flood meets the edge's breakers within milliseconds instead, and
# the edge's flood cut (keel/edge/flood.py) sooner.
LOWER_PER_HOST = 32


@dataclass(frozen=True)
class EdgeLimits:
    """What the edge accepts — the limits table of docs/serving.md, held by Envoy before the workers see a byte."""

    max_body_bytes: int = 1 << 20
    header_timeout_s: float = 10.0
    max_header_kb: int = 32
    max_connections: int = 1024
    # a kept-alive client connection idle this long is closed — longer than clients keep theirs (aiohttp 15 s,
    # browsers ~60 s): a client never sends on a connection the edge is closing (the overload manager caps them)
    idle_timeout_s: float = 75.0
    upstream_idle_s: float = 4.0  # Envoy's own idle connections to a worker: closed before the worker's keep-alive
    connect_timeout_ms: int = 250
    lower_per_host: int = LOWER_PER_HOST  # the lower tiers' requests in flight per worker at most
    priority_connections: int = 256  # L1's own door (keel/edge/door.py): its connections, outside max_connections


@dataclass(frozen=True)
class EdgeSpec:
    """Everything the edge's configuration is made of: where it listens, the workers behind it, the served models
    and their tiers (model → tier), the policy (tiers' deadlines, retry budget), the limits and the log's path."""

    port: int
    workers: tuple[int, ...]  # the workers' internal loopback ports
    models: dict[str, str]  # served model → its tier
    policy: GatewayPolicy = field(default_factory=GatewayPolicy)
    limits: EdgeLimits = field(default_factory=EdgeLimits)
    access_log: str = "/dev/null"
    host: str = "127.0.0.1"
    wasm: str | None = None  # the edge filter's module (gpu_runtime/edge_filter/): None, no filter (tests of routing)
    filter_config: str = ""  # its configuration: edge_filter_config(...)
    tenant_limits: dict[str, RateLimit] = field(default_factory=dict)  # tenant → its rate at this edge
    peers: tuple[tuple[str, int], ...] = ()  # other replicas' edges (host, port): the failover behind the workers
    priority_port: int | None = None  # L1's own door (keel/edge/door.py); None: L1 comes in by ``port`` alone

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("the edge needs at least one gateway worker behind it")
        unknown = {t for t in self.models.values() if t not in self.policy.tiers}
        if unknown:
            raise ValueError(f"served models in tiers the policy does not define: {sorted(unknown)}")


def parse_peers(text: str) -> tuple[tuple[str, int], ...]:
    """Other replicas' edges from ``ip:port,ip:port`` (``$KEEL_EDGE_PEERS``): IP addresses (the cluster is static —
    on Kubernetes each pod's IP, as ``KEEL_ADVERTISE_HOST``); ValueError naming the entry otherwise."""
    import ipaddress

    out = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        host, _, port = entry.rpartition(":")
        try:
            ipaddress.ip_address(host.strip("[]"))
            number = int(port)
        except ValueError:
            raise ValueError(f"edge peer {entry!r}: expected ip:port (an IP address, not a name)") from None
        if not 0 < number < 65536:
            raise ValueError(f"edge peer {entry!r}: port {number} is not a port")
        out.append((host.strip("[]"), number))
    return tuple(out)


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.3f}s"


def route_timeout_ms(spec: EdgeSpec, tier: str) -> float:
    timeout = spec.policy.tiers[tier].timeout_ms
    return timeout + max(DEADLINE_MARGIN_MS, timeout)


def longest_route_ms(spec: EdgeSpec) -> float:
    return max(route_timeout_ms(spec, tier) for tier in spec.policy.tiers)


def routes(spec: EdgeSpec) -> list[dict[str, Any]]:
    """A route per served model (its tier's timeout and priority), then the body-routed predict and the rest."""
    slowest = max(spec.policy.tiers, key=lambda t: spec.policy.tiers[t].timeout_ms)
    retry = {
        "retry_on": RETRY_ON,
        # the policy's retries — and for what never reached a worker, as many as it takes to try every other host
        # once (a dead worker's retry may meet the other dead one before either is ejected); the budget caps both
        "num_retries": max(spec.policy.retry.max_attempts - 1, len(spec.workers) + len(spec.peers) - 1, 0),
        # a retry goes to another worker than the one that failed
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": 10,
    }  # fmt: skip
    if spec.peers:  # once every local worker was tried, a retry goes to another replica (not only once ejected)
        retry["retry_priority"] = {"name": "envoy.retry_priorities.previous_priorities", "typed_config": {
            "@type": PREVIOUS_PRIORITIES, "update_frequency": len(spec.workers)}}  # fmt: skip

    def to_workers(tier: str) -> dict[str, Any]:
        return {
            "cluster": UPSTREAM,
            "timeout": _seconds(route_timeout_ms(spec, tier)),
            "priority": PRIORITY.get(tier, "DEFAULT"),
            "retry_policy": retry,
        }

    out = [
        {"name": f"model:{model}", "match": {"prefix": f"/v1/models/{model}/"}, "route": to_workers(tier)}
        for model, tier in sorted(spec.models.items())
    ]
    # the body-routed predict: a request the edge filter let claim L1 (its tenant was given L1) at priority HIGH
    l1 = {"name": "x-keel-tier", "string_match": {"exact": "L1"}}
    high = to_workers(slowest) | {"priority": "HIGH"}
    out.append({"name": "predict:L1", "match": {"prefix": "/v1/", "headers": [l1]}, "route": high})
    out.append({"name": "predict", "match": {"prefix": "/v1/"}, "route": to_workers(slowest)})
    out.append({"name": "operations", "match": {"prefix": "/"}, "route": to_workers(slowest)})
    return out


def connection_manager(spec: EdgeSpec, name: str, route_list: list[dict[str, Any]]) -> dict[str, Any]:
    """A listener's HTTP connection manager: the routes, the limits, the edge filter and the access log."""
    lim = spec.limits
    return {
        "@type": HCM,
        "stat_prefix": name,
        "codec_type": "AUTO",
        "generate_request_id": True,
        "preserve_external_request_id": True,  # a caller's id is kept (Envoy replaces one that is not a valid id)
        # the headers within the header timeout, the whole request (its body) within as much again (the gateway's
        # body timeout: a stalled body is 408 at the edge); a stream with nothing moving either way is cut only after
        # the longest route's timeout — never while a worker is still within its time
        "request_headers_timeout": _seconds(lim.header_timeout_s * 1000),
        "request_timeout": _seconds(2 * lim.header_timeout_s * 1000),
        "stream_idle_timeout": _seconds(max(lim.header_timeout_s * 1000, longest_route_ms(spec) + 1000)),
        "max_request_headers_kb": lim.max_header_kb,
        "common_http_protocol_options": {
            "idle_timeout": _seconds(lim.idle_timeout_s * 1000),
            "headers_with_underscores_action": "REJECT_REQUEST",
        },
        "local_reply_config": local_replies(),
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": FILE_LOG,
                    "path": spec.access_log,
                    "log_format": {"json_format": ACCESS_LOG_FORMAT},
                },
            }
        ],  # fmt: skip
        "route_config": {
            "name": "keel_routes",
            "virtual_hosts": [{"name": "keel", "domains": ["*"], "routes": route_list}],
        },
        "http_filters": [
            *([wasm_filter(spec.wasm, spec.filter_config)] if spec.wasm else []),
            *([tenant_rate_limit(spec.tenant_limits)] if spec.tenant_limits else []),
            {
                "name": "envoy.filters.http.buffer",
                "typed_config": {"@type": BUFFER, "max_request_bytes": lim.max_body_bytes},
            },
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
        ],  # fmt: skip
    }


def listener(
    spec: EdgeSpec, name: str = LISTENER_NAME, port: int | None = None, route_list: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One of the edge's listeners: by default the main one, every tier's door (``spec.port``, all the routes);
    keel/edge/door.py makes L1's own with its name, port and routes."""
    manager = connection_manager(spec, name, routes(spec) if route_list is None else route_list)
    return {
        "@type": LISTENER,
        "name": name,
        "address": {"socket_address": {"address": spec.host, "port_value": spec.port if port is None else port}},
        "per_connection_buffer_limit_bytes": spec.limits.max_body_bytes + 64 * 1024,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }  # fmt: skip


PENDING_PER_HOST = 4  # lower tiers' requests that may wait at the edge for a place, per worker (L1's: all it holds)


def priority_limits(spec: EdgeSpec) -> dict[str, tuple[int, int]]:
    """Envoy priority → (requests in flight to the workers, requests waiting at the edge for one): the gateways' own
    caps (the policy's ``admit_in_flight``: per process, per tier) times the hosts behind the edge — HIGH holds the
    highest tier's, DEFAULT every lower tier's together, at most ``limits.lower_per_host`` a host. What a worker could
    serve is never refused here; a flood beyond it is refused by Envoy in C++ (503 ``shed``, stage ``edge``) before a
    Python worker reads a byte of it. A tier the policy does not cap: the connection limit."""
    hosts = len(spec.workers) + len(spec.peers)
    caps = spec.policy.admit_in_flight
    top = [t for t in spec.policy.tiers if PRIORITY.get(t) == "HIGH"]
    lower = [t for t in spec.policy.tiers if PRIORITY.get(t) != "HIGH"]

    def capped(tiers: list[str], per_host: int) -> int:
        if not tiers or any(t not in caps for t in tiers):
            return spec.limits.max_connections
        return max(1, min(spec.limits.max_connections, hosts * min(per_host, sum(caps[t] for t in tiers))))

    high, default = capped(top, spec.limits.max_connections), capped(lower, spec.limits.lower_per_host)
    return {"HIGH": (high, high), "DEFAULT": (default, max(1, min(default, hosts * PENDING_PER_HOST)))}


def cluster(spec: EdgeSpec) -> dict[str, Any]:
    """The gateway's workers as one cluster: least-request balancing, breakers per priority with a retry budget, and
    outlier detection on connection failures only (a worker's deliberate 503 under overload is not a failure)."""
    lim = spec.limits
    thresholds = []
    for priority, (in_flight, pending) in priority_limits(spec).items():
        thresholds.append({
            "priority": priority,
            "max_connections": in_flight,  # HTTP/1.1 to the workers: a request in flight holds a connection
            "max_requests": in_flight,
            "max_pending_requests": pending,
            # the policy's retry budget: retries add at most budget_ratio to the requests in flight
            "retry_budget": {"budget_percent": {"value": spec.policy.retry.budget_ratio * 100},
                             "min_retry_concurrency": 3},
        })  # fmt: skip
    return {
        "@type": CLUSTER,
        "name": UPSTREAM,
        "type": "STATIC",
        "connect_timeout": _seconds(lim.connect_timeout_ms),
        "lb_policy": "LEAST_REQUEST",
        # idle connections to the workers close before the workers' keep-alive closes them (no request is sent on
        # a connection the worker is closing)
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_PROTOCOL_OPTIONS,
                "explicit_http_config": {"http_protocol_options": {}},
                "common_http_protocol_options": {"idle_timeout": _seconds(lim.upstream_idle_s * 1000)},
            }
        },
        "circuit_breakers": {"thresholds": thresholds},
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            # three failures of the connection in a row (refused, reset, or no answer by the route's timeout): a dead
            # worker meets them within milliseconds, each retried elsewhere; a busy worker's one late answer does not
            "consecutive_local_origin_failure": 3,
            "enforcing_consecutive_local_origin_failure": 100,
            "consecutive_5xx": 1_000_000,  # answers with any status are the worker's: never a reason to eject
            "enforcing_consecutive_5xx": 0,
            "consecutive_gateway_failure": 1_000_000,
            "enforcing_consecutive_gateway_failure": 0,
            "interval": "1s",
            "base_ejection_time": "5s",
            # alone, never more than half the workers (the rest take the traffic); with replicas behind them, every
            # failing local worker may go (the peers take it)
            "max_ejection_percent": 100 if spec.peers else 50,
        },
        "load_assignment": {"cluster_name": UPSTREAM, "endpoints": endpoints(spec)},
    }


def endpoints(spec: EdgeSpec) -> list[dict[str, Any]]:
    """The workers on loopback at priority 0; other replicas' edges, when there are, at priority 1."""

    def at(host: str, port: int) -> dict[str, Any]:
        return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}

    out = [{"priority": 0, "lb_endpoints": [at("127.0.0.1", p) for p in spec.workers]}]
    if spec.peers:
        out.append({"priority": 1, "lb_endpoints": [at(h, p) for h, p in spec.peers]})
    return out


def bootstrap(admin_port: int, xds_dir: str, max_connections: int = 1024, node: str = "keel-edge") -> dict[str, Any]:
    """Envoy's start-up file: its admin endpoint (loopback only), the limit of open downstream connections across
    its listeners (the overload manager: one more is refused at accept), and the listener and cluster read from the
    files of ``xds_dir`` (``lds.json``, ``cds.json``), re-read whenever one is renamed into it."""

    def source(name: str) -> dict[str, Any]:
        return {"path_config_source": {"path": f"{xds_dir}/{name}", "watched_directory": {"path": xds_dir}},
                "resource_api_version": "V3"}  # fmt: skip

    return {
        "node": {"id": node, "cluster": "keel"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {"lds_config": source("lds.json"), "cds_config": source("cds.json")},
        # values the serving process changes through the admin port (keel/edge/flood.py: the lower tiers' places
        # while they flood), over the configuration's
        "layered_runtime": {"layers": [{"name": "admin", "admin_layer": {}}]},
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {"@type": DOWNSTREAM_CONNECTIONS, "max_active_downstream_connections": max_connections},
        }]},
    }  # fmt: skip


def discovery(resources: list[dict[str, Any]], version: str) -> dict[str, Any]:
    """A file-xDS document: Envoy reads a DiscoveryResponse."""
    return {"version_info": version, "resources": resources}
