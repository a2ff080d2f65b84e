"""Do live years from clean homes agree? (issue 32: "the same ledger of promotions, model hashes and simulated days
± 1, and loop_report's May–December means equal to 3 decimals").

For each home (a ``$KEEL_HOME`` that ``KEEL_LIVE_CLOCK=stepped scripts/up`` filled), reads

- the release ledger: per model line, every release that put another model live (assets.loop.model_changes) — its
  simulated day and the model's sha256;
- loop_report's latest materialization per month, from the home's Dagster instance: every row (served, static,
  naive, expanding) and metric of every month (a month one home lacks is a difference);
- each use case's traffic totals (sent, ok, failed: the replay's running totals);
- each use case's canary decisions (promote, rollback), from loop_report's ``actions`` tables;

prints them side by side and says what differs (``compare``, pure: tests/test_compare_years.py plants differences). Exit status 0 when every home agrees with the first, 1 otherwise.

Usage: .venv/bin/python scripts/compare_years.py /tmp/yhomeA /tmp/yhomeB [/tmp/yhomeC ...] [--day-tolerance 1]
       .venv/bin/python scripts/compare_years.py /tmp/yhomeIdle /tmp/yhomeBusy --day-tolerance 3 --decisions-only --bar
         (issue 62: an idle and a busy year decide the same within ± 3 days, and each meets the bar: ``bar``)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagster as dg  # noqa: E402

from assets.loop import model_changes  # noqa: E402
from assets.usecase import wiring  # noqa: E402
from keel.home import KeelHome  # noqa: E402
from keel.ledger import Ledger, model_line  # noqa: E402
from keel.usecase import UseCase, installed  # noqa: E402

ROWS = ("served", "static", "naive", "expanding")
TRAFFIC = ("sent", "ok", "failed")  # a replay's running totals (gpu_runtime.replay --live) compared


@dataclass(frozen=True)
class Decision:
    """A canary's end as loop_report's ``actions`` show it: its simulated day, ``promote`` or ``rollback``, the
    canary (``<model>.<tag>-v<version>``: the challenger) and the days from its gate month's end (None: unknown)."""

    day: date
    action: str
    canary: str
    days_after_labels: float | None = None


@dataclass
class Year:
    """What one home's live year did: per model line its promotions (simulated day, sha256); per use case each
    month's latest loop_report (``<row>_<metric>`` → value), its canaries' decisions and its traffic totals."""

    promotions: dict[str, list[tuple[date, str]]]
    reports: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)
    decisions: dict[str, list[Decision]] = field(default_factory=dict)


def promotions(home: KeelHome) -> dict[str, list[tuple[date, str]]]:
    """model line → [(simulated day it went live, model sha256), …] in ledger order."""
    with Ledger(home.ledger) as ledger:
        entries = ledger.log()
    lines: dict[str, list] = {}
    for e in entries:
        lines.setdefault(model_line(e.manifest), []).append(e)
    return {line: [(e.live_from.date(), sha) for e, sha in model_changes(es)] for line, es in sorted(lines.items())}


def latest_reports(home: KeelHome, uc: UseCase) -> dict[str, dict]:
    """month → the metadata of the month's latest loop_report materialization."""
    instance = dg.DagsterInstance.from_config(str(home.root / "dagster_home"))
    records = instance.fetch_materializations(wiring(uc).key("loop_report"), limit=1000).records
    latest: dict[str, dict] = {}
    for r in records:  # newest first: each month's latest report
        latest.setdefault(r.asset_materialization.partition, r.asset_materialization.metadata)
    return dict(sorted(latest.items()))


def report_values(latest: dict[str, dict], uc: UseCase) -> dict[str, dict[str, float | None]]:
    """month → ``<row>_<metric>`` → value, of each month's report metadata (every row and metric it holds)."""
    keys = [f"{row}_{metric}" for row in ROWS for metric in uc.metrics]
    return {m: {k: meta[k].value for k in keys if k in meta} for m, meta in latest.items()}


def decisions(reports: dict[str, dict]) -> list[Decision]:
    """Every canary promotion and rollback in the months' ``actions`` tables (a run that did not succeed left out;
    one decision reported by two months counted once), in simulated order."""
    seen: dict[tuple[str, str], Decision] = {}
    for meta in reports.values():
        table = meta.get("actions")
        for record in table.value.records if table is not None else []:
            a = record.data
            action = a.get("action", "").removeprefix("canary ")
            if action not in ("promote", "rollback") or a.get("status") != "SUCCESS":
                continue
            canary = a.get("detail", "").partition(":")[0]
            d = Decision(date.fromisoformat(a["simulated"][:10]), action, canary, a.get("days_after_labels"))
            seen.setdefault((action, canary), d)
    return sorted(seen.values(), key=lambda d: (d.day, d.canary))


