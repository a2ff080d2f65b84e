"""Where the edge's batch-1 overhead goes: the real Envoy in front of one stand-in worker (tests/edge/stand_in.py, a
constant answer), closed loop, the same requests through Envoy configured as keel configures it and with one part
left out at a time — the WASM filter (the key's SHA-256, the labels), the JSON access log, the buffer filter (the
body limit) — and bare (Envoy's own floor: a listener and a router to the one worker, nothing of keel's) beside the
worker alone. Rounds interleave the variants; medians of the rounds' p50s.

    .venv/bin/python bench/edge_parts.py [--requests 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_runtime.edge as edge_module  # noqa: E402
from gpu_runtime.triton import free_port  # noqa: E402
from keel.edge import envoy  # noqa: E402
from keel.edge.envoy import EdgeSpec  # noqa: E402
from keel.edge.filters import edge_filter_config  # noqa: E402
from keel.tenants import RISK_LEVELS, TIERS, Tenant, new_key  # noqa: E402
from tests.edge.test_envoy import Worker  # noqa: E402

MODELS = {"flight-delay": "L2"}
PATH = "/v1/models/flight-delay/predict"
VARIANTS = [  # name, parts of the listener left out, with the WASM filter
    ("as keel runs it", (), True),
    ("no WASM filter", (), False),
    ("no access log", ("log",), True),
    ("no buffer filter", ("buffer",), True),
    ("none of the three", ("log", "buffer"), False),
    ("bare Envoy", ("all",), False),  # Envoy's own floor: listener → router → one host, nothing of keel's
]


def listener_without(parts: tuple[str, ...]):
    def make(spec):
        out = envoy.listener(spec)
        manager = out["filter_chains"][0]["filters"][0]["typed_config"]
        if "all" in parts:  # the HTTP connection manager with its defaults, one route without retries or timeouts
            route = {"match": {"prefix": "/"}, "route": {"cluster": envoy.UPSTREAM}}
            manager.clear()
            manager.update({"@type": envoy.HCM, "stat_prefix": "bare", "http_filters": [
                {"name": "envoy.filters.http.router", "typed_config": {"@type": envoy.ROUTER}}],
                "route_config": {"virtual_hosts": [{"name": "bare", "domains": ["*"], "routes": [route]}]}})  # fmt: skip
            return out
        if "log" in parts:
            manager.pop("access_log")
        if "buffer" in parts:
            manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != "envoy.filters.http.buffer"]
        return out

    return make


def cluster_without(parts: tuple[str, ...]):
    def make(spec):
        out = envoy.cluster(spec)
        if "all" in parts:  # no breakers, no outlier detection, round robin
            for key in ("circuit_breakers", "outlier_detection", "lb_policy"):
                out.pop(key)
        return out

    return make


def p50(port: int, headers: dict[str, str], n: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("POST", PATH, b"{}", headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        lat.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return statistics.median(lat[n // 10 :])  # (the first tenth warms the connection up)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    key, stored = new_key("2013-02-15T00:00:00+00:00")
    config = edge_filter_config("bench-token", [Tenant("bench", (stored,), TIERS, RISK_LEVELS)], MODELS)
    work = Path(tempfile.mkdtemp(prefix="keel-bench-edge-"))
    (work / "worker").mkdir()
    worker = Worker(work / "worker")
    edges = []
    try:
        for i, (name, parts, wasm) in enumerate(VARIANTS):
            edge_module.listener = listener_without(parts)  # what EnvoyEdge writes for this variant
            edge_module.cluster = cluster_without(parts)
            spec = EdgeSpec(port=free_port(), workers=(worker.port,), models=MODELS, filter_config=config,
                            wasm=edge_module.edge_filter_module() if wasm else None)  # fmt: skip
            edges.append((name, edge_module.EnvoyEdge(work / f"edge{i}", spec, token="bench-token").start()))
        results: dict[str, list[float]] = {"the worker alone": []}
        for _ in range(args.rounds):
            results["the worker alone"].append(p50(worker.port, {}, args.requests))
            for name, edge in edges:
                results.setdefault(name, []).append(p50(edge.spec.port, {"x-api-key": key}, args.requests))
    finally:
        for _, edge in edges:
            edge.stop()
        worker.kill()
    alone = statistics.median(results["the worker alone"])
    print(f"{'way':<22} {'p50 ms':>8} {'over the worker alone':>22}")
    for name, values in results.items():
        print(f"{name:<22} {statistics.median(values):>8.3f} {statistics.median(values) - alone:>+22.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
