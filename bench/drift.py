"""Drift speed: keel vs a per-column scipy loop vs Evidently's DataDriftPreset, and online feature reads.

Same data for all, same run: 20 numeric columns of real 2013 flights and weather (joined on origin and hour),
January–March resampled to N reference rows, July or December resampled to N current rows (seeded).

- keel: ``compare`` against a reference profile built once (the build is timed separately; it is reused by every
  window). Statistics per column: normalised W1, KS + p-value, PSI, KL.
- scipy: ``wasserstein_distance`` + ``ks_2samp`` per column, normalised by the reference standard deviation.
- Evidently 0.7.23: ``DataDriftPreset(method="wasserstein", threshold=0.15)``; it needs pandas 2, so it runs in
  bench/.venv-evidently (created on first use) on the same Parquet files; only ``Report.run`` is timed.

Verdicts (normalised W1 > 0.15) are compared column by column with the exact scipy computation.
Then ``get_online_features`` for 100 flights per call against the SQLite online store: p50/p99 over 5,000 calls —
reading every key from SQLite, with the warm snapshot cache, and with the answer also turned into per-flight dicts.

    .venv/bin/python bench/drift.py                  # 1M × 1M × 20 columns (~5 minutes with Evidently)
    .venv/bin/python bench/drift.py --rows 200000 --skip-evidently
    .venv/bin/python bench/drift.py --online-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from scipy import stats  # noqa: E402

from keel.cli import partition_window  # noqa: E402
from keel.drift import DriftConfig, build_reference, compare  # noqa: E402
from keel.kernels import backend  # noqa: E402
from usecases.flights import usecase as FLIGHTS  # noqa: E402
from usecases.flights.data import MONTHS, read_raw, read_raw_month  # noqa: E402
from usecases.flights.features import FLIGHT_FEATURES  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
THRESHOLD = 0.15
FLIGHT_COLS = [
    "dep_time",
    "sched_dep_time",
    "dep_delay",
    "arr_time",
    "sched_arr_time",
    "arr_delay",
    "air_time",
    "distance",
    "hour",
    "minute",
    "flight",
]
WEATHER_COLS = ["temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib"]


def validated(table: str) -> pl.DataFrame:
    """The table as the pipeline validates it, month by month (freshness is measured per monthly partition)."""
    compiled = FLIGHTS.compiled_contract(table)
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    return pl.concat(
        [compiled.validate(read_raw_month(table, m), partition_window(m), references=refs).valid for m in MONTHS]
    )


def columns_frame() -> pl.DataFrame:
    flights, weather = validated("flights"), validated("weather")
    joined = flights.join(
        weather.select("origin", "time_hour", *WEATHER_COLS), on=["origin", "time_hour"], how="left"
    )
    return joined.select("month", *[pl.col(c).cast(pl.Float64) for c in FLIGHT_COLS + WEATHER_COLS]).rename(
        {"flight": "flight_number"}
    )


def resample(frame: pl.DataFrame, months: list[int], rows: int, seed: int) -> pl.DataFrame:
    part = frame.filter(pl.col("month").is_in(months)).drop("month")
    rng = np.random.default_rng(seed)
    return part[rng.integers(0, part.height, rows)]


def scipy_loop(ref: pl.DataFrame, cur: pl.DataFrame) -> dict[str, float]:
    out = {}
    for c in ref.columns:
        r = ref[c].drop_nulls().to_numpy()
        x = cur[c].drop_nulls().to_numpy()
        w = stats.wasserstein_distance(r, x)
        stats.ks_2samp(r, x)
        out[c] = w / np.std(r)
    return out


def evidently(ref_path: Path, cur_path: Path) -> dict:
    venv = HERE / ".venv-evidently"
    python = venv / "bin" / "python"
    if not python.exists():
        print("  creating bench/.venv-evidently (Evidently needs pandas 2) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(HERE / "requirements-evidently.txt")], check=True
        )
    out = subprocess.run(
        [str(python), str(HERE / "evidently_runner.py"), str(ref_path), str(cur_path), str(THRESHOLD)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def online_latency(
    calls: int = 5000, batch: int = 100, cache_size: int = 0, as_rows: bool = False
) -> dict[str, float]:
    from keel.features.online import get_online_features
    from keel.features.sqlite_store import SQLiteOnlineStore
    from usecases.flights.features import REQUEST_COLUMNS, build_views, offline_features

    flights, weather = validated("flights"), validated("weather")
    jan_feb = flights.filter(pl.col("month") <= 2)
    day = date(2013, 2, 20)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteOnlineStore(Path(tmp) / "online.sqlite", features=FLIGHT_FEATURES, cache_size=cache_size)
        store.write_snapshot(
            build_views(weather.filter(pl.col("month") <= 2), read_raw("planes"), jan_feb, as_of=day),
            as_of=day,
            partition="2013-02",
        )
        todays = jan_feb.filter((pl.col("month") == 2) & (pl.col("day") == 20))
        rows = offline_features(todays, weather, read_raw("planes"), jan_feb).select(REQUEST_COLUMNS).to_dicts()
        rng = np.random.default_rng(0)
        batches = [[rows[i] for i in rng.integers(0, len(rows), batch)] for _ in range(calls)]
        for b in batches[:100]:
            get_online_features(store, b)
        lat = []
        for b in batches:
            t = time.perf_counter()
            answer = get_online_features(store, b)
            if as_rows:
                answer.rows()
            lat.append(time.perf_counter() - t)
        store.close()
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-evidently", action="store_true")
    parser.add_argument("--online-only", action="store_true", help="only the get_online_features latency")
    parser.add_argument("--out", type=Path, default=None, help="default bench/out/drift.json (drift_online.json)")
    args = parser.parse_args()
    args.out = args.out or HERE / "out" / ("drift_online.json" if args.online_only else "drift.json")

    print(f"array backend: {backend().name}", flush=True)
    results: dict = {"rows": args.rows, "windows": {}}
    windows = [] if args.online_only else [("july", [7]), ("december", [12])]
    frame = columns_frame()
    reference = resample(frame, [1, 2, 3], args.rows, seed=1)
    results["columns"] = reference.width
    t = time.perf_counter()
    profile = build_reference(reference, window="2013-01..03")
    results["keel_reference_build_s"] = time.perf_counter() - t
    print(
        f"reference: {args.rows:,} rows × {reference.width} columns; keel profile built once in {results['keel_reference_build_s']:.2f}s",
        flush=True,
    )
    for label, months in windows:
        current = resample(frame, months, args.rows, seed=2)
        keel_times, scipy_times = [], []
        for _ in range(args.repeats):  # alternating rounds: machine noise hits both alike
            t = time.perf_counter()
            report = compare(profile, current, window=label, config=DriftConfig(numeric_threshold=THRESHOLD))
            keel_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            exact = scipy_loop(reference, current)
            scipy_times.append(time.perf_counter() - t)
        keel_s, scipy_s = statistics.median(keel_times), statistics.median(scipy_times)
        keel_verdict = {f.feature: bool(f.drifted) for f in report.features}
        exact_verdict = {c: v > THRESHOLD for c, v in exact.items()}
        row = {
            "keel_s": keel_s,
            "scipy_s": scipy_s,
            "drifted_exact": sorted(c for c, v in exact_verdict.items() if v),
        }
        row["keel_agrees"] = keel_verdict == exact_verdict
        print(f"\n== {label}: {args.rows:,} × {args.rows:,} × {reference.width} columns ==", flush=True)
        print(f"  keel     {keel_s:8.2f} s")
        print(f"  scipy    {scipy_s:8.2f} s   scipy / keel = {scipy_s / keel_s:.1f}x (target ≥ 5x)")
        if not args.skip_evidently:
            with tempfile.TemporaryDirectory() as tmp:
                ref_path, cur_path = Path(tmp) / "ref.parquet", Path(tmp) / "cur.parquet"
                reference.write_parquet(ref_path)
                current.write_parquet(cur_path)
                ev = evidently(ref_path, cur_path)
            ev_verdict = {c: v > THRESHOLD for c, v in ev["values"].items()}
            row |= {"evidently_s": ev["seconds"], "evidently_agrees": ev_verdict == exact_verdict}
            print(
                f"  evidently{ev['seconds']:8.2f} s   evidently / keel = {ev['seconds'] / keel_s:.1f}x (target ≥ 30x)"
            )
            if ev_verdict != exact_verdict:
                print(
                    f"  evidently verdict differs on: {sorted(c for c in exact_verdict if ev_verdict.get(c) != exact_verdict[c])}"
                )
        print(f"  drifted (exact): {', '.join(row['drifted_exact']) or 'none'}")
        print(f"  keel verdict = exact verdict on every column: {row['keel_agrees']}")
        results["windows"][label] = row
    print("\n== get_online_features, 100 flights per call, 5,000 calls (target p99 ≤ 2 ms) ==", flush=True)
    results["online"] = online_latency()
    print(
        f"  every key read from SQLite:  p50 {results['online']['p50_ms']:.3f} ms   p99 {results['online']['p99_ms']:.3f} ms"
    )
    results["online_cached"] = online_latency(cache_size=200_000)
    print(
        f"  snapshot read cache (warm):  p50 {results['online_cached']['p50_ms']:.3f} ms   p99 {results['online_cached']['p99_ms']:.3f} ms"
    )
    rows = results["online_cached_rows"] = online_latency(cache_size=200_000, as_rows=True)
    print(f"  warm, answers as dicts:      p50 {rows['p50_ms']:.3f} ms   p99 {rows['p99_ms']:.3f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
