"""The canary sensor's tick against a real policy store, registry and exposure log: start, hold, advance,
promote; a breach rolls back once; every action is one policy commit with its evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import dagster as dg
import polars as pl
import pytest

from keel.canary_control import tick
from keel.exposure_log import ExposureLog
from keel.policies import PolicyStore
from keel.registry import ModelRegistry
from tests.conftest import evaluate_sensor
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from tests.policy.canary_world import CANARY, T0, january_outcomes, split


def traffic(log, start, challenger_ok=100, challenger_failed=0, champion=1000, champion_ms=4.0):
    for i in range(champion):
        log.append(
            {
                "ts": start + i * 0.01,
                "model": "flight-delay",
                "routed_version": 1,
                "model_version": 1,
                "status": 200,
                "latency_ms": champion_ms,
            }
        )
    for i in range(challenger_ok):
        log.append(
            {
                "ts": start + i * 0.01,
                "model": "flight-delay",
                "routed_version": 2,
                "model_version": 2,
                "status": 200,
                "latency_ms": 5.0,
            }
        )
    for i in range(challenger_failed):  # the challenger failed; the fallback answered the user
        log.append(
            {
                "ts": start + i * 0.01,
                "model": "flight-delay",
                "routed_version": 2,
                "model_version": 1,
                "status": 200,
                "latency_ms": 9.0,
            }
        )


def labelled_traffic(log, start, rows, score_of) -> None:
    """One answer per flight, a third of them by the challenger (v2), each with its flight key and score."""
    from usecases.flights.features import FLIGHT

    for i, row in enumerate(rows):
        key = FLIGHT.key.of({**row, "time_hour": row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ")})
        version = 2 if i % 3 == 0 else 1
        log.append({"ts": start + i * 0.01, "model": "flight-delay", "routed_version": version,
                    "model_version": version, "status": 200, "latency_ms": 4.0, "score": score_of(row, version),
                    "entity_key": key})  # fmt: skip


def test_start_hold_advance_promote(world, tmp_path, validated, monkeypatch):  # noqa: F811
    store, registry, log, exposures, shas = world
    storage, flights = january_outcomes(tmp_path, validated)
    [start] = tick(store, registry, exposures, T0, storage_dir=storage)
    assert start["action"] == "start" and split(store) == {"champion": 0.9, "challenger": 0.1}
    assert tick(store, registry, exposures, T0 + 1, storage_dir=storage) == []  # no traffic yet: hold
    traffic(log, T0 + 1)
    assert tick(store, registry, exposures, T0 + 30, storage_dir=storage) == []  # the step not held long enough
    # Held long enough, enough requests, no breach — but no outcome is in: the challenger does not get all the
    # traffic (where nothing is left to compare it with) before its quality is judged.
    assert tick(store, registry, exposures, T0 + 61, storage_dir=storage) == []
    base = float((flights["arr_delay"] > 15).mean())
    labelled_traffic(log, T0 + 62, flights.head(900).to_dicts(), lambda row, version: base)  # as good as the champion
    [advance] = tick(store, registry, exposures, T0 + 72, storage_dir=storage)
    assert advance["action"] == "advance" and split(store) == {"champion": 0.0, "challenger": 1.0}
    commit = store.commit(advance["version"])
    evidence = json.loads(commit.reason)
    assert commit.author == "canary-controller" and evidence["evidence"]["challenger"]["requests"] == 100 + 300
    assert evidence["evidence"]["challenger"]["labelled"] == 300 and evidence["evidence"]["quality_judged"]
    assert "error_rate_pvalue" in evidence["evidence"] and evidence["evidence"]["log_loss_pvalue"] >= 0.05
    assert tick(store, registry, exposures, T0 + 73) == []  # a duplicate tick: the new step has no data yet
    traffic(log, T0 + 73)
    monkeypatch.setenv("KEEL_FAULT_PROMOTION", "off")  # a failing control's switch (keel/faults.py): it holds
    assert tick(store, registry, exposures, T0 + 135) == [] and registry.alias("flight-delay", "champion") == shas[0]
    monkeypatch.delenv("KEEL_FAULT_PROMOTION")
    [promote] = tick(store, registry, exposures, T0 + 135)
    assert promote["action"] == "promote" and registry.alias("flight-delay", "champion") == shas[1]
    assert store.state()["rollout"].body["state"]["status"] == "promoted"
    assert tick(store, registry, exposures, T0 + 500) == []  # finished: nothing more, ever
    assert store.verify().ok


def test_a_breach_rolls_back_once_and_never_promotes(world):
    store, registry, log, exposures, shas = world
    tick(store, registry, exposures, T0)
    traffic(log, T0 + 1, challenger_ok=60, challenger_failed=40)  # 40 % of its requests failed over to the fallback
    [rollback] = tick(store, registry, exposures, T0 + 5)  # a breach does not wait for the interval
    assert rollback["action"] == "rollback" and split(store) == {"champion": 1.0, "challenger": 0.0}
    reason = json.loads(store.commit(rollback["version"]).reason)
    assert reason["evidence"]["challenger"]["errors"] == 40 and reason["evidence"]["error_rate_pvalue"] < 0.05
    version = store.version()
    for later in (T0 + 6, T0 + 100, T0 + 1000):  # duplicate ticks, a restarted daemon: no second rollback
        assert tick(store, registry, exposures, later) == []
    assert store.version() == version and registry.alias("flight-delay", "champion") == shas[0]


def test_the_daemon_path_launches_a_deployment_run(world, tmp_path, monkeypatch):
    """evaluate_tick (what the daemon calls) resolves the sensor's run request against its target."""
    import definitions

    data = evaluate_sensor("flights_canary_sensor", tmp_path, monkeypatch)
    [request] = data.run_requests
    # the use case's defined deploy job (named on the timeline, in-process), not an anonymous asset job
    assert request.job_name == "flights_deploy"
    assert request.tags["keel/canary_action"] == "start" and request.run_key.startswith("canary:rollout:")
    job = definitions.defs.resolve_job_def("flights_deploy")
    assert set(job.asset_layer.executable_asset_keys) == {dg.AssetKey(["flights", "model_deployment"])}
    assert job.executor_def.name == "in_process"


