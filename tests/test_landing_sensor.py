"""The landing sensor as the daemon evaluates it: new landed days rebuild their month once; a complete month gets
its drift report only after the complete delivery's features exist; nothing happens outside a live replay."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
from dagster._core.utils import make_new_run_id

import definitions
from keel.clock import SimClock
from keel.data.landing import LandingZone
from keel.home import KeelHome
from resources import keel_resources
from tests.flights import monthly as monthly_2013
from usecases.flights import usecase as FLIGHTS


@dg.asset(key=["flights", "flight_features"], partitions_def=monthly_2013)
def stub_features() -> None:
    """Stands for the real flight_features: a materialization of a month by a given run."""


def tick(home, instance, cursor=None):
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=definitions.defs, resources=keel_resources(home)
    ) as ctx:  # closed here, while its instance lives
        return definitions.defs.get_sensor_def("flights_landing_sensor").evaluate_tick(ctx)


def test_outside_a_live_replay_it_skips(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    with dg.instance_for_test() as instance:
        data = tick(tmp_path, instance)
    assert not data.run_requests and "no live replay" in data.skip_message


def test_landed_days_rebuild_their_month_once_and_complete_months_get_drift(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome(tmp_path)
    now = datetime(2013, 4, 3, 13, tzinfo=UTC)  # Jan–Mar landed, and April 1–2
    SimClock(home.clock).start(now)
    LandingZone(home.landing, FLIGHTS).deliver(now)
    with dg.instance_for_test() as instance:
        first = tick(tmp_path, instance)
        monthly = [(r.job_name, r.partition_key, r.run_key) for r in first.run_requests]
        assert monthly == [
            ("flights_monthly", "2013-01", "landing:2013-01:31-31"),
            ("flights_monthly", "2013-02", "landing:2013-02:28-28"),
            ("flights_monthly", "2013-03", "landing:2013-03:31-31"),
            ("flights_monthly", "2013-04", "landing:2013-04:2-2"),
        ]
        assert all(r.tags["keel/trigger"] == "landing" for r in first.run_requests)
        # the next tick, nothing new: nothing
        again = tick(tmp_path, instance, first.cursor)
        assert not again.run_requests
        # March's complete delivery built its features: March's drift report is asked for, once
        assert dg.materialize(
            [stub_features],
            partition_key="2013-03",
            instance=instance,
            tags={"dagster/run_key": "landing:2013-03:31-31"},
        ).success
        # …but not before the drift reference exists (the first model's job builds it)
        assert not tick(tmp_path, instance, first.cursor).run_requests
        instance.report_runless_asset_event(dg.AssetMaterialization(["flights", "drift_reference"]))
        drift = tick(tmp_path, instance, first.cursor)
        assert [(r.job_name, r.partition_key) for r in drift.run_requests] == [("flights_drift", "2013-03")]
        assert not tick(tmp_path, instance, drift.cursor).run_requests
        # a day more lands: April is rebuilt with a key naming the new delivery
        LandingZone(home.landing, FLIGHTS).deliver(datetime(2013, 4, 4, 13, tzinfo=UTC))
        later = tick(tmp_path, instance, drift.cursor)
        assert [(r.partition_key, r.run_key) for r in later.run_requests] == [("2013-04", "landing:2013-04:3-3")]


def test_history_the_set_up_built_is_not_built_again(tmp_path, monkeypatch):
    """scripts/materialize.py --live builds January–March itself (tagged with the delivery it built): the sensor
    notes them and asks only for what it has not seen built."""
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome(tmp_path)
    now = datetime(2013, 4, 1, 12, tzinfo=UTC)  # January–March, in full
    SimClock(home.clock).start(now)
    LandingZone(home.landing, FLIGHTS).deliver(now)
    with dg.instance_for_test() as instance:
        for month, key in (("2013-01", "31-31"), ("2013-02", "28-28")):
            assert dg.materialize(
                [stub_features], partition_key=month, instance=instance,
                tags={"keel/delivery": f"landing:{month}:{key}"},
            ).success  # fmt: skip
        first = tick(tmp_path, instance)
        assert [r.partition_key for r in first.run_requests if r.job_name == "flights_monthly"] == ["2013-03"]
        assert not tick(tmp_path, instance, first.cursor).run_requests


def test_while_a_delivery_is_built_new_days_wait_and_go_together(tmp_path, monkeypatch):
    """On a busy machine deliveries coalesce: while a rebuild of the use case is queued or running, new days are not
    asked for; once it is done, everything that landed meanwhile is one run — no queue that grows without end."""
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome(tmp_path)
    now = datetime(2013, 4, 3, 13, tzinfo=UTC)
    SimClock(home.clock).start(now)
    zone = LandingZone(home.landing, FLIGHTS)
    zone.deliver(now)
    with dg.instance_for_test() as instance:
        first = tick(tmp_path, instance)
        assert len(first.run_requests) == 4
        # a rebuild of April is still running when two more days land
        running = instance.add_run(
            dg.DagsterRun(job_name="flights_monthly", run_id=make_new_run_id(), status=dg.DagsterRunStatus.STARTED)
        )
        zone.deliver(datetime(2013, 4, 5, 13, tzinfo=UTC))
        waiting = tick(tmp_path, instance, first.cursor)
        assert not waiting.run_requests and "being built" in waiting.skip_message
        instance.report_run_failed(running)  # done (how does not matter here)
        together = tick(tmp_path, instance, first.cursor)
        assert [(r.partition_key, r.run_key) for r in together.run_requests] == [("2013-04", "landing:2013-04:4-4")]
