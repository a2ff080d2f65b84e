"""The nightly drift schedule as the daemon evaluates it: the newest complete month, once, the night after it ends;
a skip that says why when it is reported already or a live replay runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg

import definitions
from keel.clock import SimClock
from resources import keel_resources
from tests.flights import DRIFT_REPORT

NIGHTLY_DRIFT = definitions.defs.get_schedule_def("flights_nightly_drift")


def evaluate(home, instance, when: datetime, monkeypatch):
    """One evaluation of the schedule's function, as the daemon calls it at ``when``. The context is closed here,
    inside the instance's lifetime: left to the garbage collector, its exit would restore Dagster's definitions-state
    context to this test's instance during a later test, after the instance is gone."""
    monkeypatch.setenv("KEEL_HOME", str(home))
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=when, resources=keel_resources(home)
    ) as ctx:
        result = NIGHTLY_DRIFT(ctx)
    return result if isinstance(result, dg.SkipReason) else [result]


def test_a_month_is_judged_the_night_after_it_ends_once(tmp_path, monkeypatch):
    with dg.instance_for_test() as instance:
        [request] = evaluate(tmp_path, instance, datetime(2013, 8, 1, 2, tzinfo=UTC), monkeypatch)
        assert (request.partition_key, request.run_key) == ("2013-07", "nightly_drift:2013-07")
        # mid-August: July is still the newest complete month — the same run key (the daemon launches it once)
        [again] = evaluate(tmp_path, instance, datetime(2013, 8, 16, 2, tzinfo=UTC), monkeypatch)
        assert again.run_key == request.run_key
        # once July has its report, the nights until September say so
        instance.report_runless_asset_event(dg.AssetMaterialization(DRIFT_REPORT, partition="2013-07"))
        reported = evaluate(tmp_path, instance, datetime(2013, 8, 17, 2, tzinfo=UTC), monkeypatch)
        assert isinstance(reported, dg.SkipReason) and "2013-07" in reported.skip_message
        before = evaluate(tmp_path, instance, datetime(2013, 1, 20, 2, tzinfo=UTC), monkeypatch)
        assert isinstance(before, dg.SkipReason) and "no month of flights has ended" in before.skip_message


def test_in_a_live_replay_it_leaves_drift_to_the_landing_sensor(tmp_path, monkeypatch):
    SimClock(tmp_path / "clock.json").start(datetime(2013, 7, 2, tzinfo=UTC))
    with dg.instance_for_test() as instance:
        live = evaluate(tmp_path, instance, datetime(2013, 8, 1, 2, tzinfo=UTC), monkeypatch)
    assert isinstance(live, dg.SkipReason) and "live replay" in live.skip_message


def test_it_is_the_use_cases_schedule_on_its_drift_job():
    schedule = definitions.defs.get_schedule_def("flights_nightly_drift")
    assert schedule.job_name == "flights_drift" and schedule.cron_schedule == "0 2 * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_the_weekly_drill_takes_turns_and_skips_without_a_runtime(tmp_path, monkeypatch):
    from keel.chaos import DRILLS
    from keel.usecase import installed
    from sensors.drills import drill_of_the_week, weekly_chaos_drill

    mondays = [datetime(2026, 11, 2, 3, tzinfo=UTC) + timedelta(weeks=i) for i in range(12)]
    one = ("flights",)
    n = len(DRILLS)
    assert sorted(drill_of_the_week(m, True, one)[1] for m in mondays[:n]) == sorted(DRILLS)  # n weeks, n drills
    assert {drill_of_the_week(m, False, one)[1] for m in mondays[: n - 2]} == {
        "bad-challenger", "runtime-crash", "coarse-fallback", "control-plane-tamper", "overload"
    }  # fmt: skip
    # two use cases: each drill on each of them within 2n weeks
    spring = [datetime(2026, 3, 2, 3, tzinfo=UTC) + timedelta(weeks=i) for i in range(2 * n)]  # from ISO week 10
    assert sorted(drill_of_the_week(m, True, ("rooms", "flights")) for m in spring) == sorted(
        (uc, d) for uc in ("flights", "rooms") for d in DRILLS
    )
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    with dg.instance_for_test() as instance:
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=mondays[0],
                                       resources=keel_resources(tmp_path)) as ctx:  # fmt: skip
            skipped = weekly_chaos_drill(ctx)
        assert isinstance(skipped, dg.SkipReason) and "no model runtime is up" in skipped.skip_message
        (tmp_path / "serving").mkdir()
        (tmp_path / "serving" / "endpoints.json").write_text("{}")
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=mondays[0],
                                       resources=keel_resources(tmp_path)) as ctx:  # fmt: skip
            request = weekly_chaos_drill(ctx)
    usecase, drill = drill_of_the_week(mondays[0], False, tuple(installed()))  # every installed use case takes turns
    assert request.run_key == f"chaos:2026-W45:{usecase}:{drill}"
    assert request.run_config == {"ops": {"chaos_drill": {"config": {"drill": drill, "usecase": usecase}}}}
    dg.validate_run_config(definitions.defs.get_job_def("keel_chaos_drill"), request.run_config)  # raises if not
