"""Prometheus text exposition for the gateway, without a client library: counters, gauges, histograms."""

from __future__ import annotations

import threading
from collections import defaultdict

BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

HELP = {
    "keel_gateway_requests_total": ("counter", "Prediction requests by model version and HTTP status."),
    "keel_gateway_errors_total": (
        "counter",
        "Prediction requests answered with an error, by model version and code.",
    ),
    "keel_gateway_backend_errors_total": ("counter", "Failed Triton calls by model version (before retries)."),
    "keel_gateway_rate_limited_total": ("counter", "Requests refused by a tenant's rate limit."),
    "keel_gateway_request_duration_seconds": ("histogram", "Gateway latency per request, by model version."),
    "keel_gateway_breaker_state": ("gauge", "Circuit breaker per model version: 0 closed, 1 half-open, 2 open."),
    "keel_gateway_breaker_transitions": ("gauge", "Circuit breaker transitions so far per model version and state."),
    "keel_gateway_lane_in_flight": ("gauge", "Requests in flight per risk-level lane."),
    "keel_gateway_tier_in_flight": ("gauge", "Requests in flight per service tier (admission across models)."),
    "keel_gateway_shed_total": ("counter", "Requests shed by tier admission: no place for their tier in time."),
    "keel_gateway_routing_generation": ("gauge", "Generation of the routing table the gateway follows."),
    "keel_gateway_sla_target_p99_seconds": ("gauge", "The model's SLA tier: p99 latency target."),
    "keel_gateway_sla_target_availability": ("gauge", "The model's SLA tier: availability target."),
    "keel_gateway_policy_version": ("gauge", "Version of the policy store in force in this gateway."),
    "keel_gateway_policy_rejected_total": (
        "counter",
        "Committed policy versions this gateway refused (kept the last good).",
    ),
    "keel_gateway_watch_errors_total": ("counter", "Errors while following routing and policies."),
    "keel_gateway_runtime_unavailable_total": (
        "counter",
        "Requests that arrived while the model runtime (Triton) was down: the coarse model's answer, the last-resort "
        "score or 503.",
    ),
    "keel_gateway_hedges_total": (
        "counter",
        "Highest-tier requests Triton had not answered by 40 % of their budget, scored by the coarse model too",
    ),
    "keel_gateway_coarse_answers_total": (
        "counter",
        "Answers from the model's coarse model (no version could answer: breakers open, retries spent, runtime down).",
    ),
    "keel_gateway_coarse_unusable_total": (
        "counter",
        "Times the routed coarse model could not be used (file missing, or not the sha256 the routing table names).",
    ),
    "keel_gateway_runtime_up": ("gauge", "1 while Triton is up, 0 while it is down or restarting."),
    "keel_gateway_runtime_restarts_total": ("counter", "Times the supervisor restarted Triton."),
    "keel_gateway_policy_store_regressions_total": (
        "counter",
        "Times the policy store's version went below the version this gateway applied (refused; last good kept).",
    ),
    "keel_gateway_policy_store_version": ("gauge", "The policy store's version when it went backwards."),
    "keel_gateway_exposure_write_failures_total": (
        "counter",
        "Answered requests whose exposure-log record could not be written (lost: disk full, file-size limit).",
    ),
    "keel_gateway_tenant_requests_total": (
        "counter",
        "Answers by tenant and HTTP status (tenants a cost or budget policy names; all others as 'other').",
    ),
    "keel_gateway_budget_exceeded_total": ("counter", "Requests refused 429 budget_exceeded, by budgeted tenant."),
    "keel_gateway_tenant_spend": ("gauge", "Spend of each budgeted tenant in the budget's current period."),
    "keel_gateway_tenant_budget": ("gauge", "Each budgeted tenant's limit in the budget's period."),
    "keel_gateway_tenant_budget_state": ("gauge", "Each budgeted tenant's budget state: 0 ok, 1 soft, 2 hard."),
    "keel_gateway_compute_log_failures_total": ("counter", "Compute samples that could not be written."),
    "keel_gateway_concurrency_limit": (
        "gauge",
        "The process's adaptive concurrency limit (Gradient2 on observed latency); each tier may use a share.",
    ),
    "keel_gateway_lower_tier_share": (
        "gauge",
        "Share of their limit the tiers below the highest may use, cut while the highest tier's latency grows.",
    ),
    "keel_gateway_in_flight": ("gauge", "Requests holding a place in the process's tier admission."),
    "keel_gateway_shed_before_body_total": (
        "counter",
        "Requests shed on their route alone, before the body was read.",
    ),
    "keel_gateway_local_timeouts_total": (
        "counter",
        "Triton timeouts blamed on local overload (no breaker strike): loop lag, queueing or CPU pressure.",
    ),
    "keel_gateway_client_gone_total": ("counter", "Requests dropped because their client had gone, by stage."),
    "keel_gateway_loop_lag_seconds": ("gauge", "The event loop's worst lag over the last second."),
    "keel_gateway_loop_busy": ("gauge", "Share of the last second the event loop's thread was on the CPU."),
    "keel_gateway_cpu_pressure": ("gauge", "Share of the last second some runnable task waited for a CPU (PSI)."),
    "keel_gateway_gc_seconds": (
        "histogram",
        "The gateway's Python garbage collections, by generation: each stops the event loop for its duration "
        "(the objects of start-up are frozen out of them: app.py).",
    ),
    "keel_gateway_coarse_seconds": (
        "histogram",
        "Time to a coarse-model answer, queueing on the coarse pool included.",
    ),
    "keel_gateway_standing_queue": (
        "gauge",
        "1 while the event loop has a standing queue (CoDel: its 5 ms timer's least lag over 100 ms > 1 ms).",
    ),
    "keel_gateway_coarse_in_flight": ("gauge", "Requests queued or scoring on the coarse pool."),
    "keel_gateway_triton_abandoned": (
        "gauge",
        "Triton calls the gateway stopped waiting for (their time ran out) that Triton has not answered yet: "
        "abandoned, never cancelled (scoring.py).",
    ),
    "keel_gpu_pool_bytes_in_use": ("gauge", "Bytes in use in each model's memory pool."),
    "keel_gpu_pool_limit_bytes": ("gauge", "Each model's memory pool limit (budget x headroom)."),
}


