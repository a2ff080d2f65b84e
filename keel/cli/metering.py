"""``keel usage`` and ``keel cost``: what each tenant used and what it cost, from the gateway's exposure and compute logs
and the versioned price table (the same arithmetic as the ``usage`` and ``cost_report`` assets: keel/metering).

    keel usage [--from 2013-06-01] [--to 2013-06-30] [--tenant ops] [--by day,tenant_id] [--format table|csv|json]
    keel cost  [--from …] [--to …] [--tenant …] [--by tenant_id] [--format …] [--out FILE]

Days are UTC days of the gateway's clock (the simulated one in a live replay); both default to today on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, home_layout

GROUPABLE = ("day", "tenant_id", "model_version", "price_version")


def register(sub) -> None:
    for name, what in (
        ("usage", "requests, rows, outcomes, gateway and compute seconds per tenant, model version and day"),
        ("cost", "what that usage cost under the price table (cost policy) in force when it was served"),
    ):
        p = sub.add_parser(name, help=what, description=what)
        p.add_argument("--from", dest="first", help="first day, YYYY-MM-DD (default: today on the gateway's clock)")
        p.add_argument("--to", dest="last", help="last day, YYYY-MM-DD, inclusive (default: the --from day)")
        p.add_argument("--tenant", action="append", help="only this tenant (repeatable)")
        p.add_argument(
            "--by", help=f"sum by these columns (comma-separated, of {', '.join(GROUPABLE)}; default: no sum)"
        )
        p.add_argument("--format", choices=("table", "csv", "json"), default="table")
        p.add_argument("--out", type=Path, help="write to this file instead of standard output")
        p.set_defaults(func=_usage if name == "usage" else _cost)


def _day(text: str | None, flag: str) -> str | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} must be a day as YYYY-MM-DD, got {text!r}") from None


def _frame(args: argparse.Namespace, priced: bool):
    """The usage (or cost) rows the arguments ask for, or an exit code for bad input."""
    from keel.clock import SimClock
    from keel.metering.compute import day_of
    from keel.metering.cost import cost_frame, price_tables, totals
    from keel.metering.usage import read_usage
    from keel.policies import PolicyStore

    try:
        first = _day(args.first, "--from")
        last = _day(args.last, "--to")
    except argparse.ArgumentTypeError as exc:
        print(f"keel: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    home = home_layout()
    first = first or day_of(SimClock(home.clock).now().timestamp())
    last = last or first
    if last < first:
        print(f"keel: error: --to {last} is before --from {first}", file=sys.stderr)
        return EXIT_BAD_INPUT
    by = [c.strip() for c in args.by.split(",")] if args.by else []
    unknown = [c for c in by if c not in GROUPABLE]
    if unknown:
        print(f"keel: error: --by {unknown[0]!r} is not one of {', '.join(GROUPABLE)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    store = PolicyStore(home.policies) if home.policies.exists() else None
    try:
        frame, skipped = read_usage([d.root for d in home.serving_dirs()], first, last, store)
        if args.tenant:
            frame = frame.filter(frame["tenant_id"].is_in(args.tenant))
        if priced:
            frame = cost_frame(frame, price_tables(store, frame["price_version"].to_list()) if store else {})
    finally:
        if store is not None:
            store.close()
    if skipped:
        print(f"keel: {skipped} exposure-log lines were not whole records and were not metered", file=sys.stderr)
    if by:
        if priced:
            frame = totals(frame, by)
        else:
            import polars as pl

            numeric = [c for c in frame.columns if c not in (*GROUPABLE, "device")]
            frame = frame.group_by(by).agg(pl.col(numeric).sum()).sort(by, nulls_last=True)
    return frame, first, last


def _emit(frame, args: argparse.Namespace, first: str, last: str, what: str, footer: str = "") -> int:
    import polars as pl

    if args.format == "csv":
        text = frame.write_csv()
    elif args.format == "json":
        text = json.dumps(frame.to_dicts(), indent=1, default=str) + "\n"
    elif frame.is_empty():
        text = f"no {what} between {first} and {last}\n"
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
            text = f"{what}, {first} … {last}\n{frame}\n{footer}"
    if args.out:
        from keel.storage import write_text_atomic

        write_text_atomic(text, args.out)
        print(f"wrote {frame.height} rows to {args.out}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _usage(args: argparse.Namespace) -> int:
    got = _frame(args, priced=False)
    if isinstance(got, int):
        return got
    frame, first, last = got
    return _emit(frame, args, first, last, "usage")


def _cost(args: argparse.Namespace) -> int:
    got = _frame(args, priced=True)
    if isinstance(got, int):
        return got
    frame, first, last = got
    footer = ""
    if not frame.is_empty():
        lines = [f"total {t['cost']:.6f} {t['currency']}" for t in _by_currency(frame)]
        unpriced = (
            int(frame["unpriced_rows"].sum())
            if "unpriced_rows" in frame.columns
            else int(frame["cost"].is_null().sum())
        )
        if unpriced:
            lines.append(f"{unpriced} unpriced rows (served before any price table): not costed")
        footer = "\n".join(lines) + "\n"
    return _emit(frame, args, first, last, "cost", footer)


def _by_currency(frame) -> list[dict]:
    import polars as pl

    priced = frame.filter(pl.col("currency").is_not_null())
    return priced.group_by("currency").agg(pl.col("cost").sum()).sort("currency").to_dicts()
