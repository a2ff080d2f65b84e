"""The drills' faults and the platform's answers, one piece at a time (tests/test_live_drills.py runs them against
the whole running platform): the inverted model really scores 1 − p; a policy commit deleted behind the triggers is
found by the watchdog sensor and put back from the journal — only what chains onto the log and ends at the keyed
head; a day of weather in °C is held back by the landing sensor, located through the lineage graph, and recovered
when the upstream delivers it again; the incidents asset shows the timeline."""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import lightgbm as lgb
import numpy as np
import pytest

import definitions
from keel.alerts import read_alerts
from keel.chaos import (
    DrillError,
    invert_model,
    plant_challenger,
    remove_newest_commit,
    twin_model,
)
from keel.clock import SimClock
from keel.data.landing import LandingZone
from keel.home import KeelHome
from keel.incidents import IncidentLog
from keel.policies import PolicyReader, PolicyStore
from keel.policies.errors import PolicyError
from keel.storage import write_parquet_atomic
from resources import keel_resources
from tests.control_plane import url_of
from usecases.flights import usecase as FLIGHTS


def _day_rows(table, day):
    return LandingZone("/nonexistent", FLIGHTS).day_rows(table, day)


BREAKER = {"error_rate": 0.05, "window_s": 5, "min_requests": 20, "open_s": 30, "half_open_probes": 5}


def test_an_inverted_model_scores_the_complement():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2000, 4))
    y = (x[:, 0] + rng.normal(size=2000) > 0).astype(int)
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_leaves": 7, "num_threads": 1}, lgb.Dataset(x, y), 20
    )
    inverted = lgb.Booster(model_str=invert_model(booster.model_to_string()))
    np.testing.assert_allclose(inverted.predict(x), 1 - booster.predict(x), atol=1e-12)


def test_a_twin_model_is_another_model_with_the_same_scores():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2000, 4))
    y = (x[:, 0] + rng.normal(size=2000) > 0).astype(int)
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_leaves": 7, "seed": 5}, lgb.Dataset(x, y), 20)
    text = booster.model_to_string()
    twin = twin_model(text)
    assert twin != text and "[seed: 6]" in twin
    np.testing.assert_array_equal(lgb.Booster(model_str=twin).predict(x), booster.predict(x))


def test_a_planted_challenger_enters_a_canary_only_when_none_is_unfinished(tmp_path):
    """The drill's (and the live-year test's) planted challenger: registered from the champion, one canary at a
    time, and never committed over a commit it did not see."""
    from keel.registry import ModelRegistry

    home = KeelHome(tmp_path)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(500, 3))
    booster = lgb.train({"objective": "binary", "verbose": -1, "seed": 1}, lgb.Dataset(x, x[:, 0] > 0), 5)
    with ModelRegistry(home.registry) as reg:
        champion = reg.register("flight-delay", booster.model_to_string(), {"note": "champion"})
        reg.set_alias("flight-delay", "champion", champion.sha256, "the first model")
    name, version = plant_challenger(
        home, "flight-delay", twin_model, "twin", "tests", "v{challenger} twin of v{champion}", {}
    )
    assert (name, version) == ("flight-delay.twin-v2", 2)
    with PolicyStore(home.policies) as store:
        body = store.get(name).body
        assert body["champion_version"] == 1 and body["challenger_version"] == 2
        assert store.commit(store.version()).reason == "v2 twin of v1"
    with pytest.raises(DrillError, match="is running"):
        plant_challenger(home, "flight-delay", invert_model, "drill", "tests", "inverted", {})


def sensor_tick(name: str, home, instance, cursor=None):
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=definitions.defs, resources=keel_resources(home)
    ) as ctx:
        return definitions.defs.get_sensor_def(name).evaluate_tick(ctx)


@pytest.fixture
def store_with_commits(location):
    """Three commits in a policy store on each backend (a SQLite file, a Postgres schema)."""
    path = location
    with PolicyStore(path) as store:
        for i in range(3):
            store.apply(
                {"breaker": ("circuit_breaker", BREAKER | {"open_s": 30 + i})}, author="a", reason=f"v{i + 1}"
            )
    return path


