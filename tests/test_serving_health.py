"""What actually answered (keel/serving_health.py): every request ends one of four ways, counted per model and day,
and a day is judged against the model's tier — a day the coarse model answered for a broken runtime is a breach
even though every status was 200."""

from __future__ import annotations

from datetime import UTC, datetime

from keel.policies.gateway import DEFAULT_TIERS
from keel.serving_health import UNROUTED, breaker_open_seconds, day_health, outcome

MAY_1 = datetime(2013, 5, 1, 12, tzinfo=UTC).timestamp()
L2 = DEFAULT_TIERS["L2"]  # p99 50 ms, availability 99.5 %


def scored(i: int, version: int = 3, ms: float = 4.0, model: str = "flight-delay") -> dict:
    return {"ts": MAY_1 + i, "status": 200, "model": model, "model_version": version, "latency_ms": ms}


def coarse(i: int) -> dict:
    return {"ts": MAY_1 + i, "status": 200, "model": "flight-delay", "model_version": None, "variant": "coarse",
            "degraded": ["breaker_open", "coarse_fallback"], "latency_ms": 2.0}  # fmt: skip


def test_each_request_ends_one_way():
    assert [outcome(r) for r in (scored(0), coarse(1))] == ["scored", "coarse"]
    assert outcome({"status": 200, "model_version": None, "score": 0.2}) == "last_resort"
    assert outcome({"status": 504, "error": "deadline_exceeded"}) == "failed"


def test_a_healthy_day_meets_its_tier():
    [day] = day_health([scored(i, version=3 if i % 4 else 4) for i in range(1000)])
    assert (day.model, day.day, day.requests, day.scored) == ("flight-delay", "2013-05-01", 1000, 1000)
    assert day.versions == {3: 750, 4: 250} and day.breaches(L2) == []
    assert day.as_row()["versions"] == "v3: 75.0%, v4: 25.0%" and day.p99_ms == 4.0


def test_the_breakers_open_time_is_each_stretch_of_open_answers_to_the_next_closed_request():
    records = [scored(0), coarse(10), coarse(20), scored(70), coarse(100), scored(101), coarse(500), coarse(530)]
    assert breaker_open_seconds(list(reversed(records))) == (70 - 10) + (101 - 100) + (530 - 500)  # any order
    assert breaker_open_seconds([scored(i) for i in range(5)]) == 0.0


def test_a_day_answered_by_the_fallback_is_a_breach_though_every_status_was_200():
    records = [scored(i) for i in range(850)] + [coarse(1000 + i) for i in range(120)]
    records += [{"ts": MAY_1 + 2000 + i, "status": 504, "model": "flight-delay", "error": "deadline_exceeded",
                 "latency_ms": 300.0} for i in range(30)]  # fmt: skip
    [day] = day_health(records)
    assert (day.scored, day.coarse, day.failed, day.breaker_open) == (850, 120, 30, 120)
    assert day.errors == {"deadline_exceeded": 30}
    why = day.breaches(L2)
    assert len(why) == 3, why
    assert why[0] == "the model answered 85.0% of 1,000 requests, below the tier's availability 99.5%"
    assert why[1].startswith(
        "12.0% answered by a fallback (coarse 120, last resort 0; breaker open on 120, for 1,000 s)"
    )
    assert day.breaker_open_s == 1000.0  # open from its first coarse answer (1000) to the next request not (2000)
    assert why[2] == "30 requests failed (deadline_exceeded 30)"
    assert day.as_row()["coarse_share"] == 0.12 and day.as_row()["failed_share"] == 0.03


def test_slow_answers_breach_the_p99_and_days_and_models_are_apart():
    records = [scored(i, ms=80.0 if i % 50 == 0 else 5.0) for i in range(200)]
    records += [scored(86400 + i, model="room-price") for i in range(10)]
    records += [{"ts": MAY_1 + 5, "status": 422, "error": "invalid_input"}]  # refused before a model was known
    days = {(d.model, d.day): d for d in day_health(records)}
    assert set(days) == {("flight-delay", "2013-05-01"), ("room-price", "2013-05-02"), (UNROUTED, "2013-05-01")}
    assert days[("flight-delay", "2013-05-01")].breaches(L2) == ["p99 80.0 ms above the tier's 50 ms"]
    assert days[(UNROUTED, "2013-05-01")].errors == {"invalid_input": 1}


