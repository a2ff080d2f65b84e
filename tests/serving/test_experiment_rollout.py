"""End to end: an A/B test on replayed real flights whose treatment is harmful is rolled back by the guardrail
sensor without anyone acting; the data lake (exposures → wide table → analysis with its checks) tells the story.

Real Triton and gateway, `keel experiment start` from a shell, gpu_runtime.replay sending held-out February 2013
flights from its own process, the guardrail sensor evaluated as the daemon evaluates it, and its run requests, then
the analysis asset, executed as Dagster runs. The treatment's harm is planted in the simulated business outcome
(offer acceptance −40 %; the simulator is seeded and documented), the flights' delays are real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import duckdb
import polars as pl
import pytest

import definitions
from assets.experiments import build_experiment_assets
from keel.experiments import control
from keel.exposure_log import read_exposures
from keel.ledger import Ledger
from keel.policies import PolicyStore
from keel.registry import versions_lookup
from resources import keel_resources
from tests import REPO
from tests.serving.conftest import MODEL, PATIENT, Runtime, start_serve, stop_serve
from usecases.flights import usecase as FLIGHTS

pytestmark = pytest.mark.slow
LAKE = build_experiment_assets(FLIGHTS)[:3]  # the flights use case's exposures → wide table → analysis
EXPERIMENT_EXPOSURES, EXPERIMENT_WIDE, EXPERIMENT_ANALYSIS = (a.key for a in LAKE)

SPEC = """\
id: rebooking-offer
model: flight-delay
control: {version: 1}
treatment: {version: 2}
traffic_ratio: 0.5
metrics:
  - {name: accepted, kind: proportion, column: offer_accepted, direction: increase, covariate: pre_accepted}
  - {name: revenue_per_offer, kind: ratio, numerator: revenue, denominator: offers, direction: increase}
  - {name: late_logloss, kind: mean, column: log_loss, direction: decrease}
guardrails:
  - {metric: accepted, threshold: 0.05, action: rollback}
