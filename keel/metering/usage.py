"""Usage per tenant × model version × day: what the exposure log and Triton's statistics say was used.

One row per (day, tenant_id, model_version, price_version):

- ``requests``: every exposure record (every answer, errors included) — the metered count equals the log's exactly;
- ``rows_scored``: entities (or feature rows) in the requests answered 200;
- ``scored``, ``fallback``, ``client_errors``, ``server_errors``: answers by outcome — 200 from the routed model,
  200 from a stand-in (fallback version, or the last-resort score while the runtime was down), 4xx, 5xx;
- ``gateway_s``: the gateway's time on those requests (the exposure log's latency_ms);
- ``compute_s``: the version's model compute seconds that day from Triton's statistics (keel.metering.compute),
  attributed to tenants by their share of the version's rows scored that day; compute no answered request explains
  (warm-up, direct Triton calls) is tenant ``_unattributed``, so the day's compute is never lost;
- ``device``: cpu or gpu (the price per CPU- or GPU-second applies);
- ``price_version``: the policy-store version of the ``cost`` policy in force when the requests were answered (from
  each record's ``policy_version``; null: no price table was committed yet).

``model_version`` is null for requests that ended before a version was chosen (a 422, a 429).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from keel.metering.compute import compute_deltas, read_compute_samples

UNATTRIBUTED = "_unattributed"
KEY = ["day", "tenant_id", "model_version", "price_version"]
USAGE_SCHEMA = {
    "day": pl.Utf8, "tenant_id": pl.Utf8, "model_version": pl.Int64, "price_version": pl.Int64,
    "requests": pl.Int64, "rows_scored": pl.Int64, "scored": pl.Int64, "fallback": pl.Int64,
    "client_errors": pl.Int64, "server_errors": pl.Int64, "gateway_s": pl.Float64, "compute_s": pl.Float64,
    "device": pl.Utf8,
}  # fmt: skip
STAND_INS = ("fallback", "runtime_unavailable", "coarse_fallback")


def outcome(record: dict[str, Any]) -> str:
    status = int(record["status"])
    if status >= 500:
        return "server_error"
    if status >= 400:
        return "client_error"
    degraded = record.get("degraded") or ()
    return "fallback" if any(flag in STAND_INS for flag in degraded) else "scored"


def request_frame(records: Iterable[dict[str, Any]], price_version_of: Callable[[int | None], int | None]):
    """One row per exposure record with what usage needs."""
    rows = []
    for r in records:
        kind = outcome(r)
        rows.append(
            (
                time.strftime("%Y-%m-%d", time.gmtime(r["ts"])),
                r.get("tenant_id") or "unknown",
                r.get("model_version"),
                price_version_of(r.get("policy_version")),
                kind,
                int(r.get("rows") or 1) if int(r["status"]) == 200 else 0,
                float(r.get("latency_ms") or 0.0) / 1000,
            )
        )
    return pl.DataFrame(
        rows,
        schema={
            "day": pl.Utf8, "tenant_id": pl.Utf8, "model_version": pl.Int64, "price_version": pl.Int64,
            "outcome": pl.Utf8, "rows": pl.Int64, "gateway_s": pl.Float64,
        },
        orient="row",
    )  # fmt: skip


def usage_frame(
    records: Iterable[dict[str, Any]],
    deltas: pl.DataFrame,
    price_version_of: Callable[[int | None], int | None] = lambda v: None,
) -> pl.DataFrame:
    """Usage rows (USAGE_SCHEMA) from exposure records and compute deltas (``compute.compute_deltas``)."""
    req = request_frame(records, price_version_of)
    counted = req.group_by(KEY).agg(
        pl.len().cast(pl.Int64).alias("requests"),
        pl.col("rows").sum().alias("rows_scored"),
        *[(pl.col("outcome") == o).sum().cast(pl.Int64).alias(name) for o, name in (
            ("scored", "scored"), ("fallback", "fallback"), ("client_error", "client_errors"),
            ("server_error", "server_errors"),
        )],
        pl.col("gateway_s").sum(),
    )  # fmt: skip
    per_version = deltas.group_by(["day", "model_version"]).agg(
        pl.col("compute_s").sum(), pl.col("device").sort().last()
    )
    shares = counted.filter(pl.col("model_version").is_not_null()).with_columns(
        (pl.col("rows_scored") / pl.col("rows_scored").sum().over(["day", "model_version"])).alias("share")
    )
    attributed = shares.join(per_version, on=["day", "model_version"], how="left").with_columns(
        (pl.col("share").fill_nan(0.0).fill_null(0.0) * pl.col("compute_s").fill_null(0.0)).alias("compute_s")
    )
    # Compute on a day and version with no rows scored to share it: kept, as the platform's own.
    explained = shares.group_by(["day", "model_version"]).agg(pl.col("rows_scored").sum().alias("rows"))
    orphan = (
        per_version.join(explained, on=["day", "model_version"], how="left")
        .filter(pl.col("rows").fill_null(0) == 0)
        .select(
            "day", pl.lit(UNATTRIBUTED).alias("tenant_id"), "model_version",
            pl.lit(None, pl.Int64).alias("price_version"), "compute_s", "device",
        )
    )  # fmt: skip
    no_version = counted.filter(pl.col("model_version").is_null()).with_columns(
        pl.lit(0.0).alias("compute_s"), pl.lit(None, pl.Utf8).alias("device")
    )
    out = pl.concat(
        [
            attributed.drop("share").select(list(USAGE_SCHEMA)),
            no_version.select(list(USAGE_SCHEMA)),
            orphan.with_columns(
                *[pl.lit(0, pl.Int64).alias(c) for c in ("requests", "rows_scored", "scored", "fallback",
                                                          "client_errors", "server_errors")],
                pl.lit(0.0).alias("gateway_s"),
            ).select(list(USAGE_SCHEMA)),
        ],
        how="vertical_relaxed",
    )  # fmt: skip
    return out.cast(USAGE_SCHEMA).sort(KEY, nulls_last=True)


def days_between(first: str, last: str) -> list[str]:
    a, b = date.fromisoformat(first), date.fromisoformat(last)
    return [(a + timedelta(days=i)).isoformat() for i in range((b - a).days + 1)]


def read_usage(
    serving_dir: Path | Sequence[Path], first_day: str, last_day: str, store=None
) -> tuple[pl.DataFrame, int]:
    """Usage of the days ``first_day``…``last_day`` (YYYY-MM-DD) from the gateway's exposure and compute logs, the
    price versions from ``store`` (a PolicyStore or PolicyReader; None: unpriced). Also returns how many exposure
    lines were skipped as not whole records (a torn line, never counted). ``serving_dir`` may be several (one per
    runtime replica, ``KeelHome.serving_dirs``): each Triton's counters are differenced on their own, then added."""
    from keel.exposure_log import scan_exposures
    from keel.metering.cost import price_versions

    dirs = [Path(serving_dir)] if isinstance(serving_dir, str | Path) else [Path(d) for d in serving_dir]
    records, skipped, deltas = [], 0, []
    for root in dirs:
        for day in days_between(first_day, last_day):
            scan = scan_exposures(root / "exposures", day=day)
            records += scan.records
            skipped += scan.skipped
        samples = read_compute_samples(root / "compute", first_day, last_day)
        before = _previous_day_file(root / "compute", first_day)
        baseline = read_compute_samples(root / "compute", before, before) if before else []
        deltas.append(compute_deltas(samples, baseline))
    mapping = price_versions(store, {r.get("policy_version") for r in records}) if store is not None else {}
    return usage_frame(records, pl.concat(deltas, how="vertical"), mapping.get), skipped


