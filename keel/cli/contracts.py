"""``keel contracts``: data contracts: lint a contract, validate a data file."""

from __future__ import annotations

import argparse
from pathlib import Path

from keel.cli.common import EXIT_OK, EXIT_PROBLEM, Parser
from keel.errors import DataReadError


def register(sub) -> None:
    contracts = sub.add_parser("contracts", help="data contracts: lint a contract, validate a data file")
    csub = contracts.add_subparsers(dest="action", required=True, parser_class=Parser)
    validate = csub.add_parser("validate", help="validate a CSV or Parquet file against a contract")
    validate.add_argument("--contract", required=True, type=Path, help="contract YAML file")
    validate.add_argument("--data", required=True, type=Path, help="data file (.csv or .parquet)")
    validate.add_argument(
        "--out", required=True, type=Path, help="directory for valid.parquet, quarantine.parquet, report.json"
    )
    validate.add_argument("--dry-run", action="store_true", help="report everything, change and write no rows")
    validate.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="DATASET.COLUMN=FILE",
        help="values for an in_set rule's reference, read from FILE's column (repeatable)",
    )
    validate.add_argument(
        "--partition",
        help="partition key recorded with quarantined rows; YYYY-MM or YYYY-MM-DD also sets the window that freshness "
        "rules measure against (default: the newest event time in the file)",
    )
    validate.set_defaults(func=_contracts_validate)
    lint = csub.add_parser("lint", help="check a contract file without data")
    lint.add_argument("file", type=Path)
    lint.set_defaults(func=_contracts_lint)


def _contracts_lint(args: argparse.Namespace) -> int:
    from keel.contracts.spec import load_contract

    spec = load_contract(args.file)
    print(
        f"{args.file}: ok — contract '{spec.name}' v{spec.version}, {len(spec.columns)} columns, {len(spec.rules)} rules, sha256 {spec.content_hash[:12]}"
    )
    return EXIT_OK


def _contracts_validate(args: argparse.Namespace) -> int:
    from keel.contracts.derived import as_written, derive_missing
    from keel.contracts.engine import CompiledContract
    from keel.contracts.io import read_data_file
    from keel.contracts.spec import load_contract
    from keel.storage import write_json_atomic, write_parquet_atomic

    spec = load_contract(args.contract)
    df, renamed = as_written(read_data_file(args.data), spec)
    df, derived = derive_missing(df, spec)
    partition = partition_window(args.partition) if args.partition else None
    references = {}
    for item in args.reference:
        name, sep, file = item.partition("=")
        if not sep or "." not in name:
            raise DataReadError(f"--reference {item!r}: expected DATASET.COLUMN=FILE")
        column = name.split(".", 1)[1]
        frame = read_data_file(file)
        if column not in frame.columns:
            raise DataReadError(f"{file}: no column '{column}' for reference {name}")
        references[name] = frame[column]
    result = CompiledContract(spec).validate(
        df, partition, dry_run=True if args.dry_run else None, references=references
    )
    rep = result.report
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not rep.dry_run:
        write_parquet_atomic(result.valid, out / "valid.parquet")
        write_parquet_atomic(result.quarantine, out / "quarantine.parquet")
        write_parquet_atomic(result.rejected, out / "rejected.parquet")
    report = rep.to_dict() | {"contract_file": str(args.contract), "data_file": str(args.data)}
    write_json_atomic(report, out / "report.json")  # written last: its presence means the outputs are complete
    mode = "dry run: " if rep.dry_run else ""
    if renamed:
        print("read as the contract names them: " + ", ".join(f"{a!r} as {b}" for a, b in renamed.items()))
    if derived:
        print(f"derived (the file does not carry them; the contract's reader adds them): {', '.join(derived)}")
    planned = rep.planned
    print(
        f"{mode}{rep.rows_in:,} rows in → {planned['valid']:,} valid ({planned['enriched']:,} enriched), "
        f"{planned['quarantined']:,} quarantined, {planned['rejected']:,} rejected"
    )
    for r in rep.rules:
        if r.failed:
            print(f"  {r.id:<36} {r.severity:<8} {r.action:<10} {r.failed:>10,} rows  {r.reason}")
    if rep.missing_columns:
        print(f"  missing columns: {', '.join(rep.missing_columns)}")
    if rep.unexpected_columns:
        print(f"  unexpected columns ({spec.unexpected_columns}): {', '.join(rep.unexpected_columns)}")
    verdict = "EXCEEDED" if rep.budget_exceeded else "ok"
    print(
        f"critical failures: {rep.critical_failed_rows:,} rows ({rep.critical_failed_fraction:.3%}), budget {rep.budget_text}: {verdict}"
    )
    print(f"wrote {out / 'report.json'}")
    return EXIT_PROBLEM if rep.budget_exceeded else EXIT_OK


def partition_window(key: str):
    """``2013-01`` → that month, ``2013-01-05`` → that day (UTC); any other key is recorded without a window."""
    from datetime import UTC, datetime, timedelta

    from keel.contracts.engine import PartitionWindow

    for fmt in ("%Y-%m", "%Y-%m-%d"):
        try:
            start = datetime.strptime(key, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
        if fmt == "%Y-%m":
            end = (
                start.replace(year=start.year + 1, month=1)
                if start.month == 12
                else start.replace(month=start.month + 1)
            )
        else:
            end = start + timedelta(days=1)
        return PartitionWindow(key, start, end)
    return PartitionWindow(key)
