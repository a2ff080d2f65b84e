"""``keel drift``: compare a data file with a reference file, per feature."""

from __future__ import annotations

import argparse
from pathlib import Path

from keel.cli.common import EXIT_OK, EXIT_PROBLEM
from keel.errors import DataReadError


def register(sub) -> None:
    drift = sub.add_parser("drift", help="compare a current data file with a reference file, per feature")
    drift.add_argument("--reference", required=True, type=Path, help="reference window (.csv or .parquet)")
    drift.add_argument("--current", required=True, type=Path, help="current window (.csv or .parquet)")
    drift.add_argument("--features", help="comma-separated feature names (default: every numeric and text column)")
    drift.add_argument("--out", required=True, type=Path, help="where to write report.json")
    drift.add_argument("--threshold", type=float, default=0.15, help="normalised Wasserstein threshold (numeric)")
    drift.add_argument("--categorical-threshold", type=float, default=0.1, help="Jensen-Shannon threshold")
    drift.set_defaults(func=_drift)


def _drift(args: argparse.Namespace) -> int:
    from keel.contracts.io import read_typed_data_file
    from keel.drift import DriftConfig, build_reference, compare
    from keel.storage import write_json_atomic

    reference = read_typed_data_file(args.reference)
    current = read_typed_data_file(args.current)
    features = [f.strip() for f in args.features.split(",") if f.strip()] if args.features else None
    if features:
        absent = [f for f in features if f not in reference.columns]
        if absent:
            raise DataReadError(f"{args.reference}: no column {', '.join(repr(a) for a in absent)} in the reference")
        numeric = [f for f in features if reference.schema[f].is_numeric()]
        categorical = [f for f in features if f not in numeric]
        profile = build_reference(reference, window=str(args.reference), numeric=numeric, categorical=categorical)
    else:
        profile = build_reference(reference, window=str(args.reference))
    if not profile.features:
        raise DataReadError(f"{args.reference}: no numeric or text columns to compare")
    config = DriftConfig(numeric_threshold=args.threshold, categorical_threshold=args.categorical_threshold)
    report = compare(profile, current, window=str(args.current), config=config)
    write_json_atomic(report.to_dict(), args.out)
    print(report.markdown())
    share = report.drifted_share
    print(
        f"verdict: {report.verdict} ({len(report.drifted_features)} of {len(report.evaluated)} features drifted"
        + (f", share {share:.0%})" if share is not None else ")")
    )
    print(f"wrote {args.out}")
    return EXIT_PROBLEM if report.drifted_features else EXIT_OK
