"""Experiments driven through the policy store: start, pause, resume, stop, roll back — and the guardrail sensor
pausing or rolling back a harmful treatment on its own, once, with its evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import polars as pl
import pytest

from keel.experiments import control
from keel.experiments.control import ExperimentStateError
from keel.experiments.guardrails import tick
from keel.exposure_log import ExposureLog
from keel.ledger import Ledger
from keel.policies import PolicyStore
from keel.registry import ModelRegistry, versions_lookup
from resources import keel_resources
from tests import REPO
from tests.conftest import evaluate_sensor
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from usecases.flights.features import FLIGHT, FLIGHT_FEATURES

SPEC = """\
id: rebooking-offer
model: flight-delay
control: {version: 1}
treatment: {version: 2}
traffic_ratio: 0.5
metrics:
  - {name: accepted, kind: proportion, column: offer_accepted, direction: increase, covariate: pre_accepted}
  - {name: late_logloss, kind: mean, column: log_loss, direction: decrease}
guardrails:
  - {metric: accepted, threshold: 0.05, action: ACTION}
min_sample: 300
dimensions: [carrier, origin, hour_band]
simulation: {seed: 3, base_rate: 0.2, lift: LIFT}
"""


@pytest.fixture
def home(tmp_path):
    registry = ModelRegistry(tmp_path / "registry")
    for i in (1, 2):
        registry.register("flight-delay", f"model text {i}", {})
    registry.close()
    return tmp_path


def write_spec(home, action="rollback", lift=-0.5):
    path = home / "spec.yaml"
    path.write_text(SPEC.replace("ACTION", action).replace("LIFT", str(lift)))
    return path


def open_store(home):
    return PolicyStore(home / "policies.sqlite", versions_of=versions_lookup(home / "registry"))


def test_start_pause_resume_stop_and_the_split_in_the_store(home):
    store = open_store(home)
    c = control.start(store, write_spec(home), home=home, author="ana")
    split = store.get("experiment.rebooking-offer").body
    assert {v["name"]: (v["version"], v["weight"]) for v in split["variants"]} == {
        "control": (1, 0.5), "treatment": (2, 0.5)}  # fmt: skip
    assert split["experiment"]["status"] == "running" and c.author == "ana"
    with pytest.raises(ExperimentStateError, match="already running"):
        control.start(store, write_spec(home), home=home, author="ana")
    control.pause(store, home, "rebooking-offer", author="ana", reason="looks odd")
    assert control.describe(store, home, "rebooking-offer")["weights"] == {"control": 1.0, "treatment": 0.0}
    control.resume(store, home, "rebooking-offer", author="ana", reason="fine")
    control.stop(store, home, "rebooking-offer", author="ana", reason="done")
    with pytest.raises(ExperimentStateError, match="is stopped; cannot become rolled_back"):
        control.rollback(store, home, "rebooking-offer", author="ana", reason="late")
    status = control.describe(store, home, "rebooking-offer")
    assert status["status"] == "stopped" and [h["author"] for h in status["history"]] == ["ana"] * 4
    assert store.verify().ok


def treated_units(store, units):
    """The units the gateway sends to version 2 under the store's split in force (its real routing code)."""
    from gpu_runtime.gateway.control import choose_route
    from keel.deploy.routing import Route, RoutingTable
    from keel.policies.gateway import GatewayPolicy, effective_policy

    table = RoutingTable(1, "flight-delay", 3, (Route("champion", 1, "a" * 64, 1.0), Route("v2", 2, "b" * 64, 0.0)))
    _, split, _ = effective_policy(GatewayPolicy(), store.state(), "flight-delay", {1, 2}, store.version())
    return {u for u in units if choose_route(table, split, u, None)[0].version == 2}


