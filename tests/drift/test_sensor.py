"""The drift sensor with build_sensor_context: freezes, retraining requests found through the asset graph, run
keys and a cursor that make duplicate ticks and daemon restarts harmless."""

import dagster as dg
import pytest

import definitions
from assets.drift import DRIFT_REPORT
from assets.models import model_assets
from resources import OnlineStoreResource
from sensors.drift import drift_sensor, models_downstream
from tests.drift.summaries import feat


@dg.asset(deps=["delay_model"], kinds={"model"}, group_name="models")
def calibrated_model() -> None:
    """A second model further downstream of the real delay_model: also found through the graph."""


def report(instance, partition: str, features: dict) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=DRIFT_REPORT, partition=partition, metadata={"features": dg.MetadataValue.json(features)}
        )
    )


@pytest.fixture
def setup(tmp_path):
    store_resource = OnlineStoreResource(path=str(tmp_path / "online.sqlite"))
    defs = dg.Definitions(
        assets=[*definitions.defs.assets, calibrated_model],
        sensors=[drift_sensor],
        resources=dict(definitions.defs.resources) | {"online_store": store_resource},
    )
    with dg.instance_for_test() as instance:
        yield instance, defs, store_resource


def tick(instance, defs, cursor):
    resources = {"online_store": defs.resources["online_store"]}
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources=resources)
    result = drift_sensor(ctx)
    return result, ctx


def test_models_are_found_through_the_asset_graph(setup):
    _, defs, _ = setup
    keys = models_downstream(defs.resolve_asset_graph(), dg.AssetKey("flight_features"))
    assert keys == [dg.AssetKey("calibrated_model"), dg.AssetKey("delay_model")]


def test_drift_freezes_and_requests_retraining_once(setup):
    instance, defs, store_resource = setup
    report(
        instance,
        "2013-12",
        {
            "temp": feat(True, "error", 0.9, mean=38.5),
            "distance": feat(False),
            "label_late15": feat(True, "warn", 0.2),
        },
    )
    result, _ = tick(instance, defs, None)
    [request] = result.run_requests
    assert request.run_key.startswith("retrain:2013-12:")
    assert set(request.asset_selection) == {dg.AssetKey("delay_model"), dg.AssetKey("calibrated_model")}
    assert request.tags["keel/drift_window"] == "2013-12" and "temp" in request.tags["keel/reason"]
    store = store_resource.open()
    assert store.frozen() == {"temp": 38.5}  # served value: the reference default (its mean)
    [event] = store.freeze_log()
    assert (event.feature, event.action) == ("temp", "freeze") and "2013-12" in event.reason and event.at is not None
    # …and what is served frozen is on the feature_freezes asset: which, at what value, since when, by which report
    [seen] = [e for e in result.asset_events if e.asset_key == dg.AssetKey("feature_freezes")]
    assert seen.metadata["frozen"].value == 1 and seen.metadata["frozen_features"].value == "temp"
    [row] = seen.metadata["freezes"].value.records
    assert row.data["feature"] == "temp" and row.data["value"] == 38.5 and row.data["since"]
    assert "drift_report 2013-12" in row.data["decision"]
    cursor = result.cursor

    # a duplicate tick with the new cursor: nothing new, cursor unchanged
    again, _ = tick(instance, defs, cursor)
    assert isinstance(again, dg.SkipReason)
    # a daemon restart that lost its cursor replays the event: same run key (the daemon dedups it), no second freeze
    replay, _ = tick(instance, defs, None)
    assert [r.run_key for r in replay.run_requests] == [request.run_key]
    assert len(store.freeze_log()) == 1
    assert int(replay.cursor) == int(cursor)


def test_cursor_moves_forward_and_clear_windows_unfreeze(setup):
    instance, defs, store_resource = setup
    report(instance, "2013-12", {"temp": feat(True, "error", 0.9)})
    first, _ = tick(instance, defs, None)
    report(instance, "2014-01", {"temp": feat(False)})
    second, _ = tick(instance, defs, first.cursor)
    assert int(second.cursor) > int(first.cursor)
    assert second.run_requests == []  # nothing drifted in the new window
    store = store_resource.open()
    assert store.frozen() == {}
    assert [(e.feature, e.action) for e in store.freeze_log()] == [("temp", "freeze"), ("temp", "unfreeze")]
    [seen] = [e for e in second.asset_events if e.asset_key == dg.AssetKey("feature_freezes")]
    assert seen.metadata["frozen"].value == 0 and seen.metadata["frozen_features"].value == "none"
    # an old cursor never moves the cursor backwards
    replay, _ = tick(instance, defs, "0")
    assert int(replay.cursor) >= int(second.cursor)


MODEL_KEYS = {key for a in model_assets for key in a.keys}


def test_without_models_downstream_it_still_freezes(setup, tmp_path):
    instance, _, store_resource = setup
    defs = dg.Definitions(
        assets=[a for a in definitions.defs.assets if not set(getattr(a, "keys", ())) & MODEL_KEYS],
        sensors=[drift_sensor],
        resources=dict(definitions.defs.resources) | {"online_store": store_resource},
    )
    report(instance, "2013-09", {"temp": feat(True, "error", 3.7)})
    result, _ = tick(instance, defs, None)
    assert result.run_requests == []
    assert "temp" in store_resource.open().frozen()


def test_the_daemon_path_resolves_the_retraining_request(setup):
    """What the daemon calls (evaluate_tick, which checks each run request against the sensor's target): a sensor
    without a target fails here with "RunRequest for a sensor lacking a specified target"."""
    instance, defs, _ = setup
    report(
        instance, "2013-12", {"temp": feat(True, "error", 0.9, mean=38.5), "label_late15": feat(True, "warn", 0.2)}
    )
    resources = {"online_store": defs.resources["online_store"]}
    ctx = dg.build_sensor_context(instance=instance, definitions=defs, resources=resources)
    data = defs.get_sensor_def("drift_sensor").evaluate_tick(ctx)
    [request] = data.run_requests
    assert set(request.asset_selection) == {dg.AssetKey("delay_model"), dg.AssetKey("calibrated_model")}


def test_a_drifted_label_or_category_is_not_frozen_and_a_bad_report_stops_nothing(setup):
    """The label and a categorical column cannot be frozen (the online store serves neither): their drift asks for
    retraining only. A report the sensor cannot act on is reported — in the tick's log and as an observation on
    drift_report — and skipped; the reports after it are acted on, and every later tick runs."""
    instance, defs, store_resource = setup
    report(instance, "2013-09", {"label_late15": feat(True, "error", 0.4), "carrier": feat(True, "error", 0.5)})
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=DRIFT_REPORT, partition="2013-10", metadata={"rows": 3})  # no summary
    )
    report(instance, "2013-12", {"temp": feat(True, "error", 0.9, mean=38.5)})
    result, _ = tick(instance, defs, None)
    assert [r.tags["keel/drift_window"] for r in result.run_requests] == ["2013-09", "2013-12"]
    assert store_resource.open().frozen() == {"temp": 38.5}
    [observation] = [e for e in result.asset_events if e.asset_key == DRIFT_REPORT]
    assert observation.asset_key == DRIFT_REPORT and observation.metadata["automation_problems"].value == 1
    assert "drift report 2013-10" in observation.metadata["skipped"].value
    report(instance, "2014-01", {"temp": feat(False)})
    later, _ = tick(instance, defs, result.cursor)  # the next tick carries on
    assert store_resource.open().frozen() == {} and int(later.cursor) > int(result.cursor)