def _previous_day_file(directory: Path, first_day: str) -> str | None:
    """The newest day before ``first_day`` with a compute file: its last samples are where the period starts (the
    gateway writes every loaded version at least once a day, so that file has them all)."""
    earlier = [d for d in logged_days(directory, "compute") if d < first_day]
    return earlier[-1] if earlier else None


def finished_days(
    exposure_days: list[str], compute_days: list[str], today: str | Sequence[str], after: str | Collection[str] | None
) -> list[str]:
    """The days with traffic that can be metered now, oldest first, not metered yet (``after``: the last day metered,
    or the set of days metered).

    A day is finished when the gateway's clock (``today``) is past it and the gateway's compute sampler has written
    a sample on a later day (the day's last interval is closed: its compute is all in); with no later sample, two
    days after it (a gateway that stopped never writes one). Several use cases replayed on one clock log each in its
    own time (keel/clock.py; flights in 2013 beside hotels in 2017): ``today`` is then every use case's day, and a
    day is finished when no use case is on it and one is past it, its later sample within two days."""
    todays = [today] if isinstance(today, str) else list(today)
    done = (lambda d: d <= after) if isinstance(after, str) else (lambda d: d in set(after or ()))
    out = []
    for day in sorted(set(exposure_days)):
        past = [t for t in todays if t > day]
        if done(day) or day in todays or not past:
            continue
        two_days_on = (date.fromisoformat(day) + timedelta(days=2)).isoformat()
        if any(day < c <= two_days_on for c in compute_days) or min(past) >= two_days_on:
            out.append(day)
    return out


