"""Budgets: a tenant's spend in the period against its ``budget`` policy, decided as a value.

``decide_budget`` says ok, soft (at ``soft_share`` of the limit: alert, warn on answers) or hard (at the limit with
``hard``: 429 ``budget_exceeded``), with the numbers and the reason; the gateway acts on it, the budget sensor
alerts on it, tests table it. A limit of 0 with ``hard`` stops a tenant at once (its next request).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

DEFAULT_SOFT_SHARE = 0.8
OK, SOFT, HARD = "ok", "soft", "hard"


@dataclass(frozen=True)
class BudgetDecision:
    tenant: str
    state: str  # ok | soft | hard
    spend: float
    limit: float
    share: float  # spend ÷ limit (inf for a spent zero budget)
    period: str  # e.g. "day 2013-06-01", "month 2013-06"
    currency: str
    reason: str

    @property
    def refuses(self) -> bool:
        return self.state == HARD


def period_of(ts: float, period: str) -> str:
    """The budget period that ``ts`` (epoch seconds, the gateway's clock) falls in: 'day YYYY-MM-DD' or
    'month YYYY-MM'."""
    t = time.gmtime(ts)
    return f"day {time.strftime('%Y-%m-%d', t)}" if period == "day" else f"month {time.strftime('%Y-%m', t)}"


def period_start_day(ts: float, period: str) -> str:
    """The first day (YYYY-MM-DD) of the period ``ts`` falls in."""
    t = time.gmtime(ts)
    return time.strftime("%Y-%m-%d", t) if period == "day" else time.strftime("%Y-%m-01", t)


def decide_budget(tenant: str, spend: float, body: dict[str, Any], ts: float) -> BudgetDecision | None:
    """The decision for ``tenant`` under a budget policy ``body`` (None: the policy gives the tenant no budget)."""
    spec = (body.get("tenants") or {}).get(tenant)
    if spec is None:
        return None
    limit = float(spec["limit"])
    soft = float(spec.get("soft_share", DEFAULT_SOFT_SHARE))
    hard = bool(spec.get("hard", True))
    period = period_of(ts, body.get("period", "day"))
    currency = body["currency"]
    share = spend / limit if limit > 0 else (float("inf") if spend > 0 or hard else 0.0)
    used = f"{spend:.4f} of {limit:.4f} {currency} ({period})"
    if hard and spend >= limit:
        return BudgetDecision(tenant, HARD, spend, limit, share, period, currency, f"budget spent: {used}")
    if share >= soft:
        why = f"{share:.0%} of the budget spent (soft at {soft:.0%}): {used}"
        if not hard and spend >= limit:
            why = f"over its budget, which is soft only: {used}"
        return BudgetDecision(tenant, SOFT, spend, limit, share, period, currency, why)
    return BudgetDecision(tenant, OK, spend, limit, share, period, currency, f"within budget: {used}")


def budget_alert(decision: BudgetDecision) -> tuple[str, str, str] | None:
    """(severity, summary, once-key) of the alert a decision asks for — None for ok. One alert per tenant, period and
    state: soft warns (chat), hard pages (the tenant's requests are being refused)."""
    if decision.state == OK:
        return None
    severity = "critical" if decision.state == HARD else "warning"
    verb = "is refused (429 budget_exceeded)" if decision.state == HARD else "nears its budget"
    summary = f"tenant {decision.tenant} {verb}: {decision.reason}"
    return severity, summary, f"budget:{decision.tenant}:{decision.period}:{decision.state}"
