"""The gateway's decisions with a hand-driven clock: breaker, rate limit, retry budget, sticky routing, policy."""

from __future__ import annotations

import pytest

from gpu_runtime.gateway.control import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    CircuitBreaker,
    RetryBudget,
    TokenBucket,
    Weighted,
    pick_weighted,
    sticky_bucket,
)
from keel.policies.gateway import BreakerPolicy, GatewayPolicy, PolicyError, RateLimit, RetryPolicy


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_breaker_needs_enough_requests_and_a_high_enough_error_rate():
    clock = Clock()
    b = CircuitBreaker(BreakerPolicy(error_rate=0.05, window_s=5, min_requests=20, open_s=30), clock)
    for _ in range(19):
        b.record(False)  # 19 failures, but fewer than min_requests
    assert b.state == CLOSED
    b.record(True)
    assert b.state == OPEN  # 19/20 failed > 5 %
    c = CircuitBreaker(BreakerPolicy(error_rate=0.05, window_s=5, min_requests=20), clock)
    for i in range(100):
        c.record(i != 0)  # 1 % errors
    assert c.state == CLOSED


def test_old_events_leave_the_window():
    clock = Clock()
    b = CircuitBreaker(BreakerPolicy(error_rate=0.05, window_s=5, min_requests=20), clock)
    for _ in range(10):
        b.record(False)
    clock.t += 6  # those failures are older than the window now
    for _ in range(20):
        b.record(True)
    assert b.state == CLOSED and b.error_rate() == 0.0


def test_open_then_half_open_probes_then_closed_or_open_again():
    clock = Clock()
    b = CircuitBreaker(BreakerPolicy(min_requests=5, open_s=30, half_open_probes=3), clock)
    for _ in range(5):
        b.record(False)
    assert b.state == OPEN and not b.allow()
    clock.t += 29.9
    assert not b.allow()
    clock.t += 0.2
    assert [b.allow() for _ in range(4)] == [True, True, True, False]  # 3 probes, no more
    assert b.state == HALF_OPEN
    b.record(True)
    b.record(False)  # one probe fails: open again, for another open_s
    assert b.state == OPEN and not b.allow()
    clock.t += 31
    assert b.allow() and b.allow() and b.allow()
    for _ in range(3):
        b.record(True)
    assert b.state == CLOSED and b.allow()
    assert [s for _, s in b.transitions] == [OPEN, HALF_OPEN, OPEN, HALF_OPEN, CLOSED]


def test_token_bucket_admits_burst_then_rate():
    clock = Clock()
    bucket = TokenBucket(RateLimit(rps=10, burst=5), clock)
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    clock.t += 0.1  # one token back
    assert bucket.take() and not bucket.take()
    clock.t += 100  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 5


def test_retry_budget_caps_retries_against_requests():
    clock = Clock()
    budget = RetryBudget(RetryPolicy(budget_ratio=0.1, budget_min_per_s=0.1), clock)  # floor: 1 per 10 s
    for _ in range(100):
        budget.on_request()
    assert sum(budget.try_retry() for _ in range(50)) == 10
    clock.t += 11  # the window moved on: the floor only
    assert sum(budget.try_retry() for _ in range(50)) == 1


def test_sticky_routing_is_stable_and_follows_the_weights():
    options = [Weighted("champion", 0.9), Weighted("challenger", 0.1)]
    units = [f"unit-{i}" for i in range(20_000)]
    first = [pick_weighted(options, u, "m") for u in units]
    assert first == [pick_weighted(options, u, "m") for u in units]  # same unit, same answer
    share = first.count("challenger") / len(units)
    assert 0.09 < share < 0.11
    assert pick_weighted([Weighted("a", 1), Weighted("b", 0)], "x") == "a"
    with pytest.raises(ValueError):
        pick_weighted([Weighted("a", 0)], "x")
    # Different salts (experiments) place the same unit independently.
    moved = sum((sticky_bucket(u, "exp-1") < 0.5) != (sticky_bucket(u, "exp-2") < 0.5) for u in units)
    assert 0.45 < moved / len(units) < 0.55


