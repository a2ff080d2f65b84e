"""The request path's stages under the conditions that made the gateway collapse (issue 45), each on its own, through
the real gateway app (its ASGI interface, as uvicorn calls it) and the real gRPC client — no Triton needed:

- a request past its deadline does no work and is a fast structured 503 ``deadline_exceeded``;
- a request whose client has gone is dropped before any work (logged, nothing sent);
- a Triton call that times out counts against the version only when the process and the machine were not
  overloaded (``blame_timeout``'s table, and a real timeout against an endpoint that never answers);
- the coarse fallback of two models in fallback at once: each model's booster is loaded once, scored off the event
  loop.

(The admit stage's own tests: tests/serving/test_admit.py.) Triton stand-ins, both real sockets: 127.0.0.1:1 (nothing listens: every call fails at once) and ``silent_endpoint``
(accepts connections and never answers: every call runs into its timeout)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpu_runtime.gateway.app import Gateway
from gpu_runtime.gateway.overload import LoadSignals, blame_timeout
from keel.exposure_log import read_exposures
from tests.serving.asgi_gateway import FLIGHTS, HOTELS, Asgi, body_of, deploy


def test_a_request_past_its_deadline_does_no_work_and_is_a_fast_structured_503(tmp_path):
    gateway = Gateway(deploy(tmp_path, FLIGHTS, "127.0.0.1:1"))
    asgi = Asgi(gateway)
    timeout_s = gateway.model().timeout_ms() / 1000
    # it waited in the listen queue and for the event loop longer than its tier's timeout before the first stage
    status, payload, headers = asyncio.run(asgi.post("/v1/predict", body_of(FLIGHTS),
                                                     arrived=time.monotonic() - 2 * timeout_s))  # fmt: skip
    assert status == 503 and payload["error"]["code"] == "deadline_exceeded", payload
    assert payload["error"]["stage"] == "parse" and headers["retry-after"] == "1"
    assert not gateway.model().scorer.breakers  # Triton was never asked
    [line] = read_exposures(tmp_path / "exposures")
    assert (line["status"], line["error"], line["stage"]) == (503, "deadline_exceeded", "parse")
    # the line says where the time went: all of it before the gateway started (never admitted), the loop's state
    assert line["late"]["elapsed_ms"] >= 2 * timeout_s * 1000 and "admission_wait_ms" not in line["late"]
    assert {"loop_lag_ms", "loop_busy", "cpu_pressure"} <= set(line["late"])


def test_a_shorter_client_deadline_header_is_the_requests_deadline(tmp_path, silent_endpoint):
    gateway = Gateway(deploy(tmp_path, FLIGHTS, silent_endpoint))
    status, payload, _ = asyncio.run(
        Asgi(gateway).post("/v1/predict", body_of(FLIGHTS), headers={"x-keel-deadline-ms": "50"})
    )
    assert status in (502, 503), payload  # the hung Triton: no answer within the client's 50 ms
    longer, _, _ = asyncio.run(  # a longer one than the tier's timeout does not extend it
        Asgi(gateway).post("/v1/predict", body_of(FLIGHTS), headers={"x-keel-deadline-ms": "60000"})
    )
    status, payload, _ = asyncio.run(
        Asgi(gateway).post("/v1/predict", body_of(FLIGHTS), headers={"x-keel-deadline-ms": "soon"})
    )
    assert status == 400 and payload["error"]["code"] == "bad_header"
    lines = read_exposures(tmp_path / "exposures")
    assert [line["deadline_ms"] for line in lines] == [50, gateway.model().timeout_ms(), gateway.model().timeout_ms()]


def test_a_request_whose_client_has_gone_is_dropped_before_any_work(tmp_path):
    gateway = Gateway(deploy(tmp_path, FLIGHTS, "127.0.0.1:1"))
    status, _, _ = asyncio.run(Asgi(gateway).post("/v1/predict", body_of(FLIGHTS), gone=True))
    assert status == 0  # nothing was sent: nobody is there
    assert not gateway.model().scorer.breakers
    [line] = read_exposures(tmp_path / "exposures")
    assert (line["status"], line["error"]) == (499, "client_gone")


@pytest.mark.parametrize(
    ("signals", "waited_s", "local"),
    [
        (LoadSignals(), 0.0, False),  # an idle process and machine: the version was slow
        (LoadSignals(loop_lag_s=0.005), 0.01, False),  # a little lag, a short wait: still the version
        (LoadSignals(loop_lag_s=0.2), 0.0, True),  # the event loop could not keep up
        (LoadSignals(), 0.2, True),  # the request had spent two thirds of its budget before the call
        (LoadSignals(cpu_pressure=0.9), 0.0, True),  # Triton starved of CPU
        (LoadSignals(cpu_pressure=0.3), 0.0, False),  # some pressure, not a starved machine
    ],
)
def test_a_timeout_is_blamed_on_the_version_only_when_nothing_local_explains_it(signals, waited_s, local):
    blame = blame_timeout(signals, waited_s, budget_s=0.3, timeout_s=0.3 - waited_s)
    assert blame.local is local and blame.reason


def test_a_timeout_on_a_starved_machine_is_no_strike_while_the_same_timeout_on_an_idle_one_is(
    tmp_path, silent_endpoint
):
    body = body_of(FLIGHTS)
    idle = Gateway(deploy(tmp_path / "idle", FLIGHTS, silent_endpoint))
    idle.model().scorer.load = LoadSignals  # nothing busy
    status, payload, _ = asyncio.run(idle.predict(body, {}))
    # a slow model on an idle machine: the version's strike; the request itself ran out of time (503, Retry-After)
    assert status == 503 and payload["error"]["code"] == "deadline_exceeded", payload
    assert payload["error"]["version_timeout"] is True and "local overload" not in payload["error"]["message"]
    assert idle.model().scorer.breaker(1)._failed >= 1

    starved = Gateway(deploy(tmp_path / "starved", FLIGHTS, silent_endpoint))
    starved.model().scorer.load = lambda: LoadSignals(cpu_pressure=0.95)
    status, payload, headers = asyncio.run(starved.predict(body, {}))
    assert status == 503 and payload["error"]["code"] == "deadline_exceeded", payload
    assert "local overload" in payload["error"]["message"] and headers["retry-after"] == "1"
    assert not starved.model().scorer.breaker(1)._events  # no strike, no retry
    assert "keel_gateway_local_timeouts_total" in starved.render_metrics()


def test_a_local_timeout_is_answered_by_the_coarse_model_for_that_request_and_opens_no_breaker(
    tmp_path, silent_endpoint
):
    gateway = Gateway(deploy(tmp_path, FLIGHTS, silent_endpoint, coarse=True))
    gateway.model().scorer.load = lambda: LoadSignals(cpu_pressure=0.95)
    status, payload, _ = asyncio.run(gateway.predict(body_of(FLIGHTS), {}))
    assert status == 200 and payload["variant"] == "coarse", payload
    assert payload["degraded"] == ["coarse_fallback", "local_overload"] and payload["model_version"] is None
    assert not gateway.model().scorer.breaker(1)._events  # the next request tries Triton again


def test_a_call_that_runs_out_of_time_is_abandoned_not_cancelled(tmp_path, silent_endpoint):
    """Triton 2.51 crashes on a race between a request's cancellation and its completion (scoring.py): the gateway
    stops waiting for a late call but never cancels it — the call is still in flight after the request's answer, and
    the gauge says so."""
    gateway = Gateway(deploy(tmp_path, FLIGHTS, silent_endpoint, coarse=True))
    gateway.model().scorer.load = lambda: LoadSignals(cpu_pressure=0.95)

    async def answer_then_look():
        status, payload, _ = await gateway.predict(body_of(FLIGHTS), {})
        return status, payload, gateway.model().scorer.abandoned, gateway.render_metrics()

    status, payload, abandoned, metrics = asyncio.run(answer_then_look())
    assert status == 200 and payload["variant"] == "coarse", payload
    assert abandoned == 1  # the gRPC call goes on (a cancelled one would be done)
    assert "keel_gateway_triton_abandoned 1" in metrics


def test_the_highest_tiers_call_is_hedged_by_the_coarse_model_when_triton_is_late(tmp_path, silent_endpoint):
    """An L1 request whose Triton call has not answered by 40 % of its budget is scored by the coarse model too, and
    the first answer is its own — flagged ``hedged``; an L2 request is not hedged (it waits for the reserve)."""
    gateway = Gateway(deploy(tmp_path, HOTELS, silent_endpoint, coarse=True))
    assert gateway.model().tier() == "L1"
    gateway.model().scorer.load = lambda: LoadSignals(cpu_pressure=0.95)
    status, payload, _ = asyncio.run(gateway.predict(body_of(HOTELS), {}))
    assert status == 200 and payload["variant"] == "coarse", payload
    assert payload["degraded"] == ["coarse_fallback", "hedged"] and payload["model_version"] is None
    assert 'keel_gateway_hedges_total{tier="L1"} 1' in gateway.render_metrics()
    lower = Gateway(deploy(tmp_path / "l2", FLIGHTS, silent_endpoint, coarse=True))
    lower.model().scorer.load = lambda: LoadSignals(cpu_pressure=0.95)
    status, payload, _ = asyncio.run(lower.predict(body_of(FLIGHTS), {}))
    assert status == 200 and payload["degraded"] == ["coarse_fallback", "local_overload"], payload


def test_a_request_with_no_time_left_for_triton_gets_the_coarse_models_answer_within_the_time_kept_for_it(tmp_path):
    """It waited for most of its budget before the call (a hung Triton holds the requests before it): the part of
    the budget kept for the coarse model is still its own."""
    gateway = Gateway(deploy(tmp_path, FLIGHTS, "127.0.0.1:1", coarse=True))
    budget_s = gateway.model().timeout_ms() / 1000
    status, payload, _ = asyncio.run(gateway.predict(body_of(FLIGHTS), {}, arrived=time.monotonic() - 0.8 * budget_s))
    assert status == 200 and payload["degraded"] == ["coarse_fallback", "deadline_near"], payload
    assert not gateway.model().scorer.breakers or not gateway.model().scorer.breaker(1)._events


def test_the_coarse_pool_scores_the_highest_tier_first_and_bounds_the_lower_tiers_queue():
    """During a flood of L2 whose timeouts fall back to the coarse model, an L1 fallback must not wait behind them."""
    from gpu_runtime.gateway.coarse import MAX_WAITING_LOWER, CoarsePool
    from gpu_runtime.gateway.limits import RequestError

    pool = CoarsePool()
    gate = threading.Event()
    order: list[str] = []

    async def scenario():
        far = time.monotonic() + 60
        busy = asyncio.ensure_future(pool.run(gate.wait, far, rank=1))  # the thread is taken
        while pool.in_flight < 1:
            await asyncio.sleep(0)
        lower = [asyncio.ensure_future(pool.run(lambda k=k: order.append(f"L2-{k}"), far, rank=1))
                 for k in range(MAX_WAITING_LOWER)]  # fmt: skip
        await asyncio.sleep(0)
        with pytest.raises(RequestError) as shed:  # the lower tiers' part of the queue is full…
            await pool.run(lambda: order.append("L2-more"), far, rank=1)
        top = asyncio.ensure_future(pool.run(lambda: order.append("L1"), far, rank=0))  # …the top tier still queues
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(busy, top, *lower)
        return shed.value

    shed = asyncio.run(scenario())
    pool.close()
    assert shed.status == 503 and shed.code == "shed"
    assert order == ["L1", "L2-0", "L2-1"]  # queued last, scored first


def test_two_models_in_fallback_keep_one_booster_each_scored_off_the_event_loop(tmp_path, monkeypatch):
    import gpu_runtime.gateway.coarse as coarse_module

    threads: list[str] = []
    real = coarse_module.coarse_scores

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(coarse_module, "coarse_scores", recorded)
    gateway = Gateway(deploy(tmp_path / "f", FLIGHTS, "127.0.0.1:1", coarse=True),
                      also=(deploy(tmp_path / "h", HOTELS, "127.0.0.1:1", coarse=True),))  # fmt: skip
    asgi = Asgi(gateway)

    async def alternate():
        out = []
        for _ in range(4):
            for usecase in (FLIGHTS, HOTELS):
                out.append(await asgi.post(f"/v1/models/{usecase.model.name}/predict", body_of(usecase)))
        return out

    answers = asyncio.run(alternate())
    assert all(s == 200 and "coarse_fallback" in p["degraded"] for s, p, _ in answers), answers
    assert [p["model"] for _, p, _ in answers] == ["flight-delay", "room-rate"] * 4
    assert gateway.model("flight-delay").coarse.loads == 1 and gateway.model("room-rate").coarse.loads == 1
    assert len(threads) == 8 and all(t.startswith("keel-coarse") for t in threads)


def test_garbage_collections_are_timed_without_taking_a_lock_a_collection_may_start_under():
    """A collection can start while a thread holds the metrics' lock (a snapshot for the other workers): the timer's
    callback must not take it — a worker once hung there before its first request."""
    import gc

    from gpu_runtime.gateway.collector import CollectionTimer
    from gpu_runtime.gateway.metrics import Metrics

    metrics = Metrics()
    timer = CollectionTimer(metrics)
    try:
        done = threading.Event()

        def collect_under_the_lock() -> None:
            with metrics._lock:
                gc.collect()
            done.set()

        worker = threading.Thread(target=collect_under_the_lock, daemon=True)
        worker.start()
        assert done.wait(60), "the collection's callback waited for the lock its own thread holds"
        timer.flush()
        assert 'keel_gateway_gc_seconds_count{generation="2"}' in metrics.render()
    finally:
        timer.close()
