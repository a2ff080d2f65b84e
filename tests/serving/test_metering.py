"""Metering and budgets on the real model runtime: a day of replayed traffic from two tenants through the gateway and
Triton, metered by the ``usage`` and ``cost_report`` assets; hard and soft budgets applied by the running gateway.

The simulated clock is paused at 2013-06-01 08:00 (a live replay's clock, as the gateway reads it), so every request
and compute sample falls on that day whatever the wall clock does. The gateway samples Triton every 0.5 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import dagster as dg
import httpx
import polars as pl
import pytest

from assets.metering import cost_report, usage
from gpu_runtime.repository import triton_name
from keel.clock import SimClock
from keel.exposure_log import read_exposures
from keel.metering.compute import compute_ns, read_compute_samples
from keel.policies import PolicyStore
from keel.policies.types import Cost
from resources import keel_resources
from tests import REPO
from tests.conftest import evaluate_sensor
from tests.serving.conftest import MODEL, PATIENT, request_body, serving_version_1, start_serve, stop_serve

DAY = "2013-06-01"
PRICES = {"currency": "USD", "per_1000_requests": 0.40, "per_cpu_second": 0.02, "per_gpu_second": 0.5,
          "tenants": {"pricing": {"per_1000_requests": 0.25}}}  # fmt: skip


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    clock = SimClock(runtime_home / "clock.json")
    clock.start(datetime(2013, 6, 1, 8, tzinfo=UTC))
    clock.pause()
    with PolicyStore(runtime_home / "policies.sqlite") as store:
        store.apply({"prices": ("cost", PRICES)}, author="finance", reason="June prices")
    saved = os.environ.get("KEEL_METER_INTERVAL_S")
    os.environ["KEEL_METER_INTERVAL_S"] = "0.5"
    try:
        with serving_version_1(runtime_home, serving_models[0], PATIENT) as rt:
            yield rt
    finally:
        os.environ.pop("KEEL_METER_INTERVAL_S") if saved is None else os.environ.update(KEEL_METER_INTERVAL_S=saved)


def replay(rt, seconds: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "gpu_runtime.replay", "--usecase", "flights", "--url", rt.url, "--rps", "50", "--seconds", str(seconds),
         "--month", "2013-06", "--tenants", "ops,pricing"],
        cwd=REPO, env=os.environ | {"KEEL_HOME": str(rt.home)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit(rt, changes: dict, reason: str) -> int:
    with PolicyStore(rt.home / "policies.sqlite") as store:
        return store.apply(changes, author="finance", reason=reason).version


def wait_for_policy(rt, version: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{rt.url}/readyz", timeout=5).json().get("policy_version") != version:
        assert time.monotonic() < deadline, "the gateway did not apply the commit"
        time.sleep(0.02)


def triton_compute_ns(rt) -> int:
    [entry] = rt.control.inference_statistics(triton_name(MODEL, 1), 1)["model_stats"]
    return compute_ns(entry)


def wait_for_last_sample(rt, timeout: float = 60.0) -> int:
    """Triton's compute now, once the gateway's compute log has sampled exactly that (no request in between)."""
    deadline = time.monotonic() + timeout
    while True:
        now = triton_compute_ns(rt)
        samples = [s for s in read_compute_samples(rt.home / "serving" / "compute") if s.model_version == 1]
        if samples and samples[-1].compute_ns == now:
            return now
        assert time.monotonic() < deadline, f"no compute sample reached {now} ns: {samples[-3:]}"
        time.sleep(0.2)


def test_a_day_of_two_tenants_is_metered_exactly_and_costed_by_the_prices_in_force(runtime):
    first = replay(runtime, 4)
    v2 = commit(runtime, {"prices": ("cost", PRICES | {"per_1000_requests": 0.80})}, "price rise at noon")
    wait_for_policy(runtime, v2)
    second = replay(runtime, 4)
    assert first["failed"] == 0 and second["failed"] == 0
    triton_ns = wait_for_last_sample(runtime)

    result = dg.materialize([usage, cost_report], resources=keel_resources(runtime.home), partition_key=DAY)
    assert result.success
    u = result.output_for_node("usage")
    cost = result.output_for_node("cost_report")

    # Requests: exactly the exposure log's, per tenant exactly what the replays sent.
    log = read_exposures(runtime.home / "serving" / "exposures", day=DAY)
    assert int(u["requests"].sum()) == len(log) == first["sent"] + second["sent"]
    by_tenant = dict(u.group_by("tenant_id").agg(pl.col("requests").sum()).iter_rows())
    assert by_tenant == {t: first["by_tenant"][t] + second["by_tenant"][t] for t in ("ops", "pricing")}
    assert int(u["rows_scored"].sum()) == sum(r.get("rows", 0) for r in log if r["status"] == 200)
    assert set(u["price_version"]) == {1, 2}  # the rise split the day

    # Compute: what Triton's statistics say of the version, loaded on this (simulated) day, within 5 %.
    assert u["compute_s"].sum() == pytest.approx(triton_ns / 1e9, rel=0.05)
    assert u.filter(pl.col("tenant_id") == "ops")["compute_s"].sum() > 0

    # Cost: reproduced here from the log × the price table in force for each request, plus compute × its price.
    with PolicyStore(runtime.home / "policies.sqlite") as store:
        tables = {v: next(p for p in store.state(v).values() if p.type == "cost").body for v in (1, 2)}
        in_force = {r["policy_version"]: store.get("prices", r["policy_version"]).body for r in log}
    requests_cost = sum(Cost.prices_for(in_force[r["policy_version"]], r["tenant_id"])["per_1000_requests"] / 1000
                        for r in log if r["status"] == 200)  # fmt: skip
    compute_cost = sum(
        r["compute_s"] * Cost.prices_for(tables[r["price_version"]], r["tenant_id"])["per_cpu_second"]
        for r in u.iter_rows(named=True)
        if r["price_version"] is not None
    )
    assert cost["cost"].sum() == pytest.approx(requests_cost + compute_cost, rel=1e-9)
    ops_before = sum(1 for r in log if r["tenant_id"] == "ops" and r["policy_version"] == 1 and r["status"] == 200)
    ops_rows = cost.filter((pl.col("tenant_id") == "ops") & (pl.col("price_version") == 1))
    assert ops_rows["request_cost"].sum() == pytest.approx(ops_before * 0.40 / 1000)
    meta = result.asset_materializations_for_node("cost_report")[0].metadata
    assert meta["cost"].value == pytest.approx(requests_cost + compute_cost, abs=1e-6)  # shown to 6 decimals
    assert "data:image/svg+xml;base64," in meta["plot"].value


def test_a_hard_budget_refuses_its_tenant_at_once_and_no_other(runtime, serving_models):
    _, feb = serving_models
    ops = request_body(feb.row(0, named=True), tenant_id="ops")
    pricing = request_body(feb.row(1, named=True), tenant_id="pricing")
    assert runtime.post(ops).status_code == 200
    budget = {"currency": "USD", "period": "day", "tenants": {"ops": {"limit": 0.0001}, "pricing": {"limit": 1000}}}
    committed = time.monotonic()
    version = commit(runtime, {"budgets": ("budget", budget)}, "ops is over its daily budget")
    statuses, other = [], []
    while True:  # ops' spend today is far over 0.0001 USD: refused as soon as this gateway applies the commit
        resp = runtime.post(ops)
        statuses.append(resp.status_code)
        other.append(runtime.post(pricing).status_code)
        if resp.status_code == 429:
            break
        assert time.monotonic() - committed < 10, statuses
    refused_after = time.monotonic() - committed
    print(f"budget commit → first 429 budget_exceeded after {refused_after:.3f} s")
    err = resp.json()["error"]
    assert err["code"] == "budget_exceeded" and err["limit"] == 0.0001 and err["period"] == "day 2013-06-01"
    assert err["spend"] > 0.0001 and "budget spent" in err["message"]
    assert httpx.get(f"{runtime.url}/readyz", timeout=5).json()["policy_version"] == version
    assert set(other) == {200} and runtime.post(pricing).status_code == 200  # other tenants are unaffected
    assert [runtime.post(ops).status_code for _ in range(5)] == [429] * 5
    metrics = httpx.get(f"{runtime.url}/metrics", timeout=5).text
    assert 'keel_gateway_budget_exceeded_total{tenant="ops"}' in metrics
    assert 'keel_gateway_tenant_budget_state{tenant="ops"} 2' in metrics
    assert 'keel_gateway_tenant_budget_state{tenant="pricing"} 0' in metrics
    assert 'tenant="replay"' not in metrics  # only tenants the policies name get a label

    # A soft budget warns on the answers; raising ops' budget serves it again.
    spent = float(err["spend"])
    budget["tenants"] = {"ops": {"limit": spent * 1.1, "soft_share": 0.5}, "pricing": {"limit": 1000}}
    wait_for_policy(runtime, commit(runtime, {"budgets": ("budget", budget)}, "ops raised"))
    resp = runtime.post(ops)
    assert resp.status_code == 200 and "of the budget spent" in resp.headers["x-keel-budget"]


def test_the_metering_sensor_alerts_on_budgets_once_and_meters_finished_days(runtime, monkeypatch):
    # ops is in its soft zone (previous test): one warning, and only one however often the sensor ticks
    for _ in range(2):
        evaluate_sensor("metering_sensor", runtime.home, monkeypatch)
    alerts = [json.loads(line) for line in (runtime.home / "alerts" / "alerts.jsonl").read_text().splitlines()]
    budget_alerts = [a for a in alerts if a["kind"] == "budget"]
    assert len(budget_alerts) == 1 and budget_alerts[0]["severity"] == "warning"
    assert budget_alerts[0]["details"]["tenant"] == "ops" and budget_alerts[0]["channel"] == "chat"
    # the day is over once the clock has moved on and the gateway sampled on a later day
    today = evaluate_sensor("metering_sensor", runtime.home, monkeypatch)
    assert not today.run_requests and "no finished day" in today.skip_message
    SimClock(runtime.home / "clock.json").advance_to(datetime(2013, 6, 3, 1, tzinfo=UTC))
    data = evaluate_sensor("metering_sensor", runtime.home, monkeypatch)
    assert [r.partition_key for r in data.run_requests] == [DAY]
    assert data.run_requests[0].run_key == f"metering-{DAY}" and json.loads(data.cursor)["through"] == DAY


def test_a_restarted_gateway_reads_the_spend_back_from_its_logs(runtime, serving_models):
    """Spend is not state of the gateway's memory: a gateway that starts with a budget in force reads the period so
    far from the exposure and compute logs, so a tenant over its budget stays refused across a restart."""
    _, feb = serving_models
    ops = request_body(feb.row(0, named=True), tenant_id="ops")
    budget = {"currency": "USD", "period": "day", "tenants": {"ops": {"limit": 0.0012}}}
    version = commit(runtime, {"budgets": ("budget", budget)}, "ops: a tight daily budget")
    wait_for_policy(runtime, version)
    # (the clock moved on to a new day in the previous test: ops starts it with nothing spent)
    statuses = [runtime.post(ops).status_code for _ in range(5)]  # 0.0008 USD a request: refused from the third
    assert statuses == [200, 200, 429, 429, 429], statuses
    stop_serve(runtime.proc)
    runtime.proc, runtime.endpoints = start_serve(runtime.home, PATIENT)
    runtime.url = f"http://{runtime.endpoints['gateway']}"
    runtime.wait_ready(timeout=120)
    resp = runtime.post(ops)
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "budget_exceeded"
    assert resp.json()["error"]["spend"] > 0.0012


def test_compute_sampled_after_the_clock_moved_on_is_not_charged_to_the_new_periods_budget(tmp_path):
    """The gateway samples Triton's compute every few seconds; a sample taken after the clock moved on to a new day
    covers the old day's last requests too. Their share of it is the old day's spend: a tenant starts the new day
    with nothing spent (the CI failure of test_a_restarted_gateway_reads_the_spend_back_from_its_logs)."""
    from gpu_runtime.gateway.metering import UsageMeter
    from gpu_runtime.gateway.metrics import Metrics

    clock = [datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()]
    meter = UsageMeter(compute_dir=None, interval_s=5, device="cpu", exposure_dir=tmp_path / "none", metrics=Metrics(),
                       now=lambda: clock[0], client=lambda: None, routing=lambda: None, reader=lambda: None)  # fmt: skip
    meter.prices, meter.budget = PRICES, {"currency": "USD", "period": "day", "tenants": {"ops": {"limit": 1.0}}}
    meter._seed_spend()
    for _ in range(3):  # ops' requests of June 1 (their request prices count that day)
        meter.meter({"tenant_id": "ops", "status": 200, "model_version": 1, "rows": 1, "ts": clock[0]})
    clock[0] = datetime(2013, 6, 3, 1, tzinfo=UTC).timestamp()
    meter.check_budget("ops")  # the new day: nothing spent yet
    meter._charge_compute(1, 10.0)  # the sample after the clock moved on: June 1's requests' compute
    assert meter.spend["ops"] == 0.0
    meter.meter({"tenant_id": "ops", "status": 200, "model_version": 1, "rows": 1, "ts": clock[0]})
    meter._charge_compute(1, 10.0)  # today's request's compute is today's spend
    assert meter.spend["ops"] == pytest.approx(0.40 / 1000 + 10.0 * 0.02)
