"""The incident log: one record per fault (by key), its timeline filled in as the platform acts, kept durably."""

from __future__ import annotations

import pytest

from keel.incidents import IncidentLog


def test_one_record_per_fault_filled_in_as_it_goes(location):
    """On each backend: a SQLite file, the control plane's Postgres schema."""
    with IncidentLog(location) as log:
        first = log.open_incident(
            "delivery:weather:2013-07-14", "unit_change", "critical", "temperature in °C",
            injected_at="2013-07-15T06:00:00+00:00", detected_at="2013-07-15T06:10:00+00:00",
        )  # fmt: skip
        assert first.open and first.located is None
        # the next tick locates and acts; a duplicate tick repeats it: still one record, nothing cleared
        for _ in range(2):
            log.open_incident(
                "delivery:weather:2013-07-14", "unit_change", "critical", "temperature in °C",
                located="raw_weather.temp (contract weather, delivery 2013-07-14)", action="quarantined the day",
                acted_at="2013-07-15T06:20:00+00:00", recovered_at="2013-07-15T06:20:00+00:00",
                requests_failed=0, requests_degraded=12, details={"rows": 72},
            )  # fmt: skip
    with IncidentLog(location) as log:  # durable: read back by a new connection
        [incident] = log.list()
    assert incident.injected_at == "2013-07-15T06:00:00+00:00" and incident.detected_at == "2013-07-15T06:10:00+00:00"
    assert not incident.open and incident.requests_degraded == 12 and incident.details == {"rows": 72}


def test_an_unknown_field_is_refused_by_name(tmp_path):
    with IncidentLog(tmp_path / "i.sqlite") as log, pytest.raises(ValueError, match="cause"):
        log.open_incident("k", "x", "info", "y", cause="z")


def test_what_users_felt_is_counted_from_the_exposure_log_within_the_incident(tmp_path):
    from datetime import UTC, datetime

    from keel.exposure_log import ExposureLog
    from keel.incidents import requests_during

    t0 = datetime(2013, 4, 5, 10, tzinfo=UTC).timestamp()
    log = ExposureLog(tmp_path)
    for i, (status, degraded) in enumerate(
        [(200, None), (503, None), (200, ["runtime_unavailable"]), (200, []), (503, None), (200, ["x"])]
    ):
        log.append({"ts": t0 + 10 * i, "status": status, "degraded": degraded})  # one every 10 s
    log.close()
    # 10:00:05–10:00:45 holds requests 1–4: two 503s failed, one degraded answer
    assert requests_during(tmp_path, "2013-04-05T10:00:05+00:00", "2013-04-05T10:00:45+00:00") == (2, 1)
    assert requests_during(tmp_path, "2013-04-06T10:00:00+00:00", "2013-04-06T11:00:00+00:00") == (0, 0)


def test_each_incident_belongs_to_its_use_case_or_the_platform(tmp_path):
    """Named from its details, its source sensor or its key's parts — a delivery of a use case, a canary or a
    degraded day of its model — and the incidents asset lists each use case's together in its own simulated time."""
    import dagster as dg

    from assets.incidents import incidents
    from keel.incidents import PLATFORM, usecase_of
    from resources import keel_resources

    names = {"flights": "flights", "flight-delay": "flights", "hotels": "hotels", "room-price": "hotels"}
    with IncidentLog(tmp_path / "incidents.sqlite") as log:
        log.open_incident("degraded_serving:room-price:2017-01-05", "degraded_serving", "critical", "slow",
                          detected_at="2017-01-06T00:00:00+00:00")  # fmt: skip
        log.open_incident("canary:flight-delay.loop-v6", "canary_rollback", "warning", "rolled back",
                          detected_at="2013-06-20T12:00:00+00:00")  # fmt: skip
        log.open_incident("delivery:flights:2013-04-05", "delivery_held_back", "critical", "held",
                          source="flights_landing_sensor", detected_at="2013-04-06T12:00:00+00:00")  # fmt: skip
        log.open_incident("runtime:restart:1", "runtime_restarted", "critical", "restarted",
                          detected_at="2026-12-05T10:00:00+00:00")  # fmt: skip
        owners = {i.key: usecase_of(i, names) for i in log.list()}
    assert owners == {"degraded_serving:room-price:2017-01-05": "hotels", "canary:flight-delay.loop-v6": "flights",
                      "delivery:flights:2013-04-05": "flights", "runtime:restart:1": PLATFORM}  # fmt: skip
    [mat] = dg.materialize([incidents], resources=keel_resources(tmp_path)).get_asset_materialization_events()
    rows = [(r.data["usecase"], r.data["key"]) for r in mat.materialization.metadata["table"].value.records]
    # flights (installed) before the platform; hotels' model is installed too when its package is
    assert rows.index(("flights", "delivery:flights:2013-04-05")) < rows.index(
        ("flights", "canary:flight-delay.loop-v6")
    )
    assert ("platform", "runtime:restart:1") in rows


def test_a_held_back_delivery_that_will_not_come_again_is_resolved_by_hand(tmp_path, monkeypatch):
    """Issue 49: a held-back delivery's incident stayed open forever when the day was never sent again. `keel
    incidents resolve` closes it, saying who and why, at the replay's time; twice, or without a reason, is refused."""
    import subprocess
    import sys

    from tests import REPO

    home = tmp_path / "home"
    home.mkdir()
    key = "delivery:rides:trips:2024-03-05"
    with IncidentLog(home / "incidents.sqlite") as log:
        log.open_incident(key, "delivery_held_back", "warning", "trips delivery of 2024-03-05 held back",
                          action="held back before its month read it", detected_at="2024-03-06T08:00:00+00:00")  # fmt: skip

    def keel(*argv):
        return subprocess.run([sys.executable, "-m", "keel.cli", "incidents", *argv], capture_output=True, text=True,
                              cwd=REPO, env={"KEEL_HOME": str(home), "PATH": "/usr/bin:/bin", "USER": "ops"})  # fmt: skip

    assert keel("resolve", key).returncode == 2  # --reason is required
    done = keel("resolve", key, "--reason", "the upstream will not resend it: waived")
    assert done.returncode == 0, done.stderr
    with IncidentLog(home / "incidents.sqlite") as log:
        incident = log.get(key)
    assert not incident.open and incident.action.endswith("resolved by ops: the upstream will not resend it: waived")
    again = keel("resolve", "#1", "--reason", "twice")
    assert again.returncode == 2 and "nothing to resolve" in again.stderr
    assert keel("resolve", "delivery:rides:trips:1999-01-01", "--reason", "x").returncode == 2  # no such incident
    assert "(recovered)" in keel().stdout