def test_a_removed_commit_is_restored_from_the_journal_and_the_chain_verifies(store_with_commits):
    reader = PolicyReader(store_with_commits)
    assert reader.version() == 3
    assert remove_newest_commit(store_with_commits) == 3
    assert reader.version() == 2  # what a following gateway sees: the store went backwards
    with PolicyStore(store_with_commits) as store:
        broken = store.verify()
        assert not broken.ok and any("removed (truncated)" in p for p in broken.problems)
        assert store.restore_removed() == [3]
        assert store.verify().ok and store.get("breaker").body["open_s"] == 32
        assert store.restore_removed() == []  # nothing removed any more
        store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="v4")  # appends work again
    reader.close()


def test_a_journal_entry_that_does_not_chain_is_never_restored(tmp_path):
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        for i in range(3):
            store.apply({"breaker": ("circuit_breaker", BREAKER | {"open_s": 30 + i})}, author="a", reason=f"v{i}")
    store_with_commits = tmp_path / "policies.sqlite"
    journal = store_with_commits.with_name("policies.sqlite.journal")
    lines = journal.read_text().splitlines()
    forged = json.loads(lines[-1]) | {"reason": "someone else's commit"}
    journal.write_text("\n".join([*lines[:-1], json.dumps(forged)]) + "\n")
    remove_newest_commit(store_with_commits)
    with PolicyStore(store_with_commits) as store, pytest.raises(PolicyError, match="does not chain"):
        store.restore_removed()


def test_the_watchdog_restores_a_tampered_store_records_the_incident_and_pages(tmp_path, monkeypatch, location):
    """On each backend: with a Postgres location, the whole control plane is there ($KEEL_CONTROL_PLANE) — the
    policy store the drill tampers with, its journal, the incident log."""
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    if not isinstance(location, Path):
        monkeypatch.setenv("KEEL_CONTROL_PLANE", url_of(location))
    home = KeelHome(tmp_path)
    with PolicyStore(home.policies) as store:
        for i in range(2):
            store.apply(
                {"breaker": ("circuit_breaker", BREAKER | {"open_s": 30 + i})}, author="a", reason=f"v{i + 1}"
            )
    remove_newest_commit(home.policies)
    with dg.instance_for_test() as instance:
        result = sensor_tick("watchdog_sensor", tmp_path, instance)
        assert [r.job_name for r in result.run_requests] == ["keel_incidents"]
        again = sensor_tick("watchdog_sensor", tmp_path, instance, result.cursor)
        assert not again.run_requests  # nothing changed: no refresh, no second alert
    with IncidentLog(home.incidents) as log:
        [incident] = log.list()
    assert incident.key == "tamper:policies:2" and incident.severity == "critical" and not incident.open
    assert "entries 2…2 were removed" in incident.located
    assert "restored version(s) [2]" in incident.action
    with PolicyStore(home.policies) as store:
        assert store.verify().ok and store.version() == 2
    alerts = read_alerts(home.root / "alerts" / "alerts.jsonl")
    assert [(a["kind"], a["severity"], a["channel"]) for a in alerts] == [
        ("incident", "critical", "page"), ("incident_recovered", "info", "mail"),
    ]  # fmt: skip
    assert bool(list(tmp_path.glob("*.sqlite"))) == isinstance(location, Path)  # Postgres: no control-plane file