def test_policy_errors_name_the_field():
    with pytest.raises(PolicyError, match=r"policy\.breaker\.open_s must be a non-negative number"):
        GatewayPolicy.from_dict({"breaker": {"open_s": "soon"}})
    with pytest.raises(PolicyError, match=r"unknown field policy\.breker"):
        GatewayPolicy.from_dict({"breker": {}})
    with pytest.raises(PolicyError, match="unknown tier L9"):
        GatewayPolicy.from_dict({"model_tiers": {"flight-delay": "L9"}})
    with pytest.raises(PolicyError, match="invalid_input must be reject or default"):
        GatewayPolicy.from_dict({"invalid_input": "ignore"})
    p = GatewayPolicy.from_dict(
        {"lanes": {"1": 4, "3": 2}, "model_tiers": {"flight-delay": "L1"}, "route_timeout_ms": {"challenger": 40}}
    )
    assert p.lanes == {1: 4, 3: 2} and p.tier_of("flight-delay").p99_ms == 15.0
    # a model the policy does not name is in the tier its use case declares; the policy's word wins over it
    assert p.tier_name("room-rate", "L1") == "L1" and p.tier_of("room-rate", "L3").p99_ms == 250.0
    assert p.tier_name("flight-delay", "L3") == "L1" and GatewayPolicy().tier_name("room-rate") == "L2"
    assert p.route_timeout_ms == {"challenger": 40.0}
    with pytest.raises(PolicyError, match="route_timeout_ms maps route names to milliseconds"):
        GatewayPolicy.from_dict({"route_timeout_ms": {"challenger": "fast"}})
    with pytest.raises(PolicyError, match="admit_in_flight maps tiers to in-flight limits"):
        GatewayPolicy.from_dict({"admit_in_flight": {"L1": "many"}})
    with pytest.raises(PolicyError, match="admit_wait_ms must be non-negative for every tier"):
        GatewayPolicy.from_dict({"admit_wait_ms": {"L2": -5}})
    tiers = GatewayPolicy.from_dict({"admit_in_flight": {"L1": 8, "L2": 4, "L3": 1}, "admit_wait_ms": {"L3": 0}})
    assert tiers.admit_in_flight == {"L1": 8, "L2": 4, "L3": 1} and tiers.admit_wait_ms == {"L3": 0.0}
    assert GatewayPolicy.from_dict(p.to_dict()) == p


def test_the_newest_applicable_split_is_in_force():
    """A finished canary's split stays in the store; the next canary's split supersedes it, and a split to a version
    that is not deployed is skipped with a note — the other policies still apply."""
    from keel.policies import Policy
    from keel.policies.gateway import effective_policy

    def split(name, version, weights):
        variants = [{"name": f"v{v}", "version": v, "weight": w} for v, w in weights.items()]
        return Policy(name, "ab_test", {"model": "m", "variants": variants}, version)

    breaker = {"error_rate": 0.3, "window_s": 5, "min_requests": 10, "open_s": 2, "half_open_probes": 3}
    policies = {
        "a.split": split("a.split", 3, {1: 0.0, 2: 1.0}),  # finished: model 2 promoted
        "b.split": split("b.split", 7, {2: 0.9, 3: 0.1}),  # the rollout of model 3, newer
        "breaker": Policy("breaker", "circuit_breaker", breaker, 5),
    }
    policy, split, notes = effective_policy(GatewayPolicy(), policies, "m", {2, 3}, 7)
    assert split.weights == {2: 0.9, 3: 0.1} and notes == [] and policy.breaker.error_rate == 0.3
    assert split.salt == "b.split"  # the split's own salt (its name when the body names none)
    policy, split, notes = effective_policy(GatewayPolicy(), policies, "m", {1, 2}, 7)  # 3 not deployed yet
    assert split.weights == {1: 0.0, 2: 1.0} and "b.split" in notes[0] and "[3]" in notes[0]
    assert policy.breaker.error_rate == 0.3
    _, split, notes = effective_policy(GatewayPolicy(), policies, "m", {4}, 7)  # neither applies
    assert split is None and len(notes) == 2
    _, split, _ = effective_policy(GatewayPolicy(), policies, "other-model", {1, 2, 3}, 7)
    assert split is None


def test_a_committed_policy_of_a_retired_type_is_skipped_with_a_note():
    """A store written before feature_freeze was retired still holds one: gateways skip it, say so, and apply the
    rest (refusing the whole store would keep them on an old policy forever)."""
    from keel.policies import Policy
    from keel.policies.gateway import effective_policy

    breaker = {"error_rate": 0.3, "window_s": 5, "min_requests": 10, "open_s": 2, "half_open_probes": 3}
    policies = {
        "breaker": Policy("breaker", "circuit_breaker", breaker, 2),
        "freeze": Policy("freeze", "feature_freeze", {"features": {"wind_speed": {"frozen": True}}}, 1),
    }
    policy, _, notes = effective_policy(GatewayPolicy(), policies, "m", {1}, 2)
    assert policy.breaker.error_rate == 0.3
    assert len(notes) == 1 and "freeze" in notes[0] and "retired" in notes[0]


