"""Service tiers under overload: two models in one runtime, driven past what it can serve on this machine.

The real model runtime (``python -m gpu_runtime.serve``: Triton + the gateway) in a throwaway KEEL_HOME serves
flights' delay model (tier L2, as declared) and hotels' rate model (tier L1): each trained here on its own real data
(flights January 2013; hotels' bookings that arrived July–September 2016), each with its own online store. Then, in
one run:

1. **unloaded**: hotels' quotes one at a time (closed loop) — L1's latency with the runtime to itself;
2. **overload, tier admission** (the policy of this bench: ``ADMISSION``): hotels' quotes at a modest open-loop rate
   beside flights requests offered far faster than the runtime answers (open loop, many in flight);
3. **overload, no tier admission** (limits too high to bind — the peer: what one shared runtime does without tiers),
   the same offered load.

Each phase reports per tier: offered, admitted (200) and shed (503 ``shed``) shares, other errors (client timeouts
after ``CLIENT_TIMEOUT_S`` among them), p50/p99 of the answered requests. Each open-loop stream runs in a process of
its own (``--drive``: this file, reading its stream from a JSON file and writing its counts as JSON), so neither the
bench's own work nor the flood's client loop delays the L1 client. The goal (issue 45): L1 p99
under the L2 flood within 3× its unloaded p99, L1 shed share 0.

``--edge``: the same through the edge (issue 48) — Envoy with keel's edge filter on the runtime's port in front of
the gateway's workers, each stream with its tenant's API key (``quotes`` for L1, ``ops`` for L2): what the edge adds
to L1 under the flood (the filter authenticates every request of the flood too).

    .venv/bin/python bench/tiers.py [--seconds 20] [--l1-rps 40] [--l2-rps 1500] [--edge]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiers_drive.py beside it

import polars as pl  # noqa: E402
from tiers_drive import closed_loop, drive_in_own_process  # noqa: E402

from gpu_runtime.triton import TritonControl, free_port  # noqa: E402
from keel.deploy.routing import Route, Target  # noqa: E402
from keel.features.offline import offline_features  # noqa: E402
from keel.features.online import build_views  # noqa: E402
from keel.features.sqlite_store import SQLiteOnlineStore  # noqa: E402
from keel.registry import ModelRegistry  # noqa: E402
from keel.training.model import DEFAULT_PARAMS, TrainingConfig, train_model  # noqa: E402
from keel.usecase import from_module  # noqa: E402
from resources.triton import TritonResource  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOTELS_AS_OF = date(2016, 10, 1)  # the store as of October's first day; quotes of October are asked
ADMISSION = {  # a shared runtime's tiers on this 2-core machine: L2 may hold 8 places, L1 the 16 above them too
    "admit_in_flight": {"L1": 24, "L2": 8, "L3": 2},
    "admit_wait_ms": {"L1": 1000, "L2": 10, "L3": 0},
}
GOAL_RATIO = 3.0
NO_ADMISSION = {"admit_in_flight": {"L1": 100_000, "L2": 100_000, "L3": 100_000}, "admit_wait_ms": {}}
BASE_POLICY = {  # the risk lanes and the tenants' rate limits out of the way: tiers are what is measured
    "lanes": {1: 4096, 2: 4096, 3: 4096},
    "default_rate_limit": {"rps": 1_000_000, "burst": 1_000_000},
}


def load_bench_serving():
    spec = importlib.util.spec_from_file_location("bench_serving", Path(__file__).parent / "serving.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setup_hotels(home: Path, uc) -> tuple[str, list[dict]]:
    """Hotels' model (arrivals July–September 2016, early-stopped on October's quotes), its store as of October's
    first day, and October's quotes as request entities."""
    from usecases.hotels import replay

    valid = replay.valid_bookings()
    history = valid.filter(pl.col("arrival_date").dt.date() < date(2016, 11, 1))
    feats = offline_features(uc.features, history, {}, history)
    config = TrainingConfig(
        train_months=("2016-07", "2016-08", "2016-09"),
        valid_month="2016-10",
        params={**DEFAULT_PARAMS, **uc.model.params},
    )
    text = train_model(feats, config, uc.features).text
    store = SQLiteOnlineStore(home / "online" / "hotels.sqlite", features=uc.features)
    store.write_snapshot(build_views(uc.features, {}, history, as_of=HOTELS_AS_OF), as_of=HOTELS_AS_OF, partition="b")
    store.close()
    registry = ModelRegistry(home / "registry")
    registry.register(uc.model.name, text, {})
    registry.close()
    return text, replay.quotes("2016-10")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summary(phase: str, result: dict) -> list[str]:
    lines = []
    for tier, r in sorted(result.items()):
        sent = max(r["sent"], 1)
        p50, p99 = pct(r["lat"], 0.5), pct(r["lat"], 0.99)
        lines.append(
            f"| {phase} | {tier} | {r['sent']} | {r['ok'] / sent:.1%} | {r['shed'] / sent:.1%} | {r['other'] / sent:.1%} "
            f"| {p50 if p50 is None else f'{p50:.1f}'} | {p99 if p99 is None else f'{p99:.1f}'} |"
            + (f" {r['codes']}" if r["codes"] else "")
        )
    return lines