def test_a_day_in_celsius_is_held_back_located_through_lineage_and_recovered_when_delivered_again(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome(tmp_path)
    now = datetime(2013, 4, 3, 13, tzinfo=UTC)
    zone = LandingZone(home.landing, FLIGHTS)
    zone.deliver(now, first_day=date(2013, 3, 25))
    SimClock(home.clock).start(now)
    bad_day = date(2013, 4, 3)  # weather of April 3 is due April 4 06:00: delivered early, in °C
    write_parquet_atomic(
        FLIGHTS.drills.unit_change.apply(_day_rows("weather", bad_day)), zone.path("weather", bad_day)
    )
    with dg.instance_for_test() as instance:
        first = sensor_tick("flights_landing_sensor", tmp_path, instance)
        april = [r.run_key for r in first.run_requests if r.partition_key == "2013-04"]
        assert april == ["landing:2013-04:2-2"]  # April is built once, without the day held back
        with IncidentLog(home.incidents) as log:
            incident = log.get("delivery:flights:weather:2013-04-03")
        # stamped with the simulated clock, which runs on while the tick works (on a busy machine past midnight)
        assert incident.open and now <= datetime.fromisoformat(incident.detected_at) <= SimClock(home.clock).now()
        assert incident.located.startswith(
            "delivery weather/2013-04-03 → flights/raw_weather.dewp, flights/raw_weather.temp"
        )
        assert "dewpoint_not_above_temp" in incident.located and "flight_features.temp" in incident.located
        # the genuine day arrives when it is due; the next tick admits it and the incident is recovered
        zone.deliver(datetime(2013, 4, 4, 7, tzinfo=UTC), first_day=date(2013, 3, 25))
        second = sensor_tick("flights_landing_sensor", tmp_path, instance, first.cursor)
        assert "landing:2013-04:2-3" in [r.run_key for r in second.run_requests]
    with IncidentLog(home.incidents) as log:
        incident = log.get("delivery:flights:weather:2013-04-03")
    assert not incident.open and "delivered again and admitted" in incident.action
    [alert] = read_alerts(home.root / "alerts" / "alerts.jsonl")
    assert (alert["kind"], alert["severity"], alert["channel"]) == ("contract_breach", "warning", "chat")


def test_the_incidents_asset_shows_each_timeline(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome(tmp_path)
    with IncidentLog(home.incidents) as log:
        log.open_incident("runtime:42", "runtime_crash", "critical", "tritonserver died",
                          injected_at="2013-04-05T10:00:00+00:00", detected_at="2013-04-05T10:00:01+00:00",
                          acted_at="2013-04-05T10:00:01+00:00", recovered_at="2013-04-05T10:00:09+00:00",
                          located="the model runtime: tritonserver exited with -9", requests_failed=3,
                          requests_degraded=0)  # fmt: skip
    from assets.incidents import incidents

    result = dg.materialize([incidents], resources=keel_resources(tmp_path))
    meta = result.asset_materializations_for_node("incidents")[0].metadata
    assert meta["incidents"].value == 1 and meta["open"].value == 0 and meta["drills"].value == 1
    [row] = meta["table"].value.records
    assert row.data["key"] == "runtime:42" and row.data["requests_failed"] == 3
    assert "**recovered** 2013-04-05T10:00:09+00:00 (+8 s)" in meta["timeline"].value


def test_a_commit_landing_while_verify_reads_is_not_a_truncation(store_with_commits, monkeypatch):
    """The watchdog verifies beside writers: a commit that lands between verify's reads (here: right after it read
    the log) must not look like removed newest commits — verify reads the published head before the log."""
    with PolicyStore(store_with_commits) as store, PolicyStore(store_with_commits) as writer:
        real_log = PolicyStore.log

        def log_then_a_commit(self):
            commits = real_log(self)
            if self is store:
                writer.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="meanwhile")
            return commits

        monkeypatch.setattr(PolicyStore, "log", log_then_a_commit)
        result = store.verify()
    assert result.ok, result.problems


def test_a_day_a_run_held_back_first_is_still_an_incident_at_the_next_tick(tmp_path, monkeypatch):
    """The raw assets run the gate too (a run never reads an unchecked day): when a monthly run meets the bad day
    first and holds it back, the landing sensor's next tick finds the verdict and opens the incident all the same."""
    from keel.data.delivery import DeliveryGate

    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    home = KeelHome(tmp_path)
    now = datetime(2013, 4, 3, 13, tzinfo=UTC)
    zone = LandingZone(home.landing, FLIGHTS)
    zone.deliver(now, first_day=date(2013, 4, 1))
    SimClock(home.clock).start(now)
    write_parquet_atomic(
        FLIGHTS.drills.unit_change.apply(_day_rows("weather", date(2013, 4, 3))),
        zone.path("weather", date(2013, 4, 3)),
    )
    assert [v.ok for v in DeliveryGate(zone).check_new(["weather"], "2013-04")].count(False) == 1  # the run's gate
    with dg.instance_for_test() as instance:
        sensor_tick("flights_landing_sensor", tmp_path, instance)
    with IncidentLog(home.incidents) as log:
        [incident] = log.list()
    assert incident.key == "delivery:flights:weather:2013-04-03" and incident.open and "dewpoint" in incident.located


def test_the_traffic_during_a_drill_is_the_difference_of_two_snapshots():
    from keel.chaos_watch import traffic_delta

    before = {"answered": 1000, "failed": 0, "degraded_answers": 250, "by_status": {"200": 1000}, "by_error": {},
              "by_degraded": {"frozen:dep_delay_mean": 250}, "versions": {"3": 1000}}  # fmt: skip
    after = {"answered": 1100, "failed": 7, "degraded_answers": 290,
             "by_status": {"200": 1093, "503": 7}, "by_error": {"runtime_unavailable": 7},
             "by_degraded": {"frozen:dep_delay_mean": 260, "coarse_fallback": 30}, "versions": {"3": 1063,
             "coarse v2": 30}}  # fmt: skip
    assert traffic_delta(before, after) == {
        "answered": 100, "failed": 7, "degraded": 40, "baseline_degraded_share": 0.25,
        "by_status": {"200": 93, "503": 7}, "by_error": {"runtime_unavailable": 7},
        "by_degraded": {"frozen:dep_delay_mean": 10, "coarse_fallback": 30}, "versions": {"3": 63, "coarse v2": 30},
    }  # fmt: skip
    assert traffic_delta(None, after) is None  # no live traffic: nothing to say


@pytest.mark.parametrize(
    ("traffic", "why"),
    [
        (None, "no traffic met the drill"),
        ({"answered": 0, "failed": 0, "by_status": {}, "by_error": {}, "by_degraded": {}}, "no traffic met the drill"),
        ({"answered": 400, "failed": 0, "by_status": {"200": 400}, "by_error": {}, "by_degraded": {}},
         "met the outage"),
        ({"answered": 40, "failed": 3, "by_status": {"200": 37, "502": 3},
          "by_error": {"backend_error": 3}, "by_degraded": {"runtime_unavailable": 5, "coarse_fallback": 5}}, ""),
        ({"answered": 40, "failed": 20, "by_status": {"200": 20, "503": 20},
          "by_error": {"runtime_unavailable": 20}, "by_degraded": {"runtime_unavailable": 1}}, ""),
    ],
)  # fmt: skip
def test_the_runtime_drills_traffic_check_fails_on_a_drill_that_met_no_traffic_or_failed_requests(traffic, why):
    """The slow drills' own check (tests/test_live_drills.py), on the planted defects: a drill with no traffic, one
    whose traffic never met the outage, ones that failed requests. Each fails; the genuine shape passes."""
    from tests.test_live_drills import assert_served_through_the_outage

    with pytest.raises(AssertionError, match=why):
        assert_served_through_the_outage(traffic, "runtime_unavailable")
    genuine = {"answered": 400, "failed": 0, "by_status": {"200": 400}, "by_error": {},
               "by_degraded": {"runtime_unavailable": 20, "coarse_fallback": 20}}  # fmt: skip
    assert_served_through_the_outage(genuine, "runtime_unavailable")


def test_a_drill_over_in_a_moment_waits_for_the_live_traffic_to_meet_it(tmp_path):
    """A busy machine holds the clock, and the replay's traffic, while the pipeline catches up: a drill recovered in
    under a second may find the traffic's totals unchanged. Its report waits (bounded) until the replay has answered
    a request since the drill began — the event, not a fixed sleep — so the traffic it reports met the drill."""
    import threading

    from keel.chaos_watch import Injection, watch
    from keel.home import KeelHome
    from keel.incidents import IncidentLog

    home = KeelHome.of(tmp_path)
    totals = home.serving.live_traffic("flights")
    totals.parent.mkdir(parents=True, exist_ok=True)
    before = {"answered": 500, "failed": 0, "by_status": {"200": 500}}
    totals.write_text(json.dumps(before))
    with IncidentLog(home.incidents) as log:  # the platform recovered at once
        log.open_incident("drill:x", "runtime_crash", "critical", "a drill", acted_at="t", recovered_at="t")

    def the_replay_resumes():  # 10 s after the drill: later than the 6 s a report used to wait
        time.sleep(10)
        totals.write_text(json.dumps({"answered": 530, "failed": 0, "by_status": {"200": 530}}))

    threading.Thread(target=the_replay_resumes, daemon=True).start()
    result = watch(home, Injection("x", "drill:x", "a drill", "2013-04-02T00:00:00"), 60, before)
    assert result.traffic["answered"] == 30 and result.traffic["failed"] == 0
