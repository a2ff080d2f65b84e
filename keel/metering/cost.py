"""Cost: usage × the price table in force when the requests were answered.

The price table is the ``cost`` policy (keel/policies/types.py ``Cost``) — versioned in the policy store, so the
price of a usage row is the one of its ``price_version``, never today's. Billed: requests answered 200 (``scored`` +
``fallback``) at ``per_1000_requests``, and the attributed model compute at ``per_cpu_second`` or
``per_gpu_second`` by the device that ran it; errors (4xx, 5xx) are metered but not billed. A tenant's overrides
replace the table's prices for that tenant. Rows without a price version (served before any price table) are
``unpriced``: their cost is null, never a guessed zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from keel.policies.types import Cost

COST_COLUMNS = ("request_cost", "compute_cost", "cost")


def policy_of_type(state: dict[str, Any], type_: str) -> Any | None:
    """The policy of ``type_`` in force in a policy-store state (name → Policy): the first by name, as gateways pick
    one of each type (keel/policies/gateway.py)."""
    return next((state[n] for n in sorted(state) if state[n].type == type_), None)


def cost_policy(state: dict[str, Any]) -> Any | None:
    """The price table in force in a policy-store state."""
    return policy_of_type(state, "cost")


def price_versions(store, policy_versions: Iterable[int | None]) -> dict[int | None, int | None]:
    """Store version in force → the version of the cost policy in it (the commit that last set the price table)."""
    out: dict[int | None, int | None] = {None: None}
    for v in sorted({v for v in policy_versions if v}):
        p = cost_policy(store.state(v))
        out[v] = p.version if p else None
    return out


def price_tables(store, versions: Iterable[int | None]) -> dict[int, dict[str, Any]]:
    """Cost policy version → its body (the price table as committed then)."""
    out = {}
    for v in sorted({v for v in versions if v}):
        p = cost_policy(store.state(v))
        if p is None or p.version != v:
            raise ValueError(f"policy-store version {v} did not set a cost policy")
        out[v] = p.body
    return out


def cost_frame(usage: pl.DataFrame, tables: dict[int, dict[str, Any]]) -> pl.DataFrame:
    """``usage`` with currency, the prices applied, request_cost, compute_cost and cost (null when unpriced)."""
    rows = []
    for r in usage.iter_rows(named=True):
        body = tables.get(r["price_version"]) if r["price_version"] is not None else None
        if body is None:
            rows.append((None, None, None, None, None, None))
            continue
        prices = Cost.prices_for(body, r["tenant_id"])
        per_s = prices["per_gpu_second"] if r["device"] == "gpu" else prices["per_cpu_second"]
        request_cost = (r["scored"] + r["fallback"]) / 1000 * prices["per_1000_requests"]
        compute_cost = r["compute_s"] * per_s
        rows.append(
            (body["currency"], prices["per_1000_requests"], per_s, request_cost, compute_cost,
             request_cost + compute_cost)
        )  # fmt: skip
    priced = pl.DataFrame(
        rows,
        schema={
            "currency": pl.Utf8, "price_per_1000_requests": pl.Float64, "price_per_compute_second": pl.Float64,
            "request_cost": pl.Float64, "compute_cost": pl.Float64, "cost": pl.Float64,
        },
        orient="row",
    )  # fmt: skip
    return pl.concat([usage, priced], how="horizontal")


def totals(cost: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Cost summed by ``by`` (e.g. ["tenant_id"], ["day", "tenant_id", "model_version"]) and currency (amounts in
    two currencies are never added); a group of unpriced rows only has a null cost, not 0."""
    by = [*by, "currency"]
    return (
        cost.group_by(by)
        .agg(
            pl.col("requests").sum(), pl.col("rows_scored").sum(), pl.col("compute_s").sum(),
            *[pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()).alias(c) for c in COST_COLUMNS],
            pl.col("cost").is_null().sum().alias("unpriced_rows"),
        )
        .sort(by, nulls_last=True)
    )  # fmt: skip
