"""The drift sensor with build_sensor_context, as the daemon ticks it: freezes only on the report's evidence, each
freeze expiring on the shared clock or cleared by a promotion that learned the drift, one challenger at a time in a
live replay (run key = the plan's data), and a cursor that makes duplicate ticks and daemon restarts harmless."""

import json
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

import definitions
from keel.clock import SimClock
from keel.data.landing import LandingZone
from keel.home import KeelHome
from keel.registry import ModelRegistry
from resources import keel_resources
from sensors.drift import DriftCursor
from tests.drift.summaries import feat
from tests.flights import DRIFT_REPORT
from usecases.flights import usecase as FLIGHTS
from usecases.flights.features import FLIGHT_FEATURES

EXPIRES = "2013-07-31T12:00:00+00:00"
FAR = "2999-01-01T00:00:00+00:00"
JULY_2 = datetime(2013, 7, 2, 13, tzinfo=UTC)


def evidence(freeze: bool, expires: str | None = EXPIRES) -> dict:
    why = "frozen serves better: log-loss better by 0.0100" if freeze else "serving temp frozen is not better"
    return {"freeze": freeze, "freeze_expires": expires if freeze else None, "freeze_reason": why}


def report(instance, partition: str, features: dict) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=DRIFT_REPORT, partition=partition, metadata={"features": dg.MetadataValue.json(features)}
        )
    )


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    return KeelHome.of(tmp_path)


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def tick(instance, home, cursor=None):
    """One tick through the daemon's path (evaluate_tick checks each run request against the sensor's jobs)."""
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=definitions.defs, resources=keel_resources(home.root)
    ) as ctx:  # closed here, while its instance lives
        return definitions.defs.get_sensor_def("flights_drift_sensor").evaluate_tick(ctx)


def frozen(home) -> dict:
    from keel.features.sqlite_store import SQLiteOnlineStore

    with SQLiteOnlineStore(home.online_store_of("flights"), features=FLIGHT_FEATURES) as store:
        return store.frozen()


def champion(home, months: list[str], valid: str) -> None:
    with ModelRegistry(home.registry) as reg:
        sha = reg.register("flight-delay", f"tree\n{months}\n", {"train_months": months, "valid_month": valid}).sha256
        reg.set_alias("flight-delay", "champion", sha, "test: promoted")


def live_at(home, instance, now: datetime, complete_through: int) -> None:
    """A live replay at ``now`` whose flights have landed in full for 2013-01 … 2013-``complete_through``, each of
    those months' features built (a materialization not from a delivery: it read every landed day)."""
    SimClock(home.clock).start(now, speed=1.0)
    zone = LandingZone(home.landing, FLIGHTS)
    d = date(2013, 1, 1)
    while d.month <= complete_through and d.year == 2013:
        zone.path("flights", d).parent.mkdir(parents=True, exist_ok=True)
        zone.path("flights", d).touch()  # which days landed is all the sensor reads of the zone
        d += timedelta(days=1)
    for month in range(1, complete_through + 1):
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=dg.AssetKey(["flights", "flight_features"]), partition=f"2013-{month:02d}"
            )
        )


def test_a_drifted_feature_is_frozen_only_on_evidence(home, instance):
    # no live replay here (no clock): time is the wall clock's, and the freeze expires a month after the report
    report(
        instance,
        "2013-06",
        {
            "temp": feat(True, "error", 0.9, mean=38.5) | evidence(True, FAR),
            "humid": feat(True, "error", 0.8, mean=60.0) | evidence(False),
            "distance": feat(False),
        },
    )
    result = tick(instance, home)
    assert frozen(home) == {"temp": 38.5}  # humid drifted as much, but serving it frozen is not better
    assert result.run_requests == []  # not a live replay: no challenger
    assert DriftCursor.parse(result.cursor).freezes == {"temp": ("2013-06", FAR)}
    [seen] = [e for e in result.asset_events if e.asset_key == dg.AssetKey(["flights", "feature_freezes"])]
    assert seen.metadata["frozen_features"].value == "temp"
    [row] = seen.metadata["freezes"].value.records
    assert "drift_report 2013-06" in row.data["decision"] and f"expires {FAR}" in row.data["decision"]
    # …and someone is told: a warning, routed to chat (the default route; logged under KEEL_HOME)
    from keel.alerts import read_alerts

    [alert] = read_alerts(home.root / "alerts" / "alerts.jsonl")
    assert (alert["kind"], alert["severity"], alert["channel"]) == ("drift_freeze", "warning", "chat")
    assert alert["summary"] == "temp is served frozen at 38.5" and alert["source"] == "flights_drift_sensor"
    # a report from before evidence existed (no freeze column) freezes nothing
    report(instance, "2013-07", {"wind_speed": feat(True, "error", 0.9, mean=9.0)})
    later = tick(instance, home, result.cursor)
    assert (
        frozen(home) == {"temp": 38.5}
        and DriftCursor.parse(later.cursor).after > DriftCursor.parse(result.cursor).after
    )