def set_tiers(home: Path, url: str, admission: dict, reason: str) -> None:
    import httpx

    from keel.policies import PolicyStore
    from keel.policies.gateway import DEFAULT_TIERS

    tiers = {
        n: {"p99_ms": t.p99_ms, "availability": t.availability, "timeout_ms": 10_000.0}
        for n, t in DEFAULT_TIERS.items()
    }
    store = PolicyStore(home / "policies.sqlite")
    applied = store.apply(
        {"tiers": ("sla_tier", {"tiers": tiers, **admission})}, author="bench", reason=reason
    ).version
    store.close()
    deadline = time.monotonic() + 60
    while {m["policy_version"] for m in httpx.get(f"{url}/readyz", timeout=5).json()["models"].values()} != {applied}:
        assert time.monotonic() < deadline, "the gateway did not follow the policy store"
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="each overload phase's duration")
    parser.add_argument("--l1-rps", type=float, default=40.0, help="hotels' quotes per second (L1)")
    parser.add_argument("--l2-rps", type=float, default=1500.0, help="flights requests offered per second (L2)")
    parser.add_argument("--unloaded", type=int, default=1000, help="closed-loop L1 requests with the runtime idle")
    parser.add_argument("--edge", action="store_true", help="through the edge: Envoy in front, tenants with keys")
    args = parser.parse_args()
    bench_serving = load_bench_serving()
    home = Path(tempfile.mkdtemp(prefix="keel-bench-tiers-"))
    print(f"bench/tiers: setting up in {home} (training both models on their real data) …", flush=True)
    flights = from_module("usecases.flights")
    hotels = from_module("usecases.hotels")
    texts, feb = bench_serving.setup(home)
    hotel_text, quotes = setup_hotels(home, hotels)
    (home / "policy.yaml").write_text(json.dumps(BASE_POLICY))
    env = os.environ | {"KEEL_HOME": str(home), "KEEL_USECASES": "flights,usecases.hotels",
                        "KEEL_EDGE": "1" if args.edge else "0"}  # fmt: skip
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    keys: dict[str, str] = {}
    if args.edge:  # L1's client is tenant quotes, the flood tenant ops, each with its key
        from keel.policies import PolicyStore
        from keel.tenants import issue_keys

        with PolicyStore(home / "policies.sqlite") as store:
            issued = issue_keys(store, ["quotes", "ops"], "2016-10-01T00:00:00+00:00", "bench", "bench/tiers --edge")
        keys = {"L1": issued["quotes"], "L2": issued["ops"]}
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(port), "--policy", str(home / "policy.yaml")],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        endpoints_file = home / "serving" / "endpoints.json"
        while not endpoints_file.exists():
            assert serve.poll() is None, "gpu_runtime.serve exited"
            time.sleep(0.1)
        ep = json.loads(endpoints_file.read_text())
        control = TritonControl(ep["triton_grpc"], ep["admin_key"])
        resource = TritonResource(serving_dir=str(home / "serving"), drain_s=0.3)
        for uc, text in ((flights, texts[0]), (hotels, hotel_text)):
            sha = hashlib.sha256(text.encode()).hexdigest()
            target = Target(Route("champion", 1, sha, 1.0, f"rel-bench-{uc.name}"), text)
            resource.deployer(uc.model.name, len(uc.features.names), control=control).deploy(uc.model.name, [target])
        url = f"http://127.0.0.1:{port}"
        import httpx

        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the runtime did not become ready"
            time.sleep(0.2)
        l1_route, l2_route = f"/v1/models/{hotels.model.name}/predict", f"/v1/models/{flights.model.name}/predict"
        l1_bodies = [json.dumps({"entities": [q], "tenant_id": "quotes"}).encode() for q in quotes]
        rows = feb.to_dicts()
        l2_bodies = [
            json.dumps({"entities": [bench_serving.flight_of(r)], "tenant_id": "ops"}).encode() for r in rows[:5000]
        ]
        print(
            f"bench/tiers: {len(l1_bodies)} October quotes (L1), {len(l2_bodies)} February flights (L2)", flush=True
        )
        closed_loop(url, l1_route, l1_bodies, 100, keys.get("L1"))  # warm-up
        unloaded = closed_loop(url, l1_route, l1_bodies, args.unloaded, keys.get("L1"))
        results = {}
        for phase, admission in (("tier admission", ADMISSION), ("no tier admission", NO_ADMISSION)):
            set_tiers(home, url, admission, phase)
            print(
                f"bench/tiers: {phase}: L1 {args.l1_rps:g}/s + L2 {args.l2_rps:g}/s for {args.seconds:g} s",
                flush=True,
            )
            streams = [("L1", l1_route, l1_bodies, args.l1_rps), ("L2", l2_route, l2_bodies, args.l2_rps)]
            results[phase] = drive_in_own_process(home, url, streams, args.seconds, keys)
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
    base_p50, base_p99 = pct(unloaded, 0.5), pct(unloaded, 0.99)
    print()
    print(
        "through the edge (Envoy + keel's edge filter in front of the workers)" if args.edge else "the gateway alone"
    )
    print(f"L1 unloaded (closed loop, {len(unloaded)} requests): p50 {base_p50:.2f} ms, p99 {base_p99:.2f} ms")
    print(f"admission policy of the bench: {json.dumps(ADMISSION)}")
    print()
    print("| phase | tier | sent | answered | shed | other errors | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for phase, result in results.items():
        for line in summary(phase, {k: v for k, v in result.items() if k != "limiter"}):
            print(line)
    print()
    for phase, result in results.items():
        print(f"{phase}: the limiter during the load (medians of 1 s scrapes): {result['limiter']}")
    print()
    for phase, result in results.items():
        l1 = result["L1"]
        p99 = pct(l1["lat"], 0.99)
        ratio = p99 / base_p99 if p99 is not None else float("nan")
        shed = l1["shed"] / max(l1["sent"], 1)
        ok = ratio <= GOAL_RATIO and shed == 0 and l1["other"] == 0
        print(
            f"{phase}: L1 p99 {p99 if p99 is None else f'{p99:.1f}'} ms = {ratio:.2f}× unloaded, L1 shed {shed:.1%}, "
            f"L1 other errors {l1['other']}; L2 answered {result['L2']['ok'] / max(result['L2']['sent'], 1):.1%} — "
            f"goal (≤ {GOAL_RATIO:g}×, 0 shed): {'met' if ok else 'NOT met'}"
        )
    print(
        f"(median L1 answered latency under admission: {statistics.median(results['tier admission']['L1']['lat']):.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