def day_groups(days: list[str], gap_days: int = 7) -> list[list[str]]:
    """Finished days in runs: a new run where the next day is more than ``gap_days`` on (two use cases' time spans,
    years apart, are never one range of empty days)."""
    groups: list[list[str]] = []
    for day in days:
        if groups and (date.fromisoformat(day) - date.fromisoformat(groups[-1][-1])).days <= gap_days:
            groups[-1].append(day)
        else:
            groups.append([day])
    return groups


@dataclass(frozen=True)
class MeteredDays:
    """The sensor's cursor: every day up to ``through`` is metered, and ``also`` the days after it that are (use
    cases on one clock meter their days interleaved). Compact: ``through`` moves up over every logged day metered.
    A cursor of an earlier keel (a bare day) is ``through`` alone."""

    through: str | None = None
    also: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> MeteredDays:
        if not text:
            return cls()
        if not text.startswith("{"):
            return cls(text)
        data = json.loads(text)
        return cls(data.get("through"), tuple(data.get("also") or ()))

    def done(self, day: str) -> bool:
        return (self.through is not None and day <= self.through) or day in self.also

    def days_done(self, logged: list[str]) -> set[str]:
        return {d for d in logged if self.done(d)}

    def with_days(self, days: list[str], logged: list[str]) -> MeteredDays:
        also = set(self.also) | set(days)
        through = self.through
        for day in sorted(logged):  # move ``through`` over the logged days metered, in order
            if (through is not None and day <= through) or day in also:
                through = max(through or day, day)
            else:
                break
        return MeteredDays(through, tuple(sorted(d for d in also if through is None or d > through)))

    def dump(self) -> str:
        return json.dumps({"through": self.through, "also": list(self.also)})


def logged_days(directory: Path, prefix: str) -> list[str]:
    """The days (YYYY-MM-DD) that have a ``<prefix>-YYYYMMDD.jsonl`` file in ``directory``."""
    from keel.exposure_log import day_stamp

    stamps = {day_stamp(p, prefix) for p in Path(directory).glob(f"{prefix}-*.jsonl")} - {""}
    return sorted(f"{s[:4]}-{s[4:6]}-{s[6:]}" for s in stamps)


def spend_by_tenant(serving_dir, store, tenants: Iterable[str], first_day: str, last_day: str) -> dict[str, float]:
    """What each of ``tenants`` spent from ``first_day`` to ``last_day`` (inclusive), read from the gateway's logs and
    priced by the store's price tables: the budget's view (unpriced usage counts as nothing spent)."""
    from keel.metering.cost import cost_frame, price_tables

    wanted = sorted(set(tenants))
    usage, _ = read_usage(serving_dir, first_day, last_day, store)
    usage = usage.filter(pl.col("tenant_id").is_in(wanted))
    cost = cost_frame(usage, price_tables(store, usage["price_version"].to_list()))
    spend = dict.fromkeys(wanted, 0.0)
    for tenant, amount in cost.group_by("tenant_id").agg(pl.col("cost").fill_null(0.0).sum()).iter_rows():
        spend[tenant] = float(amount)
    return spend
