"""Streaming throughput: the weather contract + windowed drift through the Flink path (parallelism 1 and 2) and the
batch path (polars) on the same rows, in one run.

The rows: every 2013 weather reading, repeated ``--copies`` times (distinct ``_source_row``, event-time order),
written once as the Flink job's CSV source. The Flink job is run twice per parallelism — on a tenth of the rows and on
all of them — so its fixed start-up (JVM, mini-cluster, planning) and its per-event rate can be told apart:
marginal events/s = (N − N/10) / (t_N − t_{N/10}). The batch path times validation + the same drift windows.

    .venv/bin/python bench/streaming.py [--copies 10] [--flink-python .venv-flink/bin/python] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

from keel.contracts.engine import CompiledContract  # noqa: E402
from keel.contracts.spec import load_contract  # noqa: E402
from keel.streaming.drift_windows import batch_windows, reference_bins  # noqa: E402
from usecases.flights import usecase as FLIGHTS  # noqa: E402
from usecases.flights.data import read_raw  # noqa: E402

CONTRACT = FLIGHTS.contract_path("weather")
SKIP = ["one_reading_per_local_hour", "observed_in_window"]
FEATURES = ["temp", "humid", "wind_speed", "visib"]


def flink_run(python: Path, source: Path, out: Path, reference: Path, parallelism: int) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run(
        [str(python), "-m", "keel.streaming.job", "--contract", str(CONTRACT), "--input", str(source), "--out",
         str(out), "--skip", *SKIP, "--event-time", "time_hour", "--window-s", "86400", "--reference", str(reference),
         "--parallelism", str(parallelism)],
        cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)}, capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"flink job failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    report = json.loads(r.stdout.strip().splitlines()[-1])
    return report | {"wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--flink-python", type=Path, default=REPO / ".venv-flink" / "bin" / "python")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not args.flink_python.exists():
        raise SystemExit(f"no Flink environment at {args.flink_python} (KEEL_WITH_FLINK=1 scripts/setup)")

    spec = load_contract(CONTRACT)
    raw = read_raw("weather").select("_source_row", *spec.column_names)
    n0 = raw.height
    rows = pl.concat(
        [raw.with_columns(pl.col("_source_row").cast(pl.Int64) + i * 1_000_000) for i in range(args.copies)]
    ).sort("time_hour", "_source_row")
    small = rows.gather_every(10)
    batch_contract = CompiledContract(replace(spec, rules=tuple(r for r in spec.rules if r.id not in SKIP)))
    reference = reference_bins(CompiledContract(spec).validate(raw).valid, FEATURES)
    print(f"{rows.height:,} weather events ({n0:,} readings × {args.copies}), {spec.name} contract", flush=True)

    t0 = time.perf_counter()
    result = batch_contract.validate(rows)
    windows = batch_windows(result.valid, "time_hour", timedelta(days=1), reference)
    batch_s = time.perf_counter() - t0
    out = {
        "events": rows.height,
        "batch": {"s": batch_s, "events_per_s": rows.height / batch_s, "windows": len(windows)},
    }
    print(
        f"batch (polars): {batch_s:.2f} s → {rows.height / batch_s:,.0f} events/s ({len(windows)} windows)",
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, frame in (("all", rows), ("tenth", small)):
            frame.with_columns(pl.col("_source_row").cast(pl.Int64)).write_csv(
                tmp / f"{name}.csv", include_header=False, null_value=""
            )
        (tmp / "reference.json").write_text(json.dumps(reference))
        for p in (1, 2):
            tenth = flink_run(args.flink_python, tmp / "tenth.csv", tmp / f"o{p}s", tmp / "reference.json", p)
            full = flink_run(args.flink_python, tmp / "all.csv", tmp / f"o{p}", tmp / "reference.json", p)
            assert full["valid"] == result.valid.height, (full["valid"], result.valid.height)
            marginal = (full["rows_in"] - tenth["rows_in"]) / max(full["total_s"] - tenth["total_s"], 1e-9)
            out[f"flink_p{p}"] = {
                "total_s": full["total_s"], "events_per_s": full["rows_in"] / full["total_s"],
                "startup_s_est": tenth["total_s"] - tenth["rows_in"] / marginal, "marginal_events_per_s": marginal,
                "windows": full["windows"],
            }  # fmt: skip
            print(
                f"flink p={p}: {full['total_s']:.1f} s for {full['rows_in']:,} events → {full['rows_in'] / full['total_s']:,.0f}"
                f" events/s overall; marginal {marginal:,.0f} events/s after ~{out[f'flink_p{p}']['startup_s_est']:.0f} s "
                f"of start-up; same valid rows as the batch path",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