def test_quality_on_realized_labels_rolls_back_a_badly_calibrated_challenger(world, tmp_path, validated):  # noqa: F811
    """Real January flights: the champion scores each with the base rate, the challenger says the opposite of what
    happened. The sensor reads the outcomes from the validated flights in storage and rolls the challenger back."""
    from usecases.flights.features import FLIGHT

    store, registry, log, exposures, shas = world
    flights = validated["flights"].filter(pl.col("time_hour").dt.month() == 1, pl.col("arr_delay").is_not_null())
    storage = tmp_path / "storage"
    (storage / "flights" / "validated_flights").mkdir(parents=True)
    flights.write_parquet(storage / "flights" / "validated_flights" / "2013-01.parquet")
    rows = flights.head(600).to_dicts()
    base = float((flights["arr_delay"] > 15).mean())
    tick(store, registry, exposures, T0, storage_dir=storage)
    for i, row in enumerate(rows):
        late = row["arr_delay"] > 15
        key = FLIGHT.key.of({**row, "time_hour": row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ")})
        version = 2 if i % 3 == 0 else 1
        score = (0.1 if late else 0.9) if version == 2 else base
        log.append(
            {
                "ts": T0 + 1 + i * 0.01,
                "model": "flight-delay",
                "routed_version": version,
                "model_version": version,
                "status": 200,
                "latency_ms": 4.0,
                "score": score,
                "entity_key": key,
            }
        )
    assert tick(store, registry, exposures, T0 + 30) == []  # no storage given: no labels, nothing to judge yet
    [rollback] = tick(store, registry, exposures, T0 + 31, storage_dir=storage)
    evidence = json.loads(store.commit(rollback["version"]).reason)
    assert rollback["action"] == "rollback" and "realized labels" in evidence["reasons"][0]
    assert evidence["evidence"]["challenger"]["labelled"] == 200 and evidence["evidence"]["log_loss_pvalue"] < 0.05


def test_the_sla_tier_in_the_store_sets_the_latency_target(world):
    store, registry, log, exposures, shas = world
    store.apply(
        {
            "tiers": (
                "sla_tier",
                {
                    "tiers": {"tight": {"p99_ms": 3.0, "availability": 0.999, "timeout_ms": 50.0}},
                    "models": {"flight-delay": "tight"},
                },
            )
        },
        author="ops",
        reason="flight-delay is latency critical",
    )
    tick(store, registry, exposures, T0)
    traffic(log, T0 + 1, champion_ms=2.0)  # the challenger answers in 5 ms, the champion within the tight 3 ms
    [rollback] = tick(store, registry, exposures, T0 + 2)
    assert rollback["action"] == "rollback"
    assert "SLA target 3.0 ms" in json.loads(store.commit(rollback["version"]).reason)["reasons"][0]


def test_the_deployment_follows_an_unfinished_canary(world):
    """model_deployment keeps a rollout's challenger deployed at its step's share, and drops it once finished."""
    from keel.deploy.plan import running_canary

    store, registry, log, exposures, shas = world
    before = running_canary(store.state(), "flight-delay")
    assert before.status == "not started" and before.challenger_version == 2 and before.challenger_share == 0.0
    tick(store, registry, exposures, T0)
    started = running_canary(store.state(), "flight-delay")
    assert started.status == "running" and started.challenger_share == pytest.approx(0.1)
    traffic(log, T0 + 1, challenger_ok=60, challenger_failed=40)
    tick(store, registry, exposures, T0 + 5)  # rolled back
    assert running_canary(store.state(), "flight-delay") is None
    assert running_canary(store.state(), "another-model") is None


def test_a_malformed_canary_is_reported_and_the_others_proceed(world, tmp_path, monkeypatch):
    store, registry, log, exposures, shas = world
    state = {"status": "running", "step": 0, "started_at": T0, "step_started_at": T0, "owner": "keel 2.0"}
    store.apply({"broken": ("canary", CANARY | {"state": state})}, author="ops",
                reason="a state written by a newer keel, with a field this one does not know")  # fmt: skip
    problems: list[str] = []
    [start] = tick(store, registry, exposures, T0, problems=problems)
    assert start["name"] == "rollout" and start["action"] == "start"
    assert len(problems) == 1 and problems[0].startswith("canary 'broken' skipped")
    # The daemon path: the run request for the good canary, the bad one on model_deployment's page.
    store.apply({"rollout2": ("canary", CANARY)}, author="ops", reason="another rollout")
    data = evaluate_sensor("flights_canary_sensor", tmp_path, monkeypatch)
    assert [r.tags["keel/canary"] for r in data.run_requests] == ["rollout2"]
    [observation] = data.asset_events
    assert observation.asset_key == dg.AssetKey(["flights", "model_deployment"])
    assert "canary 'broken' skipped" in observation.metadata["skipped"].value


def two_models(tmp_path, monkeypatch):
    """A KEEL_HOME (also $KEEL_HOME) whose registry holds two versions, the first the champion."""
    from keel.home import KeelHome

    home = KeelHome.of(tmp_path)
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    with ModelRegistry(home.registry) as registry:
        shas = [registry.register("flight-delay", f"model text {i}", {}).sha256 for i in (1, 2)]
        registry.promote("flight-delay", shas[0], "initial")
    return home


def tick_sensor(home, instance):
    """One tick of the deployment's canary_sensor as the daemon evaluates it."""
    import definitions
    from resources import keel_resources

    with dg.build_sensor_context(
        instance=instance, definitions=definitions.defs, resources=keel_resources(home.root)
    ) as ctx:  # closed here, while its instance lives
        return definitions.defs.get_sensor_def("flights_canary_sensor").evaluate_tick(ctx)


def test_a_challenger_that_passed_its_gate_gets_one_canary_started_by_the_loop(tmp_path, monkeypatch):
    from keel.clock import SimClock

    home = two_models(tmp_path, monkeypatch)
    SimClock(home.clock).start(datetime(2013, 7, 3, tzinfo=UTC), speed=1.0)
    gate = {"passed": True, "reason": "log-loss better by 0.0100", "challenger_version": 2, "champion_version": 1,
            "gate_month": "2013-06", "drift_window": "2013-06", "drift_event": 41}  # fmt: skip

    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(["flights", "challenger_evaluation"], metadata={k: v for k, v in gate.items()})
        )
        first = tick_sensor(home, instance)
        with PolicyStore(home.policies) as store:
            state = store.state()
            canary = state["flight-delay.loop-v2"].body
            assert (canary["champion_version"], canary["challenger_version"]) == (1, 2)
            assert canary["origin"]["drift_window"] == "2013-06" and canary["origin"]["drift_event"] == 41
            assert canary["state"]["status"] == "running"  # started in the same tick, on the simulated clock
            assert canary["state"]["started_at"] == pytest.approx(
                datetime(2013, 7, 3, tzinfo=UTC).timestamp(), abs=60
            )
            split = state["flight-delay.loop-v2.split"].body
            weights = {v["name"]: v["weight"] for v in split["variants"]}
            assert weights == {"champion": 1.0, "challenger": 0.0} and split["shadow"] == 2  # shadow first: unserved
            authors = [store.commit(v).author for v in range(1, store.version() + 1)]
        assert authors == ["loop", "canary-controller"]
        [request] = first.run_requests
        assert request.tags["keel/canary_action"] == "start" and request.tags["keel/trigger"] == "drift"
        from keel.alerts import read_alerts

        [alert] = read_alerts(home.root / "alerts" / "alerts.jsonl")
        assert (alert["kind"], alert["severity"], alert["channel"]) == ("canary_start", "info", "mail")
        tick_sensor(home, instance)  # the next tick: the canary holds (no traffic), and none is started twice
        with PolicyStore(home.policies) as store:
            assert [n for n, p in store.state().items() if p.type == "canary"] == ["flight-delay.loop-v2"]
            assert store.version() == 2


def test_a_rollback_is_an_incident_with_its_timeline_and_keel_incidents_lists_it(tmp_path, monkeypatch):
    import time as _time

    from keel.incidents import IncidentLog

    home = two_models(tmp_path, monkeypatch)
    with PolicyStore(home.policies) as store:
        store.apply({"rollout": ("canary", CANARY)}, author="ops", reason="roll out model 2")

    with dg.instance_for_test() as instance:
        tick_sensor(home, instance)  # started: 10 %
        log = ExposureLog(home.serving.exposures)
        traffic(log, _time.time() + 1, challenger_ok=60, challenger_failed=40)  # the challenger fails 40 %
        log.close()
        second = tick_sensor(home, instance)
    assert [r.tags["keel/canary_action"] for r in second.run_requests] == ["rollback"]
    with IncidentLog(home.incidents) as incidents:
        [incident] = incidents.list()
    assert (incident.key, incident.kind, incident.open) == ("canary:rollout", "canary_rollback", False)
    assert "error rate" in incident.located and incident.detected_at == incident.acted_at == incident.recovered_at
    out = subprocess.run(
        [sys.executable, "-m", "keel.cli", "incidents"], env=os.environ | {"KEEL_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and "canary_rollback: canary rollout rolled back (recovered)" in out.stdout
    assert "located    the challenger of rollout: error rate" in out.stdout


def test_without_a_tier_policy_the_latency_target_is_the_tier_the_use_case_declares(monkeypatch):
    """Hotels declares its rate quotes L1: a canary of its model is held to L1's p99; a model no installed use case
    serves gets the default tier, L2."""
    import keel.canary_control as control
    from keel.policies.gateway import DEFAULT_TIERS
    from keel.usecase import from_module

    hotels = from_module("usecases.hotels")
    assert hotels.serving.tier == "L1"
    monkeypatch.setattr(control, "by_model", lambda model: hotels)
    assert control.sla_p99_target({}, "room-rate") == DEFAULT_TIERS["L1"].p99_ms
    monkeypatch.undo()
    assert control.sla_p99_target({}, "no-such-model") == DEFAULT_TIERS["L2"].p99_ms