def test_consecutive_experiments_assign_units_independently(home):
    """Each experiment hashes units with its own salt: two 50 % experiments one after the other share about a
    quarter of the units in both treatments (independent), not half (the same users every time)."""
    store = open_store(home)
    units = [f"user-{i}" for i in range(20_000)]
    treated = []
    for exp_id in ("offer-a", "offer-b"):
        spec = home / f"{exp_id}.yaml"
        spec.write_text(SPEC.replace("rebooking-offer", exp_id).replace("ACTION", "pause").replace("LIFT", "0"))
        control.start(store, spec, home=home, author="ana")
        treated.append(treated_units(store, units))
        control.stop(store, home, exp_id, author="ana", reason="done")
    assert all(0.48 < len(t) / len(units) < 0.52 for t in treated)
    both = len(treated[0] & treated[1]) / len(units)
    assert 0.23 < both < 0.27, both


def test_consecutive_canaries_assign_units_independently():
    """Each canary rollout has its own salt too; within one rollout a unit never moves back to the champion."""
    from gpu_runtime.gateway.control import choose_route
    from keel.canary_control import canary_salt, split_for
    from keel.canary_plan import CanaryState
    from keel.deploy.routing import Route, RoutingTable
    from keel.policies.gateway import Split

    table = RoutingTable(1, "m", 3, (Route("champion", 1, "a" * 64, 1.0), Route("challenger", 2, "b" * 64, 0.0)))
    units = [f"user-{i}" for i in range(20_000)]

    def challenger_units(name, started_at, percent):
        body = {"model": "m", "champion_version": 1, "challenger_version": 2}
        state = CanaryState(started_at=started_at)
        split = split_for(body, percent, canary_salt(name, body, state))
        s = Split({v["version"]: v["weight"] for v in split["variants"]}, split["salt"])
        return {u for u in units if choose_route(table, s, u, None)[0].version == 2}

    first, second = challenger_units("canary.a", 1000.0, 50), challenger_units("canary.b", 2000.0, 50)
    assert 0.23 < len(first & second) / len(units) < 0.27
    assert challenger_units("canary.a", 1000.0, 10) <= challenger_units("canary.a", 1000.0, 30) <= first


