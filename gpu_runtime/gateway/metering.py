"""What the gateway meters while it serves: Triton's compute statistics, sampled into the compute log, and each
budgeted tenant's spend in the current period — enforced as 429 ``budget_exceeded`` at a hard budget.

The bill is the ``usage`` and ``cost_report`` assets (keel/metering, from the exposure and compute logs); the gateway
keeps a running copy of the same arithmetic for the tenants a ``budget`` policy names: when a budget comes into force
(or the gateway starts with one) it reads the period so far from the logs, then adds each answered request's price
at once and each sampled interval's compute, shared by the rows each tenant had scored on that version since the
previous sample. A budget committed below what a tenant has spent therefore refuses its next request — within
POLICY_POLL_S of the commit. Spend is known to one gateway — its own logs — unless ``$KEEL_LIMITS_REDIS`` names a
Redis server: then every gateway adds its spend to one number per tenant and period there and judges the fleet's
total (global_limits.py ``GlobalSpend``; within ``SYNC_S``).

``UsageMeter`` does it for one served model (model.py): the log stage meters each answer, the gateway's watcher
samples Triton.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_runtime.gateway.global_limits import SYNC_S, global_spend
from gpu_runtime.gateway.limits import OTHER_TENANT, RequestError
from gpu_runtime.repository import triton_name
from keel.exposure_log import ExposureLog
from keel.metering.budget import HARD, SOFT, BudgetDecision, decide_budget, period_of, period_start_day
from keel.metering.compute import ComputeSample, day_of, sample_from_statistics
from keel.metering.cost import policy_of_type
from keel.policies.types import Cost

METER_INTERVAL_S = 5.0  # how often Triton's statistics are sampled (GatewayConfig.meter_interval_s)


class UsageMeter:
    def __init__(
        self, *, compute_dir: Path | None, interval_s: float, device: str, exposure_dir: Path, metrics: Any,
        now: Callable[[], float], client: Callable[[], Any], routing: Callable[[], Any], reader: Callable[[], Any],
    ):  # fmt: skip
        self.interval_s, self.device, self.exposure_dir = interval_s, device, exposure_dir
        self.metrics, self.now, self.client, self.routing, self.reader = metrics, now, client, routing, reader
        self.compute_log = ExposureLog(compute_dir, prefix="compute") if compute_dir else None
        self._samples: dict[tuple[str, int], ComputeSample] = {}  # the last sample of each version
        self._sample_day = ""
        self._meter_checked = 0.0
        # version → (tenant, when) → rows scored since its last sample; ``when``: the request's clock time (by day)
        self._rows_since: dict[int, dict[tuple[str, float], int]] = {}
        self.prices: dict[str, Any] | None = None  # the cost policy's body in force
        self.budget: dict[str, Any] | None = None  # the budget policy's body in force
        self.spend: dict[str, float] = {}  # budgeted tenant → spend in the period
        self._spend_period: str | None = None
        self.budget_decisions: dict[str, BudgetDecision] = {}
        self.global_spend = global_spend(metrics)  # the fleet's spend on Redis ($KEEL_LIMITS_REDIS), else None
        self._pending: dict[str, float] = {}  # spend metered here, not yet added to the fleet's
        self._fleet: dict[str, float] = {}  # the fleet's totals as last read
        self._synced = -SYNC_S

    # -- following the store ----------------------------------------------------------------------------------

    def apply_policies(self, state: dict[str, Any]) -> None:
        """The cost and budget policies of a newly applied store version; spend is read again from the logs when
        the budget changed (a new limit must judge what was already spent)."""
        cost = policy_of_type(state, "cost")
        budget = policy_of_type(state, "budget")
        self.prices = cost.body if cost else None
        new_budget = budget.body if budget else None
        if new_budget != self.budget:
            self.budget = new_budget
            self.spend, self._spend_period = {}, None
            if new_budget is not None:
                self._seed_spend()

    def _seed_spend(self) -> None:
        """Each budgeted tenant's spend in the current period so far, from the exposure and compute logs."""
        from keel.metering.usage import spend_by_tenant

        now = self.now()
        period = self.budget.get("period", "day")
        self._spend_period = period_of(now, period)
        self.spend = dict.fromkeys(self.budget["tenants"], 0.0)
        reader = self.reader()
        if reader is None or not self.exposure_dir.exists():
            return
        self.spend = spend_by_tenant(
            self.exposure_dir.parent,
            reader,
            self.spend,
            period_start_day(now, period),
            day_of(now),
        )
        if self.global_spend is not None:  # what the logs say, where no gateway counts the period yet
            self.global_spend.seed(self._fleet_period(), self.spend)
            self._synced = -SYNC_S

    # -- on the request path ----------------------------------------------------------------------------------

    def check_budget(self, tenant: str) -> dict[str, str]:
        """Refuse a tenant over its hard budget (429 budget_exceeded); headers to add for a soft one."""
        if self.budget is None or tenant not in self.spend:
            return {}
        self._roll_period()
        decision = decide_budget(tenant, self.spent(tenant), self.budget, self.now())
        self.budget_decisions[tenant] = decision
        if decision.state == HARD:
            self.metrics.inc("keel_gateway_budget_exceeded_total", {"tenant": tenant})
            raise RequestError(
                429, "budget_exceeded", f"tenant {tenant}: {decision.reason}",
                spend=round(decision.spend, 6), limit=decision.limit, currency=decision.currency,
                period=decision.period,
            )  # fmt: skip
        if decision.state == SOFT:
            return {"x-keel-budget": decision.reason}
        return {}

    def _roll_period(self) -> None:
        period = period_of(self.now(), self.budget.get("period", "day"))
        if period != self._spend_period:  # a new period starts with nothing spent
            self._spend_period = period
            self.spend = dict.fromkeys(self.spend, 0.0)
            self._pending, self._fleet, self._synced = {}, {}, -SYNC_S

    def _fleet_period(self) -> str:
        return f"{self.budget.get('currency', '')}:{self._spend_period}"

    def _add_spend(self, tenant: str, amount: float) -> None:
        self.spend[tenant] += amount
        if self.global_spend is not None:
            self._pending[tenant] = self._pending.get(tenant, 0.0) + amount

    def spent(self, tenant: str) -> float:
        """The tenant's spend in the period: this gateway's, or — with a fleet's number on Redis — the fleet's (as
        last read, at most ``SYNC_S`` ago, plus what this gateway metered since)."""
        if self.global_spend is None:
            return self.spend[tenant]
        mono = time.monotonic()
        if mono - self._synced >= SYNC_S:
            self._synced = mono
            totals = self.global_spend.sync(self._fleet_period(), self._pending, sorted(self.spend))
            if totals is not None:
                self._pending, self._fleet = {}, totals
        if tenant not in self._fleet:  # Redis never answered for it: this gateway's own view
            return self.spend[tenant]
        return self._fleet[tenant] + self._pending.get(tenant, 0.0)

    def meter(self, record: dict[str, Any]) -> None:
        """An answered request: its rows for the compute share, its price for its tenant's spend."""
        tenant = record.get("tenant_id") or "unknown"
        priced = (self.prices or {}).get("tenants") or {}
        named = tenant if tenant in self.spend or tenant in priced else OTHER_TENANT
        self.metrics.inc("keel_gateway_tenant_requests_total", {"tenant": named, "status": str(record["status"])})
        if record["status"] != 200:
            return
        version = record.get("model_version")
        if version is not None:
            per = self._rows_since.setdefault(version, {})
            key = (tenant, float(record.get("ts") or self.now()) // 86400 * 86400)  # (its day)
            per[key] = per.get(key, 0) + int(record.get("rows") or 1)
        if tenant in self.spend and self.prices is not None:
            self._add_spend(tenant, Cost.prices_for(self.prices, tenant)["per_1000_requests"] / 1000)

    # -- sampling Triton --------------------------------------------------------------------------------------

    async def sample_compute(self, force: bool = False) -> None:
        """Sample Triton's statistics of every version this gateway routes (and those it sampled before): one line
        per version whose compute changed, and every version once a day; the interval's compute to the spend of
        the budgeted tenants that scored rows on it."""
        mono = time.monotonic()
        if self.compute_log is None or (not force and mono - self._meter_checked < self.interval_s):
            return
        self._meter_checked = mono
        table = self.routing()
        if table is None:
            return
        versions = {(table.model, v) for v in table.versions()} | set(self._samples)
        now = self.now()
        new_day = day_of(now) != self._sample_day
        for model, version in sorted(versions):
            try:
                stats = await self.client().get_inference_statistics(
                    triton_name(model, version), str(version), as_json=True, client_timeout=5
                )
            except Exception:  # noqa: BLE001 - unloaded or Triton down: nothing to sample now
                if version not in table.versions():  # retired by a deployment: not asked again
                    self._samples.pop((model, version), None)
                continue
            sample = sample_from_statistics(stats, model, version, now, self.device)
            if sample is None:
                continue
            prev = self._samples.get((model, version))
            if prev is not None and prev.compute_ns == sample.compute_ns and not new_day:
                continue
            if not self.compute_log.append(sample.as_record()):
                self.metrics.inc("keel_gateway_compute_log_failures_total", {})
            self._samples[(model, version)] = sample
            base = prev.compute_ns if prev is not None else 0
            delta_s = (sample.compute_ns - base if sample.compute_ns >= base else sample.compute_ns) / 1e9
            self._charge_compute(version, delta_s)
        self._sample_day = day_of(now)

    def _charge_compute(self, version: int, delta_s: float) -> None:
        rows = self._rows_since.pop(version, {})
        total = sum(rows.values())
        if not total or self.prices is None or not self.spend:
            return
        self._roll_period()
        period = self.budget.get("period", "day") if self.budget else "day"
        for (tenant, when), n in rows.items():
            # rows scored in an earlier period share the interval's compute, but it is that period's spend, not this
            # one's (a sample taken after the clock moved on to a new day covers the old day's last requests too)
            if tenant in self.spend and period_of(when, period) == self._spend_period:
                prices = Cost.prices_for(self.prices, tenant)
                per_s = prices["per_gpu_second"] if self.device == "gpu" else prices["per_cpu_second"]
                self._add_spend(tenant, delta_s * n / total * per_s)

    def export_budgets(self) -> None:
        """Per budgeted tenant (the policy names them: bounded): spend, limit and the share spent."""
        for name in ("keel_gateway_tenant_spend", "keel_gateway_tenant_budget", "keel_gateway_tenant_budget_state"):
            self.metrics.clear_gauge(name)  # a tenant the budget no longer names is not shown
        if self.budget is None:
            return
        now = self.now()
        for tenant in self.spend:
            spent = self.spent(tenant)
            d = decide_budget(tenant, spent, self.budget, now)
            if d is None:
                continue
            self.metrics.set_gauge("keel_gateway_tenant_spend", {"tenant": tenant}, spent)
            self.metrics.set_gauge("keel_gateway_tenant_budget", {"tenant": tenant}, d.limit)
            self.metrics.set_gauge(
                "keel_gateway_tenant_budget_state", {"tenant": tenant}, {"ok": 0, SOFT: 1, HARD: 2}[d.state]
            )