def read_year(home: Path) -> Year:
    layout = KeelHome.of(home)
    year = Year(promotions(layout))
    for uc in installed().values():
        latest = latest_reports(layout, uc)
        year.reports[uc.name] = report_values(latest, uc)
        year.decisions[uc.name] = decisions(latest)
        path = layout.serving.live_traffic(uc.name)
        totals = json.loads(path.read_text()) if path.exists() else {}
        year.traffic[uc.name] = {k: int(totals.get(k, 0)) for k in TRAFFIC}
    return year


# Issue 62's bar over each use case's live span — the months loop_report scored served rows in but the first, which
# the first model serves under every policy (flights May–December 2013, hotels December 2016–August 2017): served no
# worse than the expanding reference on each metric (log-loss: within 0.002) and better than the static and naive
# baselines; every canary promoted within 20 simulated days of the end of the month whose labels decided it.
HIGHER_IS_BETTER = {"auc"}
REFERENCE_SLACK = {"log_loss": 0.002}
PROMOTION_DAYS = 20


def span_means(reports: dict[str, dict[str, float | None]]) -> tuple[list[str], dict[str, float]]:
    """The live span's months (those with a served score, but the first) and each ``<row>_<metric>``'s mean over
    them (a month without a value left out of that mean)."""
    scored = [
        m for m in sorted(reports) if any(k.startswith("served_") and v is not None for k, v in reports[m].items())
    ]
    span = scored[1:]
    sums: dict[str, list[float]] = {}
    for m in span:
        for k, v in reports[m].items():
            if v is not None:
                sums.setdefault(k, []).append(v)
    return span, {k: sum(vs) / len(vs) for k, vs in sums.items()}


def bar(year: Year) -> list[str]:
    """Where ``year`` misses issue 62's bar (empty: it holds); prints each use case's span means on the way."""
    failures: list[str] = []
    for uc, reports in sorted(year.reports.items()):
        span, means = span_means(reports)
        metrics = [k.removeprefix("served_") for k in reports[span[0]] if k.startswith("served_")] if span else []
        if not metrics:
            failures.append(f"{uc}: no month of the live span has a served score")
            continue
        print(f"  {uc}, {span[0]} … {span[-1]} ({len(span)} months), " + " / ".join(metrics) + ":")
        for row in ROWS:
            print(f"    {row:<10} " + " / ".join(f"{means.get(f'{row}_{m}', float('nan')):.4f}" for m in metrics))
        for m in metrics:
            served, sign = means.get(f"served_{m}"), 1 if m in HIGHER_IS_BETTER else -1
            for row in ("expanding", "static", "naive"):
                other = means.get(f"{row}_{m}")
                if served is None or other is None:
                    failures.append(f"{uc}: no {m} mean for served or {row}")
                elif row == "expanding" and sign * (served - other) < -REFERENCE_SLACK.get(m, 0.0):
                    failures.append(f"{uc}: served {m} {served:.4f} worse than the expanding reference's {other:.4f}")
                elif row != "expanding" and sign * (served - other) <= 0:
                    failures.append(f"{uc}: served {m} {served:.4f} not better than {row}'s {other:.4f}")
        for d in year.decisions.get(uc, []):
            days = "?" if d.days_after_labels is None else f"{d.days_after_labels:g}"
            print(f"    {d.day} {d.action:<8} {d.canary} ({days} days after its gate month)")
            if d.action == "promote" and (d.days_after_labels is None or d.days_after_labels > PROMOTION_DAYS):
                failures.append(
                    f"{uc}: {d.canary} promoted {days} days after its gate month (at most {PROMOTION_DAYS})"
                )
    return failures


def compare(years: dict[str, Year], day_tolerance: int, decimals: int = 3) -> list[str]:
    """Every difference between each year and the first (empty: they agree): their decisions (``compare_decisions``)
    and their reports (``compare_reports``). Prints the tables on the way."""
    return compare_decisions(years, day_tolerance) + compare_reports(years, decimals)