def test_metric_label_values_cannot_add_lines_to_the_exposition():
    from gpu_runtime.gateway.metrics import Metrics

    m = Metrics()
    m.inc("keel_gateway_rate_limited_total", {"tenant": 'a"b\\c\nkeel_fake 1'})
    lines = [ln for ln in m.render().splitlines() if not ln.startswith("#")]
    assert lines == ['keel_gateway_rate_limited_total{tenant="a\\"b\\\\c\\nkeel_fake 1"} 1']


def test_per_tenant_state_is_bounded_whatever_names_callers_invent(tmp_path):
    """Tenants the policy names keep their own bucket; every other name shares a bounded LRU of buckets."""
    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from keel.policies.gateway import RateLimit

    policy = GatewayPolicy(tenant_rate_limits={"ops": RateLimit(5, 5)})
    config = GatewayConfig(
        triton_url="127.0.0.1:1", routing_path=tmp_path / "routing.json", usecase="flights", exposure_dir=tmp_path / "exp",
        max_tenant_buckets=100,
    )  # fmt: skip
    model = Gateway(config, policy).model()
    for i in range(5000):
        model.bucket(f"invented-{i}").take()
    assert len(model.other_buckets) == 100 and list(model.buckets) == []
    ops = model.bucket("ops")
    assert [ops.take() for _ in range(6)] == [True] * 5 + [False]  # the named tenant's own limit
    assert model.bucket("ops") is ops and list(model.buckets) == ["ops"]


def test_the_record_paths_cast_cache_is_bounded_in_bytes():
    from keel.contracts.record import ByteBoundedCache

    cache = ByteBoundedCache(max_bytes=64 * 1024, max_value_chars=256)
    for i in range(10_000):
        cache.get((f"{i:0200d}", str, "int64", None), lambda: 1)
    assert cache.bytes <= 64 * 1024 and 0 < len(cache) < 10_000
    cache.get(("x" * 900_000, str, "utf8", None), lambda: "x")  # a huge value is computed, never kept
    assert cache.bytes <= 64 * 1024
    calls = []
    for _ in range(3):
        cache.get(("13", str, "int64", None), lambda: calls.append(1) or 13)
    assert calls == [1]  # small repeated values are memoised


def test_while_the_runtime_is_down_the_answer_is_structured_or_the_configured_last_resort(tmp_path):
    """No Triton needed: the supervisor's status says down. Without a last resort the answer is 503
    runtime_unavailable; with one it is that score, flagged, and logged with a null model version."""
    import asyncio
    import json

    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from gpu_runtime.supervisor import DOWN, RuntimeStatus
    from keel.deploy.routing import Route, RoutingTable
    from keel.exposure_log import read_exposures

    table = RoutingTable(1, "flight-delay", 3, (Route("champion", 1, "a" * 64, 1.0),))
    (tmp_path / "routing.json").write_text(json.dumps(table.to_dict()))
    config = GatewayConfig(triton_url="127.0.0.1:1", routing_path=tmp_path / "routing.json", usecase="flights",
                           exposure_dir=tmp_path / "exposures")  # fmt: skip
    down = RuntimeStatus(state=DOWN, last_failure="tritonserver exited with -9")
    body = json.dumps({"features": {}, "unit_id": "u1"}).encode()
    status, payload, _ = asyncio.run(Gateway(config, runtime=down).predict(body, {}))
    assert (
        status == 503
        and payload["error"]["code"] == "runtime_unavailable"
        and "exited" in payload["error"]["message"]
    )
    lenient = Gateway(config, GatewayPolicy(last_resort_score=0.2), runtime=down)
    status, payload, _ = asyncio.run(lenient.predict(body, {}))
    assert status == 200 and payload["score"] == 0.2 and payload["degraded"] == ["runtime_unavailable"]
    assert payload["model_version"] is None
    assert payload["confidence_score"] == 0.0  # a constant answers without knowing the request: no confidence
    lines = read_exposures(tmp_path / "exposures")
    assert [(e["status"], e["model_version"]) for e in lines] == [(503, None), (200, None)]
    with pytest.raises(PolicyError, match="last_resort_score must be a probability"):
        GatewayPolicy.from_dict({"last_resort_score": 3})


