"""``keel explain``: why a registered model scored chosen flights as it did — LIME's local weights next to the exact
TreeSHAP contributions, their agreement, and what each costs relative to plain inference.

    keel explain --method lime [--model flight-delay] [--version N] [--month 2013-06] [--flights 20 | --flight-id ID …]
                 [--samples 5000] [--top-k 5] [--seed 2013] [--out report.json] [--json]

The flights come from the month's ``flight_features`` asset ($KEEL_HOME/storage), the model from the registry (the
champion unless ``--version``). Exit 0 with the report; 2 when the model, month or a flight id is not there.
"""

from __future__ import annotations

import argparse
import json
import sys

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, home_layout
from keel.errors import DataReadError


def register(sub) -> None:
    p = sub.add_parser(
        "explain",
        help="LIME vs TreeSHAP for a registered model on chosen flights: agreement and cost",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--method", choices=("lime",), required=True, help="the model-agnostic method set beside TreeSHAP")
    p.add_argument("--model", default="flight-delay")
    p.add_argument("--version", type=int, help="registry version (default: the champion)")
    p.add_argument("--month", default="2013-06", help="whose flight_features to explain (YYYY-MM)")
    p.add_argument("--flights", type=int, default=20, help="how many flights, drawn with --seed (default 20)")
    p.add_argument("--flight-id", action="append", help="explain this flight (repeatable; instead of --flights)")
    p.add_argument("--samples", type=int, default=5000, help="LIME's perturbation samples per flight (default 5000)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--seed", type=int, default=2013)
    p.add_argument("--out", help="write the full report (every flight) as JSON here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_explain)


def _explain(args: argparse.Namespace) -> int:
    import lightgbm as lgb
    import numpy as np
    import polars as pl

    from keel.explanations import compare_lime, feature_matrix
    from keel.home import asset_file
    from keel.registry import ModelRegistry
    from keel.storage import write_json_atomic
    from keel.usecase import only

    if args.flights < 1 or args.samples < 100 or not 1 <= args.top_k <= len(only().features.names):
        print(
            f"keel: error: --flights ≥ 1, --samples ≥ 100, --top-k in 1…{len(only().features.names)}", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    home = home_layout()
    path = asset_file(home.storage, ["flight_features"], args.month)
    if not path.exists():
        raise DataReadError(
            f"no flight_features for {args.month} at {home.shown(path)}: materialize the month first (scripts/up)"
        )
    with ModelRegistry(home.registry) as registry:
        if args.version is None:
            sha = registry.alias(args.model, "champion")
            if sha is None:
                raise DataReadError(f"{args.model} has no champion in the registry; pass --version")
            version = registry.version(args.model, sha)
        else:
            version, sha = args.version, registry.sha_of_version(args.model, args.version)
        booster = lgb.Booster(model_str=registry.load(sha))
    frame = pl.read_parquet(path).sort("flight_id")
    if args.flight_id:
        missing = sorted(set(args.flight_id) - set(frame["flight_id"]))
        if missing:
            raise DataReadError(f"flight {missing[0]} is not among the {frame.height:,} flights of {args.month}")
        chosen = frame.filter(pl.col("flight_id").is_in(args.flight_id))
    else:
        rng = np.random.default_rng(args.seed)
        chosen = frame[np.sort(rng.choice(frame.height, size=min(args.flights, frame.height), replace=False))]
    rng = np.random.default_rng(args.seed)
    background = feature_matrix(frame[np.sort(rng.choice(frame.height, size=min(5000, frame.height), replace=False))])
    print(
        f"keel explain: {args.model} v{version} on {chosen.height} flights of {args.month}, LIME with "
        f"{args.samples} samples each …", file=sys.stderr, flush=True,
    )  # fmt: skip
    report = compare_lime(
        booster, background, feature_matrix(chosen), chosen["flight_id"].to_list(), samples=args.samples,
        top_k=args.top_k, seed=args.seed, model_version=version,
    )  # fmt: skip
    data = report.as_dict() | {"model": args.model, "month": args.month, "summary": report.summary()}
    if args.out:
        write_json_atomic(data, args.out)
    if args.json:
        print(json.dumps(data, indent=1))
        return EXIT_OK
    print(report.summary())
    for f in report.per_flight:
        shap = ", ".join(f"{n} {v:+.3f}" for n, v in f.shap_top[:3])
        lime = ", ".join(f"{n} {v:+.3f}" for n, v in f.lime_top[:3])
        print(f"  {f.flight_id}  P(late) {f.score:.3f}  ρ {f.spearman:+.2f}  TreeSHAP: {shap}  |  LIME: {lime}")
    if args.out:
        print(f"full report: {args.out}")
    return EXIT_OK