def compare_decisions(years: dict[str, Year], day_tolerance: int) -> list[str]:
    """Every difference in what each year decided against the first: the models promoted and their days (the
    ledger), and the canaries promoted and rolled back and their days (loop_report's actions), ± ``day_tolerance``."""
    names = list(years)
    base_name, base = names[0], years[names[0]]
    problems: list[str] = []
    for line in sorted(set().union(*(y.promotions for y in years.values()))):
        print(f"\npromotions of {line or '(no model line)'}:")
        for name, y in years.items():
            shown = ", ".join(f"{d} {sha[:10]}" for d, sha in y.promotions.get(line, []))
            print(f"  {name:<10} {shown or '—'}")
        ours = base.promotions.get(line, [])
        for name in names[1:]:
            other = years[name].promotions.get(line, [])
            if [s for _, s in other] != [s for _, s in ours]:
                problems.append(f"{name}: {line}: other models promoted than in {base_name}")
                continue
            for (d0, sha), (d1, _) in zip(ours, other, strict=True):
                if abs((d1 - d0).days) > day_tolerance:
                    problems.append(f"{name}: {line}: {sha[:10]} live on {d1}, in {base_name} on {d0}")
    for uc in sorted(set().union(*(y.decisions for y in years.values()))):
        print(f"\ncanary decisions, {uc}:")
        for name, y in years.items():
            shown = ", ".join(f"{d.day} {d.action} {d.canary}" for d in y.decisions.get(uc, []))
            print(f"  {name:<10} {shown or '—'}")
        ours = [(d.action, d.canary) for d in base.decisions.get(uc, [])]
        for name in names[1:]:
            other = years[name].decisions.get(uc, [])
            if [(d.action, d.canary) for d in other] != ours:
                problems.append(f"{name}: {uc}: other canaries promoted or rolled back than in {base_name}")
                continue
            for d0, d1 in zip(base.decisions.get(uc, []), other, strict=True):
                if abs((d1.day - d0.day).days) > day_tolerance:
                    problems.append(f"{name}: {uc}: {d1.action} {d1.canary} on {d1.day}, in {base_name} on {d0.day}")
    return problems


def compare_reports(years: dict[str, Year], decimals: int = 3) -> list[str]:
    """Every difference in what each year reported against the first: each month's loop_report — every month any
    home has, every row and metric any home's report of it has, to ``decimals`` —, and each use case's traffic totals
    (equal)."""
    names = list(years)
    base_name, base = names[0], years[names[0]]
    problems: list[str] = []
    for uc in sorted(set().union(*(y.reports for y in years.values()))):
        months = sorted(set().union(*(y.reports.get(uc, {}) for y in years.values())))
        print(f"\nloop_report, {uc}: {len(months)} months")
        for month in months:
            reports = {n: years[n].reports.get(uc, {}).get(month) for n in names}
            for n, r in reports.items():
                if r is None:
                    problems.append(f"{n}: {uc}: no loop_report for {month}")
            keys = sorted(set().union(*(r for r in reports.values() if r)))
            for k in keys:
                values = {n: (r or {}).get(k) for n, r in reports.items() if r is not None}
                shown = {n: None if v is None else round(v, decimals) for n, v in values.items()}
                if len(set(shown.values())) > 1:
                    problems.append(f"{uc} {month} {k}: " + ", ".join(f"{n} {v}" for n, v in shown.items()))
        for name, y in years.items():
            print(f"  traffic {name:<10} " + ", ".join(f"{k} {y.traffic.get(uc, {}).get(k)}" for k in TRAFFIC))
        for name in names[1:]:
            if years[name].traffic.get(uc) != base.traffic.get(uc):
                problems.append(f"{name}: {uc} traffic {years[name].traffic.get(uc)} vs {base.traffic.get(uc)} in "
                                f"{base_name}")  # fmt: skip
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("homes", nargs="+", type=Path, help="KEEL_HOMEs of finished stepped live years")
    parser.add_argument("--day-tolerance", type=int, default=1, help="simulated days a decision may move (1)")
    parser.add_argument(
        "--decisions-only",
        action="store_true",
        help="compare promotions and rollbacks only, not every month's report and the traffic (years whose decisions "
        "moved a day score a month differently)",
    )
    parser.add_argument("--bar", action="store_true", help="also check each year against issue 62's bar (above)")
    args = parser.parse_args()
    missing = [h for h in args.homes if not (h / "ledger.sqlite").exists()]
    if missing:
        parser.error(f"not a keel home with a ledger: {', '.join(map(str, missing))}")
    years = {h.name: read_year(h) for h in args.homes}
    if args.decisions_only:
        problems = compare_decisions(years, args.day_tolerance)
    else:
        problems = compare(years, args.day_tolerance)
    if args.bar:
        for name, year in years.items():
            print(f"\nthe bar, {name}:")
            problems += [f"{name}: {p}" for p in bar(year)]
    print()
    if problems:
        print(f"{len(problems)} difference(s) or miss(es):", *problems, sep="\n  ")
        return 1
    agreed = (
        "the same decisions"
        if args.decisions_only
        else "the same decisions, every month's loop_report to 3 decimals, the same traffic"
    )
    print(
        f"the {len(years)} years agree: {agreed} (± {args.day_tolerance} day)"
        + (", and each meets the bar" if args.bar else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
