"""Do live years from clean homes agree? (issue 32: "the same ledger of promotions, model hashes and simulated days
± 1, and loop_report's May–December means equal to 3 decimals").

For each home (a ``$KEEL_HOME`` that ``KEEL_LIVE_CLOCK=stepped scripts/up`` filled), reads

- the release ledger: per model line, every release that put another model live (assets.loop.model_changes) — its
  simulated day and the model's sha256;
- loop_report's latest materialization per month, from the home's Dagster instance: every row (served, static,
  naive, expanding) and metric of every month (a month one home lacks is a difference);
- each use case's traffic totals (sent, ok, failed: the replay's running totals);

prints them side by side and says what differs (``compare``, pure: tests/test_compare_years.py plants differences). Exit status 0 when every home agrees with the first, 1 otherwise.

Usage: .venv/bin/python scripts/compare_years.py /tmp/yhomeA /tmp/yhomeB [/tmp/yhomeC ...] [--day-tolerance 1]
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


@dataclass
class Year:
    """What one home's live year did: per model line its promotions (simulated day, sha256); per use case each
    month's latest loop_report (``<row>_<metric>`` → value) and its traffic totals."""

    promotions: dict[str, list[tuple[date, str]]]
    reports: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)


def promotions(home: KeelHome) -> dict[str, list[tuple[date, str]]]:
    """model line → [(simulated day it went live, model sha256), …] in ledger order."""
    with Ledger(home.ledger) as ledger:
        entries = ledger.log()
    lines: dict[str, list] = {}
    for e in entries:
        lines.setdefault(model_line(e.manifest), []).append(e)
    return {line: [(e.live_from.date(), sha) for e, sha in model_changes(es)] for line, es in sorted(lines.items())}


def monthly_reports(home: KeelHome, uc: UseCase) -> dict[str, dict[str, float | None]]:
    """month → ``<row>_<metric>`` → value of the month's latest loop_report (every row and metric it holds)."""
    instance = dg.DagsterInstance.from_config(str(home.root / "dagster_home"))
    records = instance.fetch_materializations(wiring(uc).key("loop_report"), limit=1000).records
    latest: dict[str, dict] = {}
    for r in records:  # newest first: each month's latest report
        latest.setdefault(r.asset_materialization.partition, r.asset_materialization.metadata)
    keys = [f"{row}_{metric}" for row in ROWS for metric in uc.metrics]
    return {m: {k: meta[k].value for k in keys if k in meta} for m, meta in sorted(latest.items())}


def read_year(home: Path) -> Year:
    layout = KeelHome.of(home)
    year = Year(promotions(layout))
    for uc in installed().values():
        year.reports[uc.name] = monthly_reports(layout, uc)
        path = layout.serving.live_traffic(uc.name)
        totals = json.loads(path.read_text()) if path.exists() else {}
        year.traffic[uc.name] = {k: int(totals.get(k, 0)) for k in TRAFFIC}
    return year


def compare(years: dict[str, Year], day_tolerance: int, decimals: int = 3) -> list[str]:
    """Every difference between each year and the first (empty: they agree): the models promoted and their days
    (± ``day_tolerance``), each month's loop_report — every month any home has, every row and metric any home's
    report of it has, to ``decimals`` —, and each use case's traffic totals (equal). Prints the tables on the way."""
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
    parser.add_argument("--day-tolerance", type=int, default=1, help="simulated days a promotion may move (1)")
    args = parser.parse_args()
    missing = [h for h in args.homes if not (h / "ledger.sqlite").exists()]
    if missing:
        parser.error(f"not a keel home with a ledger: {', '.join(map(str, missing))}")
    problems = compare({h.name: read_year(h) for h in args.homes}, args.day_tolerance)
    print()
    if problems:
        print(f"{len(problems)} difference(s):", *problems, sep="\n  ")
        return 1
    print(
        f"the {len(args.homes)} years agree: the same promotions (± {args.day_tolerance} day), every month's loop_report "
        "to 3 decimals, the same traffic"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
