"""Serving speed: the gateway → Triton vs tritonclient → Triton directly vs in-process ``lightgbm.predict``.

Same model (LightGBM trained here on real January 2013 features), same feature rows (real February flights), one
run: the real model runtime (``python -m gpu_runtime.serve``: the Triton build from nvidia-pytriton + the gateway) in a
throwaway KEEL_HOME, on 127.0.0.1. Closed loop, one request at a time, the ways interleaved in rounds; p50/p99.

- in-process: ``Booster.predict`` on the float32 matrix (num_threads=1) — the floor; and with ``pred_contrib``
  (TreeSHAP), the floor of an explained answer;
- Triton direct: tritonclient gRPC ``infer`` on Triton model ``flight-delay-v1``, served by keel's native backend
  (gpu_runtime/backend/, LightGBM's C API);
- Triton direct (Python backend): the same model loaded a second time as ``flight-delay-v2`` on Triton's Python
  backend (gpu_runtime/triton_model.py, the explicit option; its interpreter is .venv-pybackend, which
  scripts/python-backend-env makes on first use) — what the native backend replaced (as version 9: the cold-start
  deploys below use 1–3);
- gateway (features): ``POST /v1/predict`` with the feature values in the body (an object for batch 1, the
  columnar form for batch 256) — gateway overhead = this minus Triton direct (HTTP, parsing, range checks,
  routing, breaker, memory pool, the exposure log, metrics);
- gateway (flights): ``POST /v1/predict`` with the flights — plus contract validation and the online store;
- edge → gateway (features): the same requests through the edge (issue 48) — the real Envoy with keel's edge filter
  (the API key checked, the tenant and tier set) in front of the same gateway, on a key of a bench tenant — Envoy's
  overhead = this minus gateway (features) (the goal: at most +0.3 ms at p50, batch 1);
- gateway (features, explain): the same features with ``"explain": true`` — TreeSHAP computed inside the Triton
  model and every contribution in the answer; explanation overhead = this minus gateway (features), batch 1 (the
  target: at most 1 ms at p50).

Then: cold start (deploy a new version: load call → first response) five times, and end-to-end latency of the
replay load generator at 200 requests/s for ``--seconds`` from its own process.

Last, where the batch-1 overhead goes (bench/serving_overhead.py): the gateway's own code (a ``Gateway`` in this
process, ``predict`` timed minus its Triton call, same body), the HTTP hop (uvicorn with the same settings serving a
constant answer to the same client), and the remainder — the scheduling cost of one more process in the chain on the
machine's cores.

    .venv/bin/python bench/serving.py [--requests 2000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serving_overhead.py beside it

import lightgbm as lgb  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from serving_overhead import MODEL, gateway_code, http_floor, profile_gateway  # noqa: E402

from gpu_runtime.repository import model_config, triton_name  # noqa: E402
from gpu_runtime.triton import TritonControl, free_port  # noqa: E402
from keel.deploy.routing import Route, Target  # noqa: E402
from keel.features.sqlite_store import SQLiteOnlineStore  # noqa: E402
from keel.registry import ModelRegistry  # noqa: E402
from keel.training.model import TrainingConfig, train_model  # noqa: E402
from resources.triton import TritonResource  # noqa: E402
from usecases.flights import usecase as FLIGHTS  # noqa: E402
from usecases.flights.data import read_raw, read_raw_month  # noqa: E402
from usecases.flights.features import (  # noqa: E402
    FEATURE_NAMES,
    FEATURES,
    FLIGHT_FEATURES,  # noqa: E402
    build_views,  # noqa: E402
    offline_features,  # noqa: E402
)

REPO = Path(__file__).resolve().parent.parent
AS_OF = date(2013, 2, 15)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def setup(home: Path) -> tuple[list[str], pl.DataFrame]:
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    v = {}
    for t in ("flights", "weather"):
        c = FLIGHTS.compiled_contract(t)
        v[t] = pl.concat([c.validate(read_raw_month(t, m), references=refs).valid for m in ("2013-01", "2013-02")])
    planes = read_raw("planes")
    store = SQLiteOnlineStore(home / "online" / "flights.sqlite", features=FLIGHT_FEATURES)
    store.write_snapshot(build_views(v["weather"], planes, v["flights"], as_of=AS_OF), as_of=AS_OF, partition="b")
    store.close()
    feats = offline_features(v["flights"], v["weather"], planes, v["flights"])
    config = TrainingConfig(train_months=("2013-01",), valid_month="2013-02")
    texts = [train_model(feats, config, FLIGHT_FEATURES).text]
    for seed in (7, 11):
        texts.append(
            train_model(
                feats,
                TrainingConfig(config.train_months, config.valid_month, params={**config.params, "seed": seed}),
                FLIGHT_FEATURES,
            ).text
        )
    registry = ModelRegistry(home / "registry")
    for t in texts:
        registry.register(MODEL, t, {})
    registry.close()
    return texts, feats.filter(pl.col("sched_date") >= AS_OF).sort("flight_id")


def flight_of(row: dict) -> dict:
    d = row["sched_date"]
    return {
        "carrier": row["carrier"],
        "flight": int(row["flight_id"].split("-")[4]),
        "origin": row["origin"],
        "dest": row["dest"],
        "tailnum": row["tailnum"],
        "year": d.year,
        "month": d.month,
        "day": d.day,
        "hour": row["hour"],
        "distance": float(row["distance"]),
        "time_hour": row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def start_edge(home: Path, port: int):
    """The edge (Envoy with keel's edge filter) in front of the gateway on ``port``, with one bench tenant: the edge
    and the key to send. The gateway is not told of the edge (no token): what is measured is Envoy's hop and the
    filter's work on each request."""
    from gpu_runtime.edge import EnvoyEdge, edge_filter_module
    from keel.edge.envoy import EdgeSpec
    from keel.edge.filters import edge_filter_config
    from keel.tenants import RISK_LEVELS, TIERS, Tenant, new_key

    key, stored = new_key("2013-02-15T00:00:00+00:00")
    models = {MODEL: "L2"}
    spec = EdgeSpec(port=free_port(), workers=(port,), models=models, wasm=edge_filter_module(),
                    filter_config=edge_filter_config("bench-token", [Tenant("bench", (stored,), TIERS, RISK_LEVELS)],
                                                     models))  # fmt: skip
    return EnvoyEdge(home / "edge", spec, token="bench-token").start(), key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="batch-1 requests per way (batch 256: a tenth)")
    parser.add_argument("--seconds", type=float, default=30.0, help="replay duration at 200 requests/s")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the measurements: cProfile the gateway's own code on 100 requests of 256 "
                        "flights (and 100 explained feature batches of 256), print the top 30 functions (cumulative, then "
                        "the top 25 by own time)")  # fmt: skip
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="keel-bench-serving-"))
    texts, feb = setup(home)
    x_all = np.where(
        np.isnan(feb.select(FEATURE_NAMES).to_numpy().astype(np.float64)),
        [f.default for f in FEATURES],
        feb.select(FEATURE_NAMES).to_numpy(),
    ).astype(np.float32)
    rows = feb.to_dicts()
    env = os.environ | {"KEEL_HOME": str(home), "KEEL_USECASES": "flights"}  # flights' model alone
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    # the Python backend's interpreter (numpy < 2), for the comparison only: keel serves without it
    made = subprocess.run([str(REPO / "scripts" / "python-backend-env")], capture_output=True, text=True, check=True)
    env["KEEL_RUNTIME_PYTHON"] = made.stdout.strip().splitlines()[-1]
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        endpoints_file = home / "serving" / "endpoints.json"
        while not endpoints_file.exists():
            assert serve.poll() is None, "gpu_runtime.serve exited"
            time.sleep(0.1)
        ep = json.loads(endpoints_file.read_text())
        control = TritonControl(ep["triton_grpc"], ep["admin_key"])
        resource = TritonResource(serving_dir=str(home / "serving"), drain_s=0.3)
        shas = [hashlib.sha256(t.encode()).hexdigest() for t in texts]  # registry versions 1, 2, 3

        def target(v: int) -> Target:
            return Target(Route("champion", v, shas[v - 1], 1.0, f"rel-bench-{v}"), texts[v - 1])

        deployer = resource.deployer(MODEL, len(FEATURE_NAMES), control=control)
        deployer.deploy(MODEL, [target(1)])
        # the same model on Triton's Python backend, beside it (Triton model version 9: 1–3 are the deploys')
        python_name = triton_name(MODEL, 9)
        python_serving = replace(deployer.serving, backend="python")
        deployer.repository.publish(MODEL, 9, texts[0], {"sha256": shas[0], "version": 9})
        control.load(python_name, model_config(MODEL, 9, python_serving))
        booster = lgb.Booster(model_str=texts[0])
        conn = http.client.HTTPConnection("127.0.0.1", port)
        edge, key = start_edge(home, port)
        edge_conn = http.client.HTTPConnection("127.0.0.1", edge.spec.port)

        def via_edge(body: bytes) -> dict:
            edge_conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json", "x-api-key": key})
            resp = edge_conn.getresponse()
            out = json.loads(resp.read())
            assert resp.status == 200, out
            return out

        def gateway(body: bytes) -> dict:
            conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            out = json.loads(resp.read())
            assert resp.status == 200, out
            return out

        def features_body(x: np.ndarray, explain: bool = False) -> bytes:
            if len(x) == 1:  # one flight: an object of feature values
                features = dict(zip(FEATURE_NAMES, map(float, x[0]), strict=True))
            else:  # a batch: the columnar form
                features = {"columns": list(FEATURE_NAMES), "rows": x.astype(np.float64).tolist()}
            return json.dumps(
                {"features": features, "unit_id": "bench", **({"explain": True} if explain else {})}
            ).encode()

        def flights_body(r: list[dict]) -> bytes:
            return json.dumps({"flights": [flight_of(row) for row in r], "unit_id": "bench"}).encode()

        if args.profile:
            starts = [(i * 256) % (len(rows) - 256) for i in range(100)]
            return profile_gateway(home, ep["triton_grpc"], [flights_body(rows[s : s + 256]) for s in starts],
                                   [features_body(x_all[s : s + 256], explain=True) for s in starts])  # fmt: skip
        tname = triton_name(MODEL, 1)
        results: dict[tuple[str, int], list[float]] = {}
        for batch, n in ((1, args.requests), (256, max(50, args.requests // 10))):
            # Inputs are prepared before the clock starts: what is timed is the call, not building its body.
            starts = [(i * batch) % (len(rows) - batch) for i in range(n)]
            xs = [x_all[s : s + batch] for s in starts]
            f_bodies = [features_body(x) for x in xs]
            e_bodies = [features_body(x, explain=True) for x in xs]
            fl_bodies = [flights_body(rows[s : s + batch]) for s in starts]
            ways = {
                "in-process lightgbm": lambda i, xs=xs: booster.predict(xs[i].astype(np.float64), num_threads=1),
                "in-process lightgbm (TreeSHAP)": lambda i, xs=xs: booster.predict(
                    xs[i].astype(np.float64), num_threads=1, pred_contrib=True
                ),
                "Triton direct (tritonclient)": lambda i, xs=xs: control.infer(tname, 1, xs[i]),
                "Triton direct (Python backend)": lambda i, xs=xs: control.infer(python_name, 9, xs[i]),
                "gateway → Triton (features)": lambda i, b=f_bodies: gateway(b[i]),
                "edge → gateway → Triton (features)": lambda i, b=f_bodies: via_edge(b[i]),
                "gateway → Triton (flights)": lambda i, b=fl_bodies: gateway(b[i]),
                "gateway → Triton (features, explain)": lambda i, b=e_bodies: gateway(b[i]),
            }
            for name in ways:
                results[(name, batch)] = []
            # agreement first: Triton and the gateway give the in-process scores
            ref = booster.predict(xs[0].astype(np.float64))
            np.testing.assert_allclose(control.infer(tname, 1, xs[0]), ref, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(control.infer(python_name, 9, xs[0]), ref, rtol=1e-5, atol=1e-6)
            got = gateway(f_bodies[0])
            scores = [p["score"] for p in got["predictions"]] if batch > 1 else [got["score"]]
            np.testing.assert_allclose(scores, ref, rtol=1e-5, atol=1e-6)
            through = via_edge(f_bodies[0])
            np.testing.assert_allclose([p["score"] for p in through["predictions"]] if batch > 1 else [through["score"]],
                                       ref, rtol=1e-5, atol=1e-6)  # fmt: skip
            explained = gateway(e_bodies[0])  # the explanation adds up to the model's raw score
            e = explained["predictions"][0]["explanation"] if batch > 1 else explained["explanation"]
            total = e["base_value"] + sum(c["contribution"] for c in e["contributions"]) + e["rest"]
            assert abs(total - booster.predict(xs[0][:1].astype(np.float64), raw_score=True)[0]) <= 1e-6, e
            for i in range(n):
                for name, fn in ways.items():
                    t0 = time.perf_counter()
                    fn(i)
                    results[(name, batch)].append((time.perf_counter() - t0) * 1000)
            print(f"batch {batch}: {n} requests per way done", flush=True)

        cold = []
        for v in (2, 3, 1, 2, 3):
            report = deployer.deploy(MODEL, [target(v)])
            cold += list(report.cold_start_s.values())

        replay = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_runtime.replay",
                "--usecase",
                "flights",
                "--url",
                f"http://127.0.0.1:{port}",
                "--rps",
                "200",
                "--seconds",
                str(args.seconds),
                "--month",
                "2013-02",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        summary = json.loads(replay.stdout.strip().splitlines()[-1])
        one = [features_body(x_all[(i % (len(rows) - 1)) : (i % (len(rows) - 1)) + 1]) for i in range(args.requests)]
        code_ms = gateway_code(home, ep["triton_grpc"], one)
        floor_ms = http_floor(one)
    finally:
        if "edge" in locals():
            edge.stop()
        os.killpg(serve.pid, 15)
        serve.wait(timeout=60)

    print(f"\n{'way':<38} {'batch':>5} {'p50 ms':>8} {'p99 ms':>8}")
    for (name, batch), lat in results.items():
        print(f"{name:<38} {batch:>5} {statistics.median(lat):>8.3f} {pct(lat, 0.99):>8.3f}")
    for batch in (1, 256):
        n, py = results[("Triton direct (tritonclient)", batch)], results[("Triton direct (Python backend)", batch)]
        print(
            f"native backend / Python backend, batch {batch}: p50 {statistics.median(n) / statistics.median(py):.2f}×, "
            f"p99 {pct(n, 0.99) / pct(py, 0.99):.2f}× (goals at batch 1: p50 ≤ 0.5×, p99 ≤ 0.33×)"
        )
    for batch in (1, 256):
        g, d = results[("gateway → Triton (features)", batch)], results[("Triton direct (tritonclient)", batch)]
        print(
            f"gateway overhead over direct Triton, batch {batch}: p50 {statistics.median(g) - statistics.median(d):+.3f} ms, "
            f"p99 {pct(g, 0.99) - pct(d, 0.99):+.3f} ms"
        )
    for batch in (1, 256):
        e, g = results[("edge → gateway → Triton (features)", batch)], results[("gateway → Triton (features)", batch)]
        print(
            f"edge (Envoy + filter) overhead over the gateway alone, batch {batch}: p50 "
            f"{statistics.median(e) - statistics.median(g):+.3f} ms, p99 {pct(e, 0.99) - pct(g, 0.99):+.3f} ms"
            + (" (goal: ≤ +0.3 ms at p50)" if batch == 1 else "")
        )
    for batch in (1, 256):
        e, g = (
            results[("gateway → Triton (features, explain)", batch)],
            results[("gateway → Triton (features)", batch)],
        )
        print(
            f"explanation overhead (explain: true vs plain), batch {batch}: p50 "
            f"{statistics.median(e) - statistics.median(g):+.3f} ms, p99 {pct(e, 0.99) - pct(g, 0.99):+.3f} ms"
            + (" (target: ≤ 1 ms at p50)" if batch == 1 else "")
        )
    p50 = {key: statistics.median(lat) for key, lat in results.items()}
    tree_shap = p50[("in-process lightgbm (TreeSHAP)", 256)] / p50[("in-process lightgbm", 256)]
    print(
        f"explain / plain at batch 256, gateway: {p50[('gateway → Triton (features, explain)', 256)] / p50[('gateway → Triton (features)', 256)]:.1f}× "
        f"(goal ≤ 2×); in process, TreeSHAP / predict: {tree_shap:.1f}× — the floor of any explained answer"
    )
    flights_1 = results[("gateway → Triton (flights)", 1)]
    print(
        f"goals, gateway with flights: batch 1 p50 {statistics.median(flights_1):.3f} ms (≤ 1.5), p99 "
        f"{pct(flights_1, 0.99):.3f} ms (≤ 3); batch 256 p50 {p50[('gateway → Triton (flights)', 256)]:.3f} ms (≤ 6)"
    )
    print(
        f"cold start (load → first response), 5 deploys: median {statistics.median(cold) * 1000:.0f} ms, "
        f"max {max(cold) * 1000:.0f} ms"
    )
    print(f"replay 200 req/s for {args.seconds:g} s, end to end: {summary}")
    g, d = results[("gateway → Triton (features)", 1)], results[("Triton direct (tritonclient)", 1)]
    overhead = statistics.median(g) - statistics.median(d)
    code, hop = statistics.median(code_ms), statistics.median(floor_ms)
    print(
        f"batch-1 overhead p50 {overhead:+.3f} ms = gateway code {code:.3f} ms + HTTP hop {hop:.3f} ms "
        f"+ remainder {overhead - code - hop:+.3f} ms (one more process scheduled on {os.cpu_count()} cores)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