def test_the_asset_fails_its_check_and_opens_an_incident_for_a_degraded_day_and_closes_it_when_healthy(tmp_path):
    """serving_health materialized (the real asset, its check, the real incident log) on a home whose exposure log
    has a day the coarse model answered a tenth of (the breaker open) and some requests timed out, then a healthy day."""
    import dagster as dg

    from assets.serving_health import SERVING_OBJECTIVE, serving_health
    from keel.exposure_log import ExposureLog
    from keel.home import KeelHome
    from keel.incidents import IncidentLog
    from resources import keel_resources
    from sensors.metering import metering_run

    home = KeelHome.of(tmp_path)
    log = ExposureLog(home.serving.exposures)
    planted = [scored(i) for i in range(850)] + [coarse(1000 + i) for i in range(120)]
    planted += [{"ts": MAY_1 + 2000 + i, "status": 504, "model": "flight-delay", "error": "deadline_exceeded",
                 "latency_ms": 300.0} for i in range(30)]  # fmt: skip
    for r in planted + [scored(86400 + i) for i in range(500)]:  # May 2: every request scored by the model
        assert log.append(r)
    log.close()

    def run(day: str):
        result = dg.materialize([serving_health], partition_key=day, resources=keel_resources(home.root))
        [check] = result.get_asset_check_evaluations()
        [mat] = result.get_asset_materialization_events()
        return check, {k: v.value for k, v in mat.materialization.metadata.items()}

    check, meta = run("2013-05-01")
    assert check.check_name == SERVING_OBJECTIVE and check.passed is False
    assert meta["requests"] == 1000 and meta["degraded_models"] == 1 and meta["scored_share"] == 0.85
    why = check.metadata["why"].value
    assert (
        "flight-delay 2013-05-01" in why and "12.0% answered by a fallback" in why and "deadline_exceeded 30" in why
    )
    with IncidentLog(home.incidents) as incidents:
        [incident] = incidents.open_incidents("degraded_serving")
    assert incident.key == "degraded_serving:flight-delay:2013-05-01" and incident.requests_failed == 30
    assert incident.requests_degraded == 120 and "below the tier's availability" in incident.located
    check, meta = run("2013-05-02")
    assert check.passed is True and meta["degraded_models"] == 0
    with IncidentLog(home.incidents) as incidents:
        assert incidents.open_incidents("degraded_serving") == []
        closed = incidents.get("degraded_serving:flight-delay:2013-05-01")
    assert closed.recovered_at and closed.action == "served as its tier promises again on 2013-05-02"
    # one run over both days (as the metering sensor launches them): each day's partition shows its own numbers
    both = dg.materialize([serving_health], resources=keel_resources(home.root),
                          tags=dict(metering_run(["2013-05-01", "2013-05-02"]).tags))  # fmt: skip
    per_day = {
        e.partition: {k: v.value for k, v in e.materialization.metadata.items()}
        for e in both.get_asset_materialization_events()
    }
    assert [per_day[d]["requests"] for d in ("2013-05-01", "2013-05-02")] == [1000, 500]
    assert [per_day[d]["degraded_models"] for d in ("2013-05-01", "2013-05-02")] == [1, 0]
    assert per_day["2013-05-01"]["missed"].startswith(
        "- **flight-delay**: the model answered 85.0% of 1,000 requests"
    )
    assert per_day["2013-05-02"]["missed"] == "every model met its tier"
    assert [per_day[d]["dagster/row_count"] for d in ("2013-05-01", "2013-05-02")] == [1, 1]  # a model each day
    assert per_day["2013-05-02"]["run_days"] == "2013-05-01 … 2013-05-02 (2 days)"
    [check] = both.get_asset_check_evaluations()
    assert check.passed is False and check.metadata["days_missed"].value == 1