def test_duplicate_ticks_and_a_lost_cursor_freeze_nothing_twice(home, instance):
    SimClock(home.clock).start(JULY_2, speed=1.0)
    report(instance, "2013-06", {"temp": feat(True, "error", 0.9, mean=38.5) | evidence(True)})
    first = tick(instance, home)
    assert frozen(home) == {"temp": 38.5}
    again = tick(instance, home, first.cursor)
    assert again.skip_message and "no drift report after" in again.skip_message
    tick(instance, home, None)  # a restarted daemon that lost its cursor replays the report
    from keel.features.sqlite_store import SQLiteOnlineStore

    with SQLiteOnlineStore(home.online_store_of("flights"), features=FLIGHT_FEATURES) as store:
        assert [(e.feature, e.action) for e in store.freeze_log()] == [("temp", "freeze")]
    assert DriftCursor.parse("17").after == 17  # an older keel's cursor (a storage id) still reads


def test_a_clean_report_unfreezes(home, instance):
    SimClock(home.clock).start(JULY_2, speed=1.0)
    report(instance, "2013-06", {"temp": feat(True, "error", 0.9, mean=38.5) | evidence(True)})
    first = tick(instance, home)
    report(instance, "2013-07", {"temp": feat(False)})
    second = tick(instance, home, first.cursor)
    assert frozen(home) == {} and DriftCursor.parse(second.cursor).freezes == {}


def test_a_freeze_expires_on_the_shared_clock(home, instance):
    SimClock(home.clock).start(JULY_2, speed=1.0)
    report(instance, "2013-06", {"temp": feat(True, "error", 0.9, mean=38.5) | evidence(True)})
    first = tick(instance, home)
    SimClock(home.clock).advance_to(datetime(2013, 7, 20, tzinfo=UTC))
    before = tick(instance, home, first.cursor)
    assert frozen(home) == {"temp": 38.5} and DriftCursor.parse(before.cursor).freezes  # not yet
    SimClock(home.clock).advance_to(datetime(2013, 8, 1, tzinfo=UTC))
    after = tick(instance, home, first.cursor)
    assert frozen(home) == {} and DriftCursor.parse(after.cursor).freezes == {}
    from keel.features.sqlite_store import SQLiteOnlineStore

    with SQLiteOnlineStore(home.online_store_of("flights"), features=FLIGHT_FEATURES) as store:
        frozen_at, expired = store.freeze_log()
    assert "expired at 2013-07-31T12:00:00" in expired.reason
    # logged on the replay's calendar, as the expiry is: frozen on July 2nd, live again on the tick after August 1st
    assert frozen_at.at.date() == JULY_2.date() and expired.at.date() == date(2013, 8, 1)


def test_promoting_a_model_trained_on_the_drift_clears_its_freeze(home, instance):
    SimClock(home.clock).start(JULY_2, speed=1.0)
    champion(home, ["2013-01", "2013-02"], "2013-03")
    report(instance, "2013-06", {"temp": feat(True, "error", 0.9, mean=38.5) | evidence(True)})
    first = tick(instance, home)
    assert frozen(home) == {"temp": 38.5}
    champion(home, ["2013-04", "2013-05"], "2013-06")  # the loop promoted a model that learned June
    second = tick(instance, home, first.cursor)
    assert frozen(home) == {}
    [seen] = [e for e in second.asset_events if e.asset_key == dg.AssetKey(["flights", "feature_freezes"])]
    assert seen.metadata["frozen"].value == 0