def exposures_of_real_flights(home, validated, start_ts, n=3000, offset=1.0, step=0.001):  # noqa: F811
    """What the gateway logs for an experiment: real January flights, units split 50/50 by the gateway's hash, at
    ``start_ts + offset + i * step``."""
    from gpu_runtime.gateway.control import Weighted, pick_weighted

    log = ExposureLog(home / "serving" / "exposures")
    rows = validated["flights"].filter(pl.col("arr_delay").is_not_null()).head(n).to_dicts()
    for i, row in enumerate(rows):
        key = FLIGHT.key.of({**row, "time_hour": row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ")})
        unit = f"u{i}"
        arm = pick_weighted([Weighted("control", 0.5), Weighted("treatment", 0.5)], unit, salt="rebooking-offer")
        version = 2 if arm == "treatment" else 1
        log.append({"ts": start_ts + offset + i * step, "unit_id": unit, "routed_version": version,
                    "model_version": version, "status": 200, "score": 0.3, "latency_ms": 3.0, "entity_key": key})  # fmt: skip
    log.close()
    storage = home / "storage" / "flights" / "validated_flights"
    storage.mkdir(parents=True, exist_ok=True)
    validated["flights"].filter(pl.col("time_hour").dt.month() == 1).write_parquet(storage / "2013-01.parquet")


def test_the_guardrail_sensor_rolls_back_a_harmful_treatment_once(home, validated):  # noqa: F811
    store = open_store(home)
    commit = control.start(store, write_spec(home, "rollback", -0.5), home=home, author="ana")
    exposures_of_real_flights(home, validated, commit.committed_at.timestamp())
    ledger, registry = Ledger(home / "ledger.sqlite"), ModelRegistry(home / "registry")
    [acted], cursor = tick(store, home, registry=registry, ledger=ledger)
    assert acted["action"] == "rollback" and acted["breached"][0]["metric"] == "accepted"
    reason = json.loads(store.commit(acted["version"]).reason)
    assert reason["guardrails"][0]["msprt_p"] < 0.05 and reason["arms"]["treatment"] > 300
    assert control.describe(store, home, "rebooking-offer")["status"] == "rolled_back"
    assert control.rolled_back_days(home, "rebooking-offer")  # the data is marked, not deleted
    [entry] = ledger.log()
    assert entry.manifest["policy"]["parts"]["experiment"]["status"] == "rolled_back"
    assert tick(store, home, registry=registry, ledger=ledger, cursor=cursor) == ([], cursor)  # never twice
    assert cursor["rebooking-offer"]["accepted"] < 0.05


def test_a_harmless_treatment_runs_on_and_pause_is_an_action(home, validated):  # noqa: F811
    store = open_store(home)
    commit = control.start(store, write_spec(home, "pause", 0.0), home=home, author="ana")
    exposures_of_real_flights(home, validated, commit.committed_at.timestamp())
    acted, cursor = tick(store, home)
    assert acted == [] and cursor["rebooking-offer"]["accepted"] > 0.05
    store.close()
    home2 = home / "second"
    registry = ModelRegistry(home2 / "registry")
    for i in (1, 2):
        registry.register("flight-delay", f"model text {i}", {})
    registry.close()
    store2 = open_store(home2)
    commit = control.start(store2, write_spec(home2, "pause", -0.5), home=home2, author="ana")
    exposures_of_real_flights(home2, validated, commit.committed_at.timestamp())
    [acted], _ = tick(store2, home2)
    assert acted["action"] == "pause" and control.describe(store2, home2, "rebooking-offer")["status"] == "paused"


def test_the_daemon_path_and_the_cli(home, validated, monkeypatch):  # noqa: F811
    env = os.environ | {"KEEL_HOME": str(home)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "keel.cli", "experiment", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=REPO, env=env)  # fmt: skip
    r = run("start", "--spec", str(write_spec(home, "rollback", -0.5)), "--author", "ana")
    assert r.returncode == 0, r.stderr
    store = open_store(home)
    exposures_of_real_flights(
        home, validated, store.get("experiment.rebooking-offer").body["experiment"]["started_at"]
    )
    data = evaluate_sensor("flights_guardrail_sensor", home, monkeypatch)
    [request] = data.run_requests
    assert request.tags["keel/guardrail_action"] == "rollback" and request.partition_key
    assert set(request.asset_selection) == {
        dg.AssetKey(["flights", "experiment_exposures"]),
        dg.AssetKey(["flights", "experiment_wide_table"]),
    }
    r = run("status", "rebooking-offer")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "rolled_back"
    r = run("rollback", "rebooking-offer", "--reason", "again")
    assert r.returncode == 2 and "rolled_back; cannot become rolled_back" in r.stderr
    r = run("status", "no-such")
    assert r.returncode == 2 and "not in the policy store" in r.stderr


def test_the_analysis_shows_the_guardrail_decision_that_rolled_the_experiment_back(home, validated, monkeypatch):  # noqa: F811
    """The decision that acted and the analysis tell one story: the sensor's rollback (an always-valid p below α at
    the look it acted on) fails the analysis's guardrails check with that evidence, even where a single look at the
    final data — here a harmless treatment — would not breach on its own."""
    from assets.experiments import build_experiment_assets
    from usecases.flights import usecase as FLIGHTS

    experiment_exposures, experiment_wide_table, experiment_analysis = build_experiment_assets(FLIGHTS)[:3]
    EXPERIMENT_ANALYSIS = experiment_analysis.key  # noqa: N806 - the asset's key, as the module constant was
    from keel.experiments.lake import wide_rows
    from keel.exposures import read_exposure_frame, realized_labels

    store = open_store(home)
    commit = control.start(store, write_spec(home, "rollback", 0.0), home=home, author="ana")
    # Every exposure at the start instant: inside the experiment's window whenever the rollback comes.
    exposures_of_real_flights(home, validated, commit.committed_at.timestamp(), offset=0.0, step=0.0)
    evidence = {
        "action": "rollback",
        "guardrails": [{"metric": "accepted", "breached": True, "msprt_p": 0.004,
                        "reason": "accepted: treatment 31.00% worse than control; always-valid p = 0.004"}],
        "arms": {"control": 400, "treatment": 390},
    }  # fmt: skip
    acted, _ = control.rollback(
        store, home, "rebooking-offer", author=control.GUARDRAIL_AUTHOR, reason=json.dumps(evidence)
    )
    meta = control.experiments(store)["rebooking-offer"]
    assert control.guardrail_decision(store, "rebooking-offer")["version"] == acted.version
    frame = read_exposure_frame(home / "serving" / "exposures")
    wide = wide_rows(frame, control.stored_spec(home, "rebooking-offer"), meta,
                     labels=realized_labels(FLIGHT_FEATURES, frame["entity_key"], home / "storage"))  # fmt: skip
    (home / "storage" / "flights" / "experiment_wide_table").mkdir(parents=True)
    wide.write_parquet(home / "storage" / "flights" / "experiment_wide_table" / "2026-01-01.parquet")
    store.close()

    monkeypatch.setenv("KEEL_HOME", str(home))
    result = dg.materialize(
        [experiment_exposures, experiment_wide_table, experiment_analysis],
        selection=[experiment_analysis],
        resources=keel_resources(home),
        raise_on_error=False,
    )
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "guardrails"]
    assert not check.passed
    assert "rollback by the guardrail sensor" in check.metadata["breached"].value
    assert "always-valid p = 0.004" in check.metadata["breached"].value
    report = json.loads((home / "storage" / "flights" / "experiment_analysis" / "rebooking-offer.json").read_text())
    assert report["guardrail_breached"] and report["guardrail_decision"]["version"] == acted.version
    assert report["status"] == "rolled_back"
    # The sequential test carries on from the decision's looks: its p-value cannot rise above what was acted on.
    assert report["guardrails"][0]["msprt_p"] <= 0.004
    assert result.asset_materializations_for_node(EXPERIMENT_ANALYSIS.to_python_identifier())


def test_an_experiment_that_cannot_be_judged_is_reported_and_the_others_proceed(home, validated):  # noqa: F811
    store = open_store(home)
    commit = control.start(store, write_spec(home, "rollback", -0.5), home=home, author="ana")
    exposures_of_real_flights(home, validated, commit.committed_at.timestamp())
    ghost = {"model": "flight-delay", "salt": "ghost",
             "variants": [{"name": "control", "version": 1, "weight": 1.0}, {"name": "treatment", "version": 2, "weight": 0.0}],
             "experiment": {"id": "ghost", "status": "running", "started_at": commit.committed_at.timestamp()}}  # fmt: skip
    store.apply({"experiment.ghost": ("ab_test", ghost)}, author="ops", reason="started elsewhere, no spec here")
    [log_file] = (home / "serving" / "exposures").glob("exposures-*.jsonl")
    with open(log_file, "ab") as fh:
        fh.write(b'{"ts": 1, "status": 2\n')  # a torn line in the middle of the log
    problems: list[str] = []
    [acted], _ = tick(store, home, problems=problems)
    assert acted["experiment"] == "rebooking-offer" and acted["action"] == "rollback"
    assert len(problems) == 2 and problems[0].startswith("exposure log: 1 lines were not whole records")
    assert "experiment 'ghost' skipped" in problems[1] and "never started here" in problems[1]


def test_an_experiments_traffic_is_all_or_header_and_a_bad_value_names_the_field():
    from keel.experiments.spec import ExperimentSpecError, parse_spec

    base = {"id": "e1", "model": "flight-delay", "metrics": [{"name": "m", "column": "c", "direction": "increase"}]}
    assert parse_spec(base).traffic == "all" and parse_spec(base | {"traffic": "header"}).traffic == "header"
    with pytest.raises(ExperimentSpecError, match="traffic: must be one of all, header"):
        parse_spec(base | {"traffic": "cookie"})