def test_a_triton_that_died_since_the_last_poll_is_runtime_unavailable_not_the_versions_fault(tmp_path):
    """Triton (127.0.0.1:1: nothing listens) fails the call; the supervisor's last poll said up, but its process has
    exited since. The answer is the structured runtime_unavailable, not backend_error, and the version's breaker
    counts no strike; once the supervisor has restarted Triton, the breakers and the gRPC channel start afresh."""
    import asyncio
    import json

    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from gpu_runtime.supervisor import RuntimeStatus
    from keel.deploy.routing import Route, RoutingTable

    table = RoutingTable(1, "flight-delay", 3, (Route("champion", 1, "a" * 64, 1.0),))
    (tmp_path / "routing.json").write_text(json.dumps(table.to_dict()))
    config = GatewayConfig(triton_url="127.0.0.1:1", routing_path=tmp_path / "routing.json", usecase="flights",
                           exposure_dir=tmp_path / "exposures")  # fmt: skip
    alive = {"yes": False}
    status_ = RuntimeStatus(process_alive=lambda: alive["yes"])  # up by the last poll, dead now
    gateway = Gateway(config, runtime=status_)
    scorer = gateway.model().scorer
    from usecases.flights.features import FEATURE_NAMES

    body = json.dumps({"features": dict.fromkeys(FEATURE_NAMES, 1.0), "unit_id": "u1"}).encode()
    status, payload, _ = asyncio.run(gateway.predict(body, {}))
    assert status == 503 and payload["error"]["code"] == "runtime_unavailable", payload
    assert "process has exited" in payload["error"]["message"]
    assert scorer.breaker(1).state == "closed" and not scorer.breaker(1)._events  # no strike
    alive["yes"] = True  # the process is there again (but still unreachable): now it is the version's failure
    status, payload, _ = asyncio.run(gateway.predict(body, {}))
    assert status == 502 and payload["error"]["code"] == "backend_error"
    before, channel = scorer.breaker(1), scorer._client
    assert before._failed >= 1 and channel is not None
    status_.restarts += 1  # the supervisor restarted Triton: breakers and the gRPC channel start afresh
    asyncio.run(gateway.predict(body, {}))
    assert scorer.breaker(1) is not before and scorer.breaker(1)._failed == len(scorer.breaker(1)._events)
    assert scorer._client is not None and scorer._client is not channel


def test_a_call_cut_off_just_before_the_process_is_seen_to_exit_is_still_the_runtimes(tmp_path):
    """A SIGKILL cuts the gRPC call off a few milliseconds before the process is reaped: the first look says alive.
    On a connection-level failure the gateway looks again (up to 0.2 s) before blaming the version."""
    import asyncio
    import itertools
    import json

    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from gpu_runtime.supervisor import RuntimeStatus
    from keel.deploy.routing import Route, RoutingTable
    from usecases.flights.features import FEATURE_NAMES

    table = RoutingTable(1, "flight-delay", 3, (Route("champion", 1, "a" * 64, 1.0),))
    (tmp_path / "routing.json").write_text(json.dumps(table.to_dict()))
    config = GatewayConfig(triton_url="127.0.0.1:1", routing_path=tmp_path / "routing.json", usecase="flights",
                           exposure_dir=tmp_path / "exposures")  # fmt: skip
    looks = itertools.count()
    gateway = Gateway(config, runtime=RuntimeStatus(process_alive=lambda: next(looks) < 2))  # exits on the 3rd look
    body = json.dumps({"features": dict.fromkeys(FEATURE_NAMES, 1.0), "unit_id": "u1"}).encode()
    status, payload, _ = asyncio.run(gateway.predict(body, {}))
    assert status == 503 and payload["error"]["code"] == "runtime_unavailable", payload
    assert not gateway.model().scorer.breaker(1)._events


def test_an_open_breaker_reads_half_open_on_metrics_once_its_time_is_up_with_no_traffic(tmp_path):
    """The breaker of a version no request reaches any more still says when it would let a probe through: /metrics
    shows half-open (1) once open_s has passed, not "open" (2) forever."""
    import json

    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from keel.deploy.routing import Route, RoutingTable

    table = RoutingTable(1, "flight-delay", 3, (Route("champion", 1, "a" * 64, 1.0),))
    (tmp_path / "routing.json").write_text(json.dumps(table.to_dict()))
    gateway = Gateway(GatewayConfig(triton_url="127.0.0.1:1", routing_path=tmp_path / "routing.json", usecase="flights",
                                    exposure_dir=tmp_path / "exposures"))  # fmt: skip
    clock = Clock()
    b = gateway.model().scorer.breakers[1] = CircuitBreaker(
        BreakerPolicy(min_requests=5, open_s=30, half_open_probes=3), clock
    )
    for _ in range(5):
        b.record(False)

    def gauge() -> str:
        [line] = [ln for ln in gateway.render_metrics().splitlines() if ln.startswith("keel_gateway_breaker_state")]
        return line.split()[-1]

    assert gauge() == "2"
    clock.t += 29.9
    assert gauge() == "2" and b.observed_state() == OPEN
    clock.t += 0.2  # no request came, but the next one would be a probe
    assert gauge() == "1" and b.observed_state() == HALF_OPEN
    assert b.state == OPEN  # reading the metric reserves no probe: the state moves on with the next request
    assert b.allow() and b.state == HALF_OPEN