def test_live_drift_asks_for_one_challenger_on_the_recent_months(home, instance):
    champion(home, ["2013-01", "2013-02"], "2013-03")
    live_at(home, instance, datetime(2013, 7, 2, 13, tzinfo=UTC), complete_through=6)
    report(instance, "2013-06", {"label_late15": feat(True, "warn", 0.3)})
    first = tick(instance, home)
    [request] = first.run_requests
    assert request.job_name == "flights_challenger" and request.run_key == "challenger:2013-03..2013-05|2013-06"
    config = request.run_config["ops"]["flights__challenger_model"]["config"]
    assert config == request.run_config["ops"]["flights__challenger_evaluation"]["config"]
    assert (config["train_months"], config["gate_month"], config["gate_from_day"], config["drift_window"]) == (
        ["2013-03", "2013-04", "2013-05"],
        "2013-06",
        11,  # the use case's Loop says where the gate month splits (flights: days 1–10 early-stop, 11–end judge)
        "2013-06",
    )
    assert request.tags["keel/trigger"] == "drift" and request.tags["keel/sim_now"].startswith("2013-07-02")
    # the same drift over the same data: the same run key (the daemon launches a run key once)
    report(instance, "2013-06", {"label_late15": feat(True, "warn", 0.31)})
    assert [r.run_key for r in tick(instance, home, first.cursor).run_requests] == [request.run_key]


def test_a_month_without_drift_still_considers_a_challenger_on_schedule(home, instance):
    """Every month's report considers a challenger, drift or not (issue 62: the expanding refit is among the
    candidates every month): a clean June asks for one on the newest labelled months, its trigger ``monthly``."""
    champion(home, ["2013-01", "2013-02"], "2013-03")
    live_at(home, instance, datetime(2013, 7, 2, 13, tzinfo=UTC), complete_through=6)
    report(instance, "2013-06", {"temp": feat(False, "none", 0.01), "label_late15": feat(False, "none", 0.01)})
    [request] = tick(instance, home).run_requests
    assert request.run_key == "challenger:2013-03..2013-05|2013-06"
    assert request.tags["keel/trigger"] == "monthly" and request.tags["keel/reason"].startswith("monthly: no drift")
    assert frozen(home) == {}  # no drift: nothing frozen


def test_no_second_challenger_while_one_trains_or_a_canary_runs(home, instance):
    champion(home, ["2013-01", "2013-02"], "2013-03")
    live_at(home, instance, datetime(2013, 7, 2, 13, tzinfo=UTC), complete_through=6)
    create_run_for_test(instance, job_name="flights_challenger", status=dg.DagsterRunStatus.STARTED)
    report(instance, "2013-06", {"label_late15": feat(True, "warn", 0.3)})
    assert tick(instance, home).run_requests == []  # coalesced: the drift is still there when it finishes

    with dg.instance_for_test() as fresh:
        with ModelRegistry(home.registry) as reg:
            sha = reg.register("flight-delay", "tree\nchallenger\n", {}).sha256
            v_champion = reg.version("flight-delay", reg.alias("flight-delay", "champion"))
            v_challenger = reg.version("flight-delay", sha)
        from keel.policies import PolicyStore

        with PolicyStore(home.policies) as store:
            store.apply(
                {"rollout": ("canary", {"model": "flight-delay", "champion_version": v_champion,
                                        "challenger_version": v_challenger, "interval_s": 60})},
                author="ops", reason="a canary by hand",
            )  # fmt: skip
        report(fresh, "2013-06", {"label_late15": feat(True, "warn", 0.3)})
        assert tick(fresh, home).run_requests == []


def test_a_report_it_cannot_read_is_reported_and_stops_nothing(home, instance):
    SimClock(home.clock).start(JULY_2, speed=1.0)
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=DRIFT_REPORT, partition="2013-10", metadata={"rows": 3})  # no summary
    )
    report(instance, "2013-12", {"temp": feat(True, "error", 0.9, mean=38.5) | evidence(True)})
    result = tick(instance, home)
    assert frozen(home) == {"temp": 38.5}
    [observation] = [e for e in result.asset_events if e.asset_key == DRIFT_REPORT]
    assert observation.metadata["automation_problems"].value == 1
    assert "drift report 2013-10" in observation.metadata["skipped"].value
    assert json.loads(result.cursor)["after"] > 0