min_sample: 300
dimensions: [carrier, origin, hour_band]
simulation: {seed: 11, base_rate: 0.2, lift: -0.4}
"""


def test_a_harmful_treatment_is_rolled_back_by_the_guardrail_sensor(runtime_home, serving_models, validated,
                                                                     monkeypatch, tmp_path):  # fmt: skip
    home = runtime_home
    (home / "storage" / "flights" / "validated_flights").mkdir(parents=True, exist_ok=True)
    feb = validated["flights"].filter(pl.col("time_hour").dt.month() == 2)
    feb.write_parquet(
        home / "storage" / "flights" / "validated_flights" / "2013-02.parquet"
    )  # the outcomes, as the pipeline has
    monkeypatch.setenv("KEEL_HOME", str(home))
    resources = keel_resources(home)
    proc, endpoints = start_serve(home, PATIENT)
    rt = Runtime(home, proc, endpoints, serving_models[0])
    replay = None
    try:
        rt.deployer().deploy(MODEL, [rt.target(1, "champion", 1.0), rt.target(2, "experiment-v2", 0.0)])
        rt.wait_ready()
        spec = tmp_path / "rebooking-offer.yaml"
        spec.write_text(SPEC)
        env = os.environ | {"KEEL_HOME": str(home)}
        start = subprocess.run([sys.executable, "-m", "keel.cli", "experiment", "start", "--spec", str(spec)],
                               capture_output=True, text=True, cwd=REPO, env=env)  # fmt: skip
        assert start.returncode == 0, start.stderr
        out = tmp_path / "replay.jsonl"
        replay = subprocess.Popen(
            [sys.executable, "-m", "gpu_runtime.replay", "--usecase", "flights", "--url", rt.url, "--rps", "100", "--seconds", "300",
             "--month", "2013-02", "--out", str(out)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert replay.stdout.readline().startswith("replay:")

        # The guardrail sensor, ticking as the daemon would; nobody else acts.
        sensor = definitions.defs.get_sensor_def("flights_guardrail_sensor")
        instance = dg.DagsterInstance.ephemeral()
        cursor, request, deadline = None, None, time.monotonic() + 180
        while request is None:
            assert time.monotonic() < deadline, "the guardrail sensor never acted"
            time.sleep(2)
            ctx = dg.build_sensor_context(
                instance=instance, definitions=definitions.defs, resources=resources, cursor=cursor
            )
            data = sensor.evaluate_tick(ctx)
            cursor = data.cursor
            request = data.run_requests[0] if data.run_requests else None
        acted_at = time.time()
        assert request.tags["keel/guardrail_action"] == "rollback"
        store = PolicyStore(home / "policies.sqlite", versions_of=versions_lookup(home / "registry"))
        status = control.describe(store, home, "rebooking-offer")
        assert status["status"] == "rolled_back" and status["weights"] == {"control": 1.0, "treatment": 0.0}
        evidence = json.loads(store.commit(int(request.tags["keel/policy_version"])).reason)
        print(f"guardrail: {evidence['guardrails'][0]['reason']}; arms {evidence['arms']}")
        time.sleep(3)  # traffic after the rollback
        result = dg.materialize(
            LAKE, selection=[EXPERIMENT_EXPOSURES, EXPERIMENT_WIDE], instance=instance,
            resources=resources, partition_key=request.partition_key, tags=request.tags,
        )  # fmt: skip
        assert result.success
    finally:
        if replay is not None and replay.poll() is None:
            replay.send_signal(signal.SIGTERM)
        stdout = replay.communicate(timeout=60)[0] if replay is not None else ""
        stop_serve(proc)

    summary = json.loads(stdout.strip().splitlines()[-1])
    print(f"replay: {summary}")
    assert summary["failed"] == 0 and summary["sent"] > 1000
    # After the rollback commit was picked up (≤ 1 s), no unit was routed to the treatment any more.
    late = [
        e
        for e in read_exposures(home / "serving" / "exposures")
        if e.get("tenant_id") == "replay" and e["ts"] > acted_at + 1.0
    ]
    assert late and all(e["routed_version"] == 1 for e in late)

    # The analysis asset and its checks: the guardrail check fails (the breach), the split is fine.
    analysis = dg.materialize(LAKE, selection=[EXPERIMENT_ANALYSIS], instance=instance,
                              resources=resources, raise_on_error=False)  # fmt: skip
    checks = {e.check_name: e.passed for e in analysis.get_asset_check_evaluations()}
    assert checks == {"guardrails": False, "sample_ratio": True}
    report = json.loads((home / "storage" / "flights" / "experiment_analysis" / "rebooking-offer.json").read_text())
    assert report["status"] == "rolled_back" and report["guardrail_breached"]
    accepted = next(m for m in report["metrics"] if m["name"] == "accepted")
    assert accepted["lift_ci"][0] < -0.2 and accepted["verdict"] == "worse"  # the planted −40 %, found
    late_logloss = next(m for m in report["metrics"] if m["name"] == "late_logloss")
    assert late_logloss["n_control"] > 100  # real outcomes joined for the real flights

    # The lake is plain Parquet: DuckDB answers questions on it, e.g. acceptance by score bucket.
    wide = home / "storage" / "flights" / "experiment_wide_table" / f"{request.partition_key}.parquet"
    rows = duckdb.sql(
        f"SELECT floor(score * 10) / 10 AS bucket, variant, avg(offer_accepted) AS accept_rate, count(*) AS n "
        f"FROM read_parquet('{wide}') WHERE experiment_id = 'rebooking-offer' GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert sum(r[3] for r in rows) == pl.read_parquet(wide).height > 300
    assert all(pl.read_parquet(wide)["rolled_back"])  # marked, kept
    assert (
        Ledger(home / "ledger.sqlite").log()[-1].manifest["policy"]["parts"]["experiment"]["status"] == "rolled_back"
    )

    # Lineage in the UI: exposures → wide table → analysis (+ its checks).
    graph = definitions.defs.resolve_asset_graph()
    assert EXPERIMENT_EXPOSURES in graph.get(EXPERIMENT_WIDE).parent_keys
    assert EXPERIMENT_WIDE in graph.get(EXPERIMENT_ANALYSIS).parent_keys
