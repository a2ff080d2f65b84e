"""Budgets as decisions: ok, soft at its share, hard at its limit — table tests; the policy type's rules."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from keel.metering.budget import HARD, OK, SOFT, budget_alert, decide_budget, period_of, period_start_day
from keel.policies.errors import PolicyValidationError
from keel.policies.types import validate_policy

TS = datetime(2013, 6, 14, 15, tzinfo=UTC).timestamp()
BUDGET = {"currency": "USD", "period": "day", "tenants": {
    "ops": {"limit": 10.0, "soft_share": 0.8},
    "pricing": {"limit": 5.0, "hard": False},
    "frozen": {"limit": 0},
}}  # fmt: skip


@pytest.mark.parametrize(
    "tenant, spend, state",
    [
        ("ops", 0.0, OK),
        ("ops", 7.99, OK),
        ("ops", 8.0, SOFT),  # at the soft share
        ("ops", 9.999, SOFT),
        ("ops", 10.0, HARD),  # at the limit: refused
        ("ops", 250.0, HARD),
        ("pricing", 4.5, SOFT),  # default soft share 0.8
        ("pricing", 6.0, SOFT),  # over, but its budget is soft only: never refused
        ("frozen", 0.0, HARD),  # a zero hard budget stops the tenant at once
    ],
)
def test_a_tenants_spend_decides_its_budget_state(tenant, spend, state):
    d = decide_budget(tenant, spend, BUDGET, TS)
    assert d.state == state and d.refuses == (state == HARD)
    assert d.period == "day 2013-06-14" and d.currency == "USD"
    assert f"{spend:.4f} of {BUDGET['tenants'][tenant]['limit']:.4f} USD" in d.reason


def test_a_tenant_the_budget_does_not_name_has_no_decision():
    assert decide_budget("replay", 1e9, BUDGET, TS) is None


def test_periods_are_utc_days_or_months_of_the_gateways_clock():
    assert period_of(TS, "month") == "month 2013-06" and period_start_day(TS, "month") == "2013-06-01"
    assert period_start_day(TS, "day") == "2013-06-14"


def test_alerts_once_per_tenant_period_and_state():
    soft = budget_alert(decide_budget("ops", 8.5, BUDGET, TS))
    hard = budget_alert(decide_budget("ops", 10.5, BUDGET, TS))
    assert soft[0] == "warning" and soft[2] == "budget:ops:day 2013-06-14:soft"
    assert hard[0] == "critical" and "429 budget_exceeded" in hard[1]
    assert budget_alert(decide_budget("ops", 1.0, BUDGET, TS)) is None


@pytest.mark.parametrize(
    "body, rule",
    [
        (BUDGET | {"currency": "usd"}, "currency"),
        (BUDGET | {"period": "week"}, "period"),
        (BUDGET | {"tenants": {}}, "tenants_present"),
        (BUDGET | {"tenants": {"ops": {"limit": -1}}}, "limit_range"),
        (BUDGET | {"tenants": {"ops": {"soft_share": 0.5}}}, "limit_present"),
        (BUDGET | {"tenants": {"ops": {"limit": 1, "soft_share": 1.5}}}, "soft_share_range"),
        (BUDGET | {"tenants": {"ops": {"limit": 1, "hard": "yes"}}}, "hard_bool"),
        (BUDGET | {"tenants": {"ops": {"limit": 1, "cap": 2}}}, "known_fields"),
    ],
)
def test_each_broken_budget_rule_is_named(body, rule):
    with pytest.raises(PolicyValidationError) as err:
        validate_policy("budgets", "budget", body)
    assert err.value.rule == rule


def test_a_valid_budget_passes():
    validate_policy("budgets", "budget", BUDGET)
