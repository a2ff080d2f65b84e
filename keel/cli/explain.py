"""``keel explain``: why a registered model scored chosen rows as it did — LIME's local weights next to the exact
TreeSHAP contributions, their agreement, and what each costs relative to plain inference.

    keel explain --method lime [--model NAME] [--version N] [--month YYYY-MM] [--rows 20 | --id ID …]
                 [--samples 5000] [--top-k 5] [--seed 2013] [--out report.json] [--json]

The rows come from the month's feature table of the model's use case (its ``feature_table`` asset under
$KEEL_HOME/storage; the newest month there unless ``--month``), the model from the registry (the champion unless
``--version``). Exit 0 with the report; 2 when the model, month or an id is not there.
"""

from __future__ import annotations

import argparse
import json
import sys

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, home_layout, model_usecase
from keel.errors import DataReadError


def register(sub) -> None:
    p = sub.add_parser(
        "explain",
        help="LIME vs TreeSHAP for a registered model on chosen rows of its feature table: agreement and cost",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--method", choices=("lime",), required=True, help="the model-agnostic method set beside TreeSHAP")
    p.add_argument("--model", help="the model (default: the installed use case's)")
    p.add_argument("--version", type=int, help="registry version (default: the champion)")
    p.add_argument("--month", help="whose feature table to explain (YYYY-MM; default: the newest there)")
    p.add_argument("--rows", type=int, default=20, help="how many rows, drawn with --seed (default 20)")
    p.add_argument("--id", action="append", dest="ids", help="explain this row id (repeatable; instead of --rows)")
    p.add_argument("--samples", type=int, default=5000, help="LIME's perturbation samples per row (default 5000)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--seed", type=int, default=2013)
    p.add_argument("--out", help="write the full report (every row) as JSON here")
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

    uc = model_usecase(args)
    model, fs = uc.model.name, uc.features
    if args.rows < 1 or args.samples < 100 or not 1 <= args.top_k <= len(fs.names):
        print(f"keel: error: --rows ≥ 1, --samples ≥ 100, --top-k in 1…{len(fs.names)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    home = home_layout()
    table_dir = asset_file(home.storage, [uc.name, uc.feature_table], "x").parent  # its assets: <use case>/<asset>
    month = args.month or max((p.stem for p in table_dir.glob("*.parquet")), default=None)
    path = asset_file(home.storage, [uc.name, uc.feature_table], month or "none")
    if month is None or not path.exists():
        raise DataReadError(
            f"no {uc.feature_table} for {month or 'any month'} at {home.shown(path.parent)}: materialize the month "
            "first (scripts/up)"
        )
    with ModelRegistry(home.registry) as registry:
        if args.version is None:
            sha = registry.alias(model, "champion")
            if sha is None:
                raise DataReadError(f"{model} has no champion in the registry; pass --version")
            version = registry.version(model, sha)
        else:
            version, sha = args.version, registry.sha_of_version(model, args.version)
        booster = lgb.Booster(model_str=registry.load(sha))
    id_column, entity = fs.entity.id_column, fs.entity.name
    frame = pl.read_parquet(path).sort(id_column)
    if args.ids:
        missing = sorted(set(args.ids) - set(frame[id_column]))
        if missing:
            raise DataReadError(f"{entity} {missing[0]} is not among the {frame.height:,} rows of {month}")
        chosen = frame.filter(pl.col(id_column).is_in(args.ids))
    else:
        rng = np.random.default_rng(args.seed)
        chosen = frame[np.sort(rng.choice(frame.height, size=min(args.rows, frame.height), replace=False))]
    rng = np.random.default_rng(args.seed)
    background = feature_matrix(
        frame[np.sort(rng.choice(frame.height, size=min(5000, frame.height), replace=False))], fs
    )
    print(
        f"keel explain: {model} v{version} on {chosen.height} rows ({entity}) of {month}, LIME with "
        f"{args.samples} samples each …", file=sys.stderr, flush=True,
    )  # fmt: skip
    report = compare_lime(
        booster, fs, background, feature_matrix(chosen, fs), chosen[id_column].to_list(), samples=args.samples,
        top_k=args.top_k, seed=args.seed, model_version=version,
    )  # fmt: skip
    data = report.as_dict() | {"model": model, "month": month, "summary": report.summary()}
    if args.out:
        write_json_atomic(data, args.out)
    if args.json:
        print(json.dumps(data, indent=1))
        return EXIT_OK
    print(report.summary())
    for f in report.per_row:
        shap = ", ".join(f"{n} {v:+.3f}" for n, v in f.shap_top[:3])
        lime = ", ".join(f"{n} {v:+.3f}" for n, v in f.lime_top[:3])
        print(f"  {f.row_id}  score {f.score:.3f}  ρ {f.spearman:+.2f}  TreeSHAP: {shap}  |  LIME: {lime}")
    if args.out:
        print(f"full report: {args.out}")
    return EXIT_OK
