"""A use case's jobs, sensors and schedule are generated from its declaration (assets/jobs.py, sensors/usecase.py):
the test-declared rooms use case gets its own, named after it, side by side with flights' in one code location, and
each acts on its own use case only — rooms' drift sensor freezes in rooms' online store and leaves flights' alone,
rooms' schedule judges rooms' months, flights' canary sensor leaves a rooms canary alone."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest

import definitions
import tests.usecases.rooms as rooms
from keel.features.sqlite_store import SQLiteOnlineStore
from keel.home import KeelHome
from keel.policies import PolicyStore
from keel.registry import ModelRegistry
from resources import keel_resources
from tests.drift.summaries import feat
from tests.policy.test_canary_sensor import CANARY  # a valid canary body (its model is replaced here)
from usecases.flights.features import FLIGHT_FEATURES

UC = rooms.usecase


@pytest.fixture(scope="module")
def generated():
    jobs, rooms_defs = definitions.usecase_definitions(UC)
    merged = dg.Definitions.merge(definitions.defs, rooms_defs)  # refuses two definitions of one name
    return jobs, merged


def test_rooms_gets_its_own_jobs_sensors_and_schedule_beside_flights(generated):
    jobs, merged = generated
    assert [s.job.name for s in jobs.build_order] == [
        "rooms_reference_tables",  # its unpartitioned source (cities)
        "rooms_monthly",
        "rooms_models",
        "rooms_drift",
    ]  # no rooms_causal: it has no whole-period analyses
    assert jobs.challenger.name == "rooms_challenger"
    sensors = {s.name for s in merged.sensors}
    assert {"rooms_drift_sensor", "rooms_canary_sensor", "flights_drift_sensor", "flights_canary_sensor"} <= sensors
    assert "rooms_landing_sensor" not in sensors  # nothing of rooms lands day by day: no landing sensor
    assert merged.get_schedule_def("rooms_nightly_drift").job_name == "rooms_drift"
    graph = merged.resolve_asset_graph()
    built: set[dg.AssetKey] = set()
    for stage in jobs.build_order:
        keys = set(stage.job.selection.resolve(graph))
        assert keys and all(k.path[0] == "rooms" for k in keys), stage.job.name
        for key in keys:
            assert graph.get(key).is_partitioned == stage.partitioned, key.to_user_string()
            for parent in graph.get(key).parent_keys:
                node = graph.get(parent)
                if node.is_materializable and node.tags.get("keel/backfill") != "skip":  # on demand: the loop's
                    assert parent in built or parent in keys, f"{key.to_user_string()} needs {parent}"
        assert not keys & built, f"{stage.job.name} builds an asset an earlier stage built"
        built |= keys
    assert merged.resolve_job_def("rooms_challenger")  # its selection resolves in the merged graph
    assert jobs.deploy.name == "rooms_deploy"  # the canary sensor's defined job: rooms' deployment only
    assert set(jobs.deploy.selection.resolve(graph)) == {dg.AssetKey(["rooms", "model_deployment"])}


def tick(merged, name: str, home, instance, cursor=None):
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=merged, resources=keel_resources(home.root)
    ) as ctx:
        return merged.get_sensor_def(name).evaluate_tick(ctx)


def test_rooms_drift_sensor_freezes_in_rooms_store_only(generated, tmp_path, monkeypatch):
    _, merged = generated
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome.of(tmp_path)
    evidence = {"freeze": True, "freeze_expires": "2999-01-01T00:00:00+00:00", "freeze_reason": "frozen is better"}
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=dg.AssetKey(["rooms", "drift_report"]),
                partition="2010-01",
                metadata={
                    "features": dg.MetadataValue.json({"nights": feat(True, "error", 0.9, mean=3.5) | evidence})
                },
            )
        )
        flights_tick = tick(merged, "flights_drift_sensor", home, instance)
        rooms_tick = tick(merged, "rooms_drift_sensor", home, instance)
    with SQLiteOnlineStore(home.online_store_of("rooms"), features=UC.features) as store:
        assert store.frozen() == {"nights": 3.5}
    with SQLiteOnlineStore(home.online_store_of("flights"), features=FLIGHT_FEATURES) as store:
        assert store.frozen() == {}  # flights' sensor read no rooms report
    [seen] = rooms_tick.asset_events
    assert (
        seen.asset_key == dg.AssetKey(["rooms", "feature_freezes"])
        and seen.metadata["frozen_features"].value == "nights"
    )
    assert not any(e.asset_key.path[0] == "rooms" for e in flights_tick.asset_events or [])


def test_rooms_schedule_judges_rooms_months(generated, tmp_path, monkeypatch):
    _, merged = generated
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    schedule = merged.get_schedule_def("rooms_nightly_drift")
    with dg.instance_for_test() as instance:
        with dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2009, 12, 1, 2, tzinfo=UTC),
            resources=keel_resources(tmp_path),
        ) as ctx:  # fmt: skip
            request = schedule(ctx)
    assert (request.partition_key, request.run_key) == ("2009-11", "nightly_drift:2009-11")


def test_flights_canary_sensor_leaves_a_rooms_canary_alone(generated, tmp_path, monkeypatch):
    _, merged = generated
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome.of(tmp_path)
    with ModelRegistry(home.registry) as reg:  # the canary's two versions exist: either sensor could act on it
        for v in (1, 2):
            reg.register("room-price", f"tree v{v}\n", {"train_months": ["2009-10"]})
    with PolicyStore(home.policies) as store:
        store.apply(
            {
                "room-price.canary": (
                    "canary",
                    CANARY | {"model": "room-price"},
                )
            },
            author="test",
            reason="a rooms canary",
        )
    with dg.instance_for_test() as instance:
        result = tick(merged, "flights_canary_sensor", home, instance)
    assert result.run_requests == [] and "no canary decision" in result.skip_message
    with PolicyStore(home.policies) as store:
        assert "state" not in store.state()["room-price.canary"].body  # not started by flights' sensor
    with dg.instance_for_test() as instance:
        started = tick(merged, "rooms_canary_sensor", home, instance)
    [request] = started.run_requests  # rooms' own sensor starts it, and deploys rooms' model
    assert request.job_name == "rooms_deploy"  # rooms' own deploy job, which deploys rooms' model
    assert request.tags["keel/canary_action"] == "start"
