"""Experiment analysis speed: keel's aggregation against the same query in DuckDB SQL, and the drill-down.

One run, one Parquet file of N exposure rows × 2 arms × 10 segments (keel.experiments.simulator.synthetic_exposures:
a mean metric with a pre-period covariate, a 0/1 metric, a ratio pair; channel and band as further dimensions; a
planted drop in segment=7 × channel=2):

- keel: ``analysis.aggregate`` over ``pl.scan_parquet`` grouped by variant × segment — the sufficient statistics of
  all three metrics (n, Σy, Σy², Σx, Σx², Σxy per metric), the one pass every statistic is computed from;
- DuckDB: the same sums in one SQL ``GROUP BY`` over ``read_parquet`` — the peer the issue names;
- both results are compared value by value (they must agree to 1e-9 relative) before any time is reported;
- the drill-down: ``analyze`` with dimensions segment, channel, band — aggregation to the cube from Parquet plus the
  recursive search — and the drill-down alone on the cube.

Medians of ``--repeats`` runs, keel and DuckDB interleaved.

    .venv/bin/python bench/experiments.py [--rows 10000000] [--repeats 5] [--json bench/out/experiments.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402
import polars as pl  # noqa: E402

from keel.experiments.analysis import aggregate, analyze  # noqa: E402
from keel.experiments.drilldown import drilldown  # noqa: E402
from keel.experiments.simulator import synthetic_exposures  # noqa: E402
from keel.experiments.spec import parse_spec  # noqa: E402

SPEC = parse_spec(
    {
        "id": "bench",
        "metrics": [
            {"name": "value", "kind": "mean", "column": "value", "covariate": "pre_value", "direction": "increase"},
            {"name": "converted", "kind": "proportion", "column": "converted", "direction": "increase"},
            {
                "name": "rpo",
                "kind": "ratio",
                "numerator": "revenue",
                "denominator": "offers",
                "direction": "increase",
            },
        ],
        "dimensions": ["segment", "channel", "band"],
        "guardrails": [{"metric": "converted", "threshold": 0.02, "action": "pause"}],
    }
)

SQL = """
SELECT variant, segment, count(*) AS units,
  count(value) FILTER (WHERE pre_value IS NOT NULL) AS value__n, sum(value) AS value__sy,
  sum(value * value) AS value__syy, sum(pre_value) AS value__sx, sum(pre_value * pre_value) AS value__sxx,
  sum(pre_value * value) AS value__sxy,
  count(converted) AS converted__n, sum(converted::DOUBLE) AS converted__sy,
  sum(converted::DOUBLE * converted) AS converted__syy,
  count(revenue) FILTER (WHERE offers IS NOT NULL) AS rpo__n, sum(revenue) AS rpo__sy,
  sum(revenue * revenue) AS rpo__syy, sum(offers::DOUBLE) AS rpo__sx, sum(offers::DOUBLE * offers) AS rpo__sxx,
  sum(offers * revenue) AS rpo__sxy
FROM read_parquet(?) GROUP BY variant, segment
"""


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exposures.parquet"
        t, data = timed(
            lambda: synthetic_exposures(
                args.rows, seed=1, lift=0.0, planted={"segment": 7, "channel": 2}, planted_lift=-0.04
            )
        )
        data.write_parquet(path, row_group_size=1_000_000)
        del data
        print(
            f"{args.rows:,} rows → {path.stat().st_size / 2**20:.0f} MiB Parquet (generated in {t:.1f} s)", flush=True
        )

        con = duckdb.connect()
        con.execute(f"SET threads = {os.cpu_count()}")

        def keel_agg():
            return aggregate(pl.scan_parquet(path), SPEC, by=("segment",))

        def duck_agg():
            return pl.from_arrow(con.sql(SQL.replace("?", f"'{path}'")).to_arrow_table())

        # same answer first
        k = keel_agg().sort("variant", "segment")
        d = duck_agg().sort("variant", "segment")
        for col in k.columns:
            if col in ("variant", "segment"):
                assert k[col].to_list() == d[col].cast(k[col].dtype).to_list(), col
                continue
            a, b = k[col].cast(pl.Float64).to_numpy(), d[col].cast(pl.Float64).to_numpy()
            rel = abs(a - b).max() / max(abs(b).max(), 1e-300)
            assert rel < 1e-9, f"{col}: keel and DuckDB disagree (max relative difference {rel:.2e})"
        print(f"keel and DuckDB agree on all {len(k.columns) - 2} sufficient statistics × {k.height} groups")

        keel_t, duck_t = [], []
        for _ in range(args.repeats):
            keel_t.append(timed(keel_agg)[0])
            duck_t.append(timed(duck_agg)[0])
        keel_med, duck_med = statistics.median(keel_t), statistics.median(duck_t)

        analyze_t, drill_t = [], []
        report = None
        for _ in range(args.repeats):
            t, report = timed(lambda: analyze(pl.scan_parquet(path), SPEC, min_support=1000))
            analyze_t.append(t)
            cube = aggregate(pl.scan_parquet(path), SPEC)
            t, _ = timed(
                lambda cube=cube: drilldown(cube, "variant", "control", "treatment", SPEC.dimensions, "converted")
            )
            drill_t.append(t)
        con.close()

    result = {
        "rows": args.rows,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "keel_aggregate_s": keel_t,
        "duckdb_sql_s": duck_t,
        "keel_aggregate_median_s": keel_med,
        "duckdb_sql_median_s": duck_med,
        "ratio_keel_over_duckdb": keel_med / duck_med,
        "analyze_with_drilldown_s": analyze_t,
        "analyze_with_drilldown_median_s": statistics.median(analyze_t),
        "drilldown_on_cube_median_s": statistics.median(drill_t),
        "drilldown_explanation": report["drilldown"]["converted"]["explanation"],
    }
    print(
        f"aggregation, median of {args.repeats}: keel {keel_med:.3f} s, DuckDB SQL {duck_med:.3f} s → "
        f"keel/DuckDB {keel_med / duck_med:.2f}x (target ≤ 1.2x)"
    )
    print(
        f"analyze with the drill-down (Parquet → cube → every statistic → 3-dimension drill-down): median "
        f"{result['analyze_with_drilldown_median_s']:.2f} s (target ≤ 8 s); the drill-down alone on the cube "
        f"{result['drilldown_on_cube_median_s'] * 1000:.0f} ms"
    )
    print(f"drill-down found: {result['drilldown_explanation']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
