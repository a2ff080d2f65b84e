"""Do live years from clean homes agree? (issue 32: "the same ledger of promotions, model hashes and simulated days
± 1, and loop_report's May–December means equal to 3 decimals").

For each home (a ``$KEEL_HOME`` that ``KEEL_LIVE_CLOCK=stepped scripts/up`` filled), reads

- the release ledger: per model line, every release that put another model live (assets.loop.model_changes) — its
  simulated day and the model's sha256;
- loop_report's latest materialization per month, from the home's Dagster instance: the means over the live months
  after the first (as the live summary prints them) of every row (served, static, naive, expanding) and metric;

prints them side by side and says what differs. Exit status 0 when every home agrees with the first, 1 otherwise.

Usage: .venv/bin/python scripts/compare_years.py /tmp/yhomeA /tmp/yhomeB [/tmp/yhomeC ...] [--day-tolerance 1]
"""

from __future__ import annotations

import argparse
import sys
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


def promotions(home: KeelHome) -> dict[str, list[tuple[date, str]]]:
    """model line → [(simulated day it went live, model sha256), …] in ledger order."""
    with Ledger(home.ledger) as ledger:
        entries = ledger.log()
    lines: dict[str, list] = {}
    for e in entries:
        lines.setdefault(model_line(e.manifest), []).append(e)
    return {line: [(e.live_from.date(), sha) for e, sha in model_changes(es)] for line, es in sorted(lines.items())}


def report_means(home: KeelHome, uc: UseCase) -> dict[str, float]:
    """``<row>_<metric>`` → its mean over the live months after the first (the live summary's months)."""
    instance = dg.DagsterInstance.from_config(str(home.root / "dagster_home"))
    records = instance.fetch_materializations(wiring(uc).key("loop_report"), limit=100).records
    latest: dict[str, dict] = {}
    for r in records:  # newest first: each month's latest report
        latest.setdefault(r.asset_materialization.partition, r.asset_materialization.metadata)
    first_live = uc.months[len(uc.history_months)]
    months = [m for m in sorted(latest) if m > first_live]
    out = {}
    for row in ROWS:
        for metric in uc.metrics:
            key = f"{row}_{metric}"
            values = [latest[m][key].value for m in months if key in latest[m] and latest[m][key].value is not None]
            if values:
                out[key] = sum(values) / len(values)
    out["months"] = float(len(months))
    return out


def compare(homes: list[Path], day_tolerance: int) -> list[str]:
    """What differs between each home and the first (empty: they agree); prints both tables on the way."""
    problems: list[str] = []
    layouts = [KeelHome.of(h) for h in homes]
    ledgers = [promotions(h) for h in layouts]
    for line in sorted(set().union(*ledgers)):
        print(f"\npromotions of {line or '(no model line)'}:")
        for h, ledger in zip(homes, ledgers, strict=True):
            shown = ", ".join(f"{d} {sha[:10]}" for d, sha in ledger.get(line, []))
            print(f"  {h.name:<10} {shown or '—'}")
        base = ledgers[0].get(line, [])
        for h, ledger in zip(homes[1:], ledgers[1:], strict=True):
            other = ledger.get(line, [])
            if [s for _, s in other] != [s for _, s in base]:
                problems.append(f"{h.name}: {line}: other models promoted than in {homes[0].name}")
                continue
            for (d0, sha), (d1, _) in zip(base, other, strict=True):
                if abs((d1 - d0).days) > day_tolerance:
                    problems.append(f"{h.name}: {line}: {sha[:10]} live on {d1}, in {homes[0].name} on {d0}")
    for uc in installed().values():
        means = [report_means(h, uc) for h in layouts]
        print(f"\nloop_report means, {uc.name} ({', '.join(uc.metrics)}):")
        keys = [k for k in means[0] if k != "months"]
        print(f"  {'':<10} " + " ".join(f"{k:>18}" for k in keys))
        for h, m in zip(homes, means, strict=True):
            print(f"  {h.name:<10} " + " ".join(f"{m.get(k, float('nan')):18.4f}" for k in keys))
        for h, m in zip(homes[1:], means[1:], strict=True):
            for k in keys:
                if k not in m or round(m[k], 3) != round(means[0][k], 3):
                    problems.append(f"{h.name}: {uc.name} {k} {m.get(k)} vs {means[0][k]} in {homes[0].name}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("homes", nargs="+", type=Path, help="KEEL_HOMEs of finished stepped live years")
    parser.add_argument("--day-tolerance", type=int, default=1, help="simulated days a promotion may move (1)")
    args = parser.parse_args()
    missing = [h for h in args.homes if not (h / "ledger.sqlite").exists()]
    if missing:
        parser.error(f"not a keel home with a ledger: {', '.join(map(str, missing))}")
    problems = compare(args.homes, args.day_tolerance)
    print()
    if problems:
        print(f"{len(problems)} difference(s):", *problems, sep="\n  ")
        return 1
    print(
        f"the {len(args.homes)} years agree: the same promotions (± {args.day_tolerance} day) and means to 3 decimals"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