def escape_label_value(value: object) -> str:
    """A label value as the Prometheus text format requires: backslash, double quote and line feed escaped, so that
    no value can end its line or add lines to the exposition."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _fmt(v: float) -> str:
    """Exact: integers as integers, other values as Python's shortest round-tripping repr."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, dict[tuple, float]] = defaultdict(dict)
        self.gauges: dict[str, dict[tuple, float]] = defaultdict(dict)
        self.hist: dict[str, dict[tuple, list[float]]] = defaultdict(dict)  # bucket counts + [sum, count]

    def inc(self, name: str, labels: dict[str, str], by: float = 1.0) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self.counters[name][key] = self.counters[name].get(key, 0.0) + by

    def set_gauge(self, name: str, labels: dict[str, str], value: float) -> None:
        with self._lock:
            self.gauges[name][tuple(sorted(labels.items()))] = float(value)

    def clear_gauge(self, name: str) -> None:
        with self._lock:
            self.gauges.pop(name, None)

    def add_gauge(self, name: str, labels: dict[str, str], by: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self.gauges[name][key] = self.gauges[name].get(key, 0.0) + by

    def observe(self, name: str, labels: dict[str, str], value: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            h = self.hist[name].get(key)
            if h is None:
                h = self.hist[name][key] = [0.0] * (len(BUCKETS) + 2)
            for i, bound in enumerate(BUCKETS):
                if value <= bound:
                    h[i] += 1
            h[-2] += value
            h[-1] += 1

    def value(self, name: str, labels: dict[str, str]) -> float:
        key = tuple(sorted(labels.items()))
        return self.counters.get(name, {}).get(key, self.gauges.get(name, {}).get(key, 0.0))

    def snapshot(self) -> dict:
        """Every series as JSON-able lists (a gateway worker's share of /metrics, metrics_exchange.py)."""
        with self._lock:
            return {
                kind: {
                    name: [[list(map(list, key)), v] for key, v in series.items()] for name, series in table.items()
                }
                for kind, table in (("counters", self.counters), ("gauges", self.gauges), ("hist", self.hist))
            }

    def render(self, others: dict[int, dict] | None = None, worker: int | None = None) -> str:
        """The Prometheus text. ``others``: the snapshots of the process's fellow workers (by worker index) — their
        counters and histograms are added to this one's; gauges, which are each process's own state, carry a
        ``worker`` label (this one's: ``worker``)."""
        counters, gauges, hist = self.counters, self.gauges, self.hist
        with self._lock:
            if others:
                counters, gauges, hist = _merged(self, others, worker)
            return _render(counters, gauges, hist)


def _merged(own: Metrics, others: dict[int, dict], worker: int | None):
    counters = {n: dict(series) for n, series in own.counters.items()}
    hist = {n: {k: list(h) for k, h in series.items()} for n, series in own.hist.items()}
    gauges: dict[str, dict[tuple, float]] = defaultdict(dict)
    for name, series in own.gauges.items():
        for key, v in series.items():
            gauges[name][tuple(sorted((*key, ("worker", str(worker)))))] = v
    for index, snap in others.items():
        for name, series in snap.get("counters", {}).items():
            for key, v in series:
                k = tuple(tuple(x) for x in key)
                counters.setdefault(name, {})[k] = counters.get(name, {}).get(k, 0.0) + v
        for name, series in snap.get("hist", {}).items():
            for key, h in series:
                k = tuple(tuple(x) for x in key)
                mine = hist.setdefault(name, {}).setdefault(k, [0.0] * len(h))
                for i, x in enumerate(h):
                    mine[i] += x
        for name, series in snap.get("gauges", {}).items():
            for key, v in series:
                gauges[name][tuple(sorted((*(tuple(x) for x in key), ("worker", str(index)))))] = v
    return counters, gauges, hist


def _render(counters, gauges, hist) -> str:
    lines: list[str] = []
    for name in sorted(set(counters) | set(gauges) | set(hist)):
        kind, text = HELP.get(name, ("untyped", name))
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for key, v in sorted(counters.get(name, {}).items()):
            lines.append(f"{name}{_labels(dict(key))} {_fmt(v)}")
        for key, v in sorted(gauges.get(name, {}).items()):
            lines.append(f"{name}{_labels(dict(key))} {_fmt(v)}")
        for key, h in sorted(hist.get(name, {}).items()):
            labels = dict(key)
            for i, bound in enumerate(BUCKETS):
                lines.append(f"{name}_bucket{_labels(labels | {'le': f'{bound:g}'})} {_fmt(h[i])}")
            lines.append(f"{name}_bucket{_labels(labels | {'le': '+Inf'})} {_fmt(h[-1])}")
            lines.append(f"{name}_sum{_labels(labels)} {h[-2]:.6f}")
            lines.append(f"{name}_count{_labels(labels)} {_fmt(h[-1])}")
    return "\n".join(lines) + "\n"


class LabelledMetrics:
    """A view of ``Metrics`` that adds ``labels`` to every series: each model's gateway context of a multi-model
    gateway writes its series with ``model=<name>`` into the one registry /metrics renders."""

    def __init__(self, base: Metrics, labels: dict[str, str]):
        self.base = base
        self.labels = dict(labels)

    def inc(self, name: str, labels: dict[str, str], by: float = 1.0) -> None:
        self.base.inc(name, labels | self.labels, by)

    def set_gauge(self, name: str, labels: dict[str, str], value: float) -> None:
        self.base.set_gauge(name, labels | self.labels, value)

    def clear_gauge(self, name: str) -> None:
        self.base.clear_gauge(name)

    def add_gauge(self, name: str, labels: dict[str, str], by: float) -> None:
        self.base.add_gauge(name, labels | self.labels, by)

    def observe(self, name: str, labels: dict[str, str], value: float) -> None:
        self.base.observe(name, labels | self.labels, value)

    def value(self, name: str, labels: dict[str, str]) -> float:
        return self.base.value(name, labels | self.labels)

    def render(self, others: dict[int, dict] | None = None, worker: int | None = None) -> str:
        return self.base.render(others, worker)


EDGE_STATS_TIMEOUT_S = 2.0


def edge_stats(admin: str) -> str:
    """Envoy's own stats (its admin ``/stats/prometheus``, on loopback; the series it has used), for the gateway's
    ``/metrics`` behind the edge — one scrape shows both. ``keel_edge_up`` says whether they could be read."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{admin}/stats/prometheus?usedonly", timeout=EDGE_STATS_TIMEOUT_S) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
    except OSError as exc:
        return f"# keel: the edge's stats could not be read ({exc})\n# TYPE keel_edge_up gauge\nkeel_edge_up 0\n"
    return f"# TYPE keel_edge_up gauge\nkeel_edge_up 1\n{text}"


async def edge_scrape(admin: str | None) -> str:
    """Behind the edge (``admin``: Envoy's admin address), Envoy's stats read off the event loop; else nothing."""
    import asyncio

    return await asyncio.to_thread(edge_stats, admin) if admin else ""
