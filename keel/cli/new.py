"""``keel new NAME --from FILE --label COL --time COL``: a use-case package from a table, in seconds.

It profiles the table (types, ranges and quantiles, nulls, categories, duplicates, the time column's cadence and gaps),
prints what it found, and writes ``usecases/NAME/``: the source contract with each rule justified by the profile, the
request contract, the features (request features from the columns, point-in-time histories keyed by the category
columns), the label, the first model's months, a replay, a tier, a coarse model, the data dependency, PROFILE.md —
and the entry point in pyproject.toml. ``--dry-run`` prints the profile, the decisions and the files, and writes
nothing. docs/usecases.md starts here.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK


def register(sub) -> None:
    new = sub.add_parser("new", help="a use-case package from a table (csv or parquet): profiled, contracted, served")
    new.add_argument("name", help="the use case's name (a-z 0-9 _): its package usecases/NAME and its asset prefix")
    new.add_argument("--from", dest="source", required=True, type=Path, help="the table: a .csv or .parquet file")
    new.add_argument("--label", required=True, help="the column the model predicts")
    new.add_argument("--time", required=True, help="the column that says when a row happened (a date or a time)")
    new.add_argument("--entity", nargs="+", default=(), help="the columns that, with the day, identify a row")
    new.add_argument("--task", choices=("binary", "regression"),
                     help="binary (a 0/1 or true/false label, or --positive) or regression (default: from the label)")  # fmt: skip
    new.add_argument("--positive", help="a text label's value that is 1 (a binary model of it)")
    new.add_argument("--months", type=int, default=24,
                     help="the latest months of the table the use case covers (default 24; 0: all)")  # fmt: skip
    new.add_argument("--tier", choices=("L1", "L2", "L3"), default="L2", help="its serving tier (default L2)")
    new.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    new.add_argument("--force", action="store_true", help="replace the generated files of an existing package")
    new.add_argument("--dry-run", action="store_true", help="print the profile, the decisions and the files only")
    new.set_defaults(func=_new)


def _new(args: argparse.Namespace) -> int:
    from keel.new.plan import Options
    from keel.new.profile import describe
    from keel.new.scaffold import NewError, build, write

    if not args.source.is_file():
        print(f"keel: error: --from {args.source}: no such file", file=sys.stderr)
        return EXIT_BAD_INPUT
    command = "keel new " + " ".join(shlex.quote(a) for a in _argv(args))
    opts = Options(args.name, args.label, args.time, tuple(args.entity), args.task, args.positive, args.months,
                   args.tier)  # fmt: skip
    try:
        result = build(args.source, opts, args.root, command, progress=_say)
    except NewError as exc:
        print(f"keel: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    p = result.plan
    print(describe(result.profile))
    print(f"\n{p.task} model {p.model} on {p.label}{' = ' + p.positive if p.positive else ''}: trained on "
          f"{', '.join(p.train_months)}, validated and gated on {p.valid_month}; {p.months[0]} … {p.months[-1]}")  # fmt: skip
    print("defects found:" if p.defects else "defects found: none")
    for d in p.defects:
        print(f"  - {d}")
    print("rules:")
    for r in p.rules:
        print(f"  {r.id:<28} {r.fields.get('type'):<16} {r.fields.get('severity', 'critical'):<9} {r.action:<11} "
              f"{r.failing:>6} rows fail")  # fmt: skip
    print(f"features: {', '.join([f.name for f in p.features] + [h.name for h in p.histories])}")
    if p.ignored:
        print("not features: " + "; ".join(f"{c} ({why})" for c, why in p.ignored.items()))
    if args.dry_run:
        print(f"\nwould write {result.folder}/:")
        for rel, text in result.files.items():
            print(f"  {rel} ({len(text.splitlines())} lines)")
        if result.origin.copied:
            print(f"  data/{result.origin.copied} (a copy of {args.source})")
        print("(dry run: nothing written)")
        return EXIT_OK
    try:
        written = write(result, args.source, args.root, force=args.force, progress=_say)
    except NewError as exc:
        print(f"keel: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"\nwrote {len(written)} files under {result.folder}/ (PROFILE.md says what was seen and chosen). Next:")
    print("  scripts/setup                                   # the entry point and the data dependency, in seconds")
    print("  KEEL_UPDATE_SNAPSHOT=1 .venv/bin/pytest tests/test_definitions.py   # the Definitions now hold it")
    print(f"  KEEL_LIVE=0 KEEL_USECASES={p.name} scripts/up    # backfill, train, gate and serve {p.model}")
    return EXIT_OK


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _argv(args: argparse.Namespace) -> list[str]:
    source = re.sub(r"^.*/(site|dist)-packages/", "<site-packages>/", str(args.source))  # no machine's path
    out = [args.name, "--from", source, "--label", args.label, "--time", args.time]
    if args.entity:
        out += ["--entity", *args.entity]
    for flag, value in (("--task", args.task), ("--positive", args.positive)):
        if value:
            out += [flag, value]
    if args.months != 24:
        out += ["--months", str(args.months)]
    if args.tier != "L2":
        out += ["--tier", args.tier]
    return out
