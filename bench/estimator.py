"""Quality before the labels: keel's estimator (keel/loop/estimate.py) vs NannyML's CBPE and DLE, same data, same run.

The data (seeded, the same for both): a reference period of 100,000 rows whose labels are known and an analysis
period of 1,000,000 scored rows, shifted (the features crowd where the model is less sure), whose labels are drawn
only to measure how close each estimate came.

- binary: x ~ N(0, 1) in the reference, N(0.3, 0.6) in the analysis period; P(y = 1 | x) = sigmoid(2x); the served
  score an overconfident sigmoid(2.6x + 0.2) (the calibration has work to do). Estimated: AUC and log-loss.
- regression: y = 3x₁ − x₂ + noise whose spread grows with |x₁|; the prediction 3x₁ − x₂; the analysis period moved
  to larger |x₁|. Estimated: RMSE and MAE (keel: LightGBM error models; NannyML's DLE: its own LightGBM).

Timed: fitting on the reference (calibration or error models) and estimating the 1M rows, median of ``--repeat``
runs each. NannyML runs in bench/.venv-nannyml (created on first use from bench/requirements-nannyml.txt: it pins
pandas and scikit-learn releases of its own) on the same Parquet files, one whole-period chunk.

    .venv/bin/python bench/estimator.py                 # 1M rows, with NannyML
    .venv/bin/python bench/estimator.py --rows 200000 --skip-nannyml
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from keel.loop.estimate import Calibration, ErrorModel, estimate_binary, estimate_regression  # noqa: E402
from keel.metrics import auc, per_row_loss  # noqa: E402

HERE = Path(__file__).resolve().parent
NANNYML_VENV = HERE / ".venv-nannyml"


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def binary_period(n: int, centre: float, spread: float, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(centre, spread, n)
    y = (rng.random(n) < sigmoid(2 * x)).astype(np.int64)
    p = sigmoid(2.6 * x + 0.2)
    return pl.DataFrame({"x": x, "p": p, "yhat": (p >= 0.5).astype(np.int64), "y": y})


def regression_period(n: int, centre: float, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(centre, 1.0, n), rng.normal(0, 1.0, n)
    prediction = 3 * x1 - x2
    y = prediction + rng.normal(0, 1 + np.abs(x1), n)
    return pl.DataFrame({"x1": x1, "x2": x2, "yhat": prediction, "y": y})


def timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def keel_binary(ref: pl.DataFrame, ana: pl.DataFrame, repeat: int) -> dict:
    fit_ms, cal = timed(lambda: Calibration.fit(ref["p"].to_numpy(), ref["y"].to_numpy()), repeat)
    est_ms, est = timed(lambda: estimate_binary(ana["p"].to_numpy(), cal), repeat)
    return {
        "fit_ms": fit_ms,
        "estimate_ms": est_ms,
        "auc": est["auc"].value,
        "auc_se": est["auc"].se,
        "log_loss": est["log_loss"].value,
    }


def keel_regression(ref: pl.DataFrame, ana: pl.DataFrame, repeat: int) -> dict:
    cols = ["x1", "x2"]
    fit_ms, model = timed(
        lambda: ErrorModel.fit(ref[cols].to_numpy(), ref["yhat"].to_numpy(), ref["y"].to_numpy()), repeat
    )
    est_ms, est = timed(lambda: estimate_regression(ana[cols].to_numpy(), ana["yhat"].to_numpy(), model), repeat)
    return {"fit_ms": fit_ms, "estimate_ms": est_ms, "rmse": est["rmse"].value, "mae": est["mae"].value}


NANNYML_RUNNER = r"""
import json, statistics, sys, time
import pandas as pd, nannyml as nml
d, repeat = sys.argv[1], int(sys.argv[2])
out = {"nannyml": nml.__version__}
def timed(fn):
    ts, r = [], None
    for _ in range(repeat):
        t0 = time.perf_counter(); r = fn(); ts.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ts), r
ref, ana = pd.read_parquet(f"{d}/bin_ref.parquet"), pd.read_parquet(f"{d}/bin_ana.parquet").drop(columns=["y"])
def cbpe():
    return nml.CBPE(y_pred_proba="p", y_pred="yhat", y_true="y", metrics=["roc_auc"], chunk_number=1,
                    problem_type="classification_binary")
fit_ms, est = timed(lambda: cbpe().fit(ref))
est_ms, res = timed(lambda: est.estimate(ana))
row = res.to_df().iloc[-1]
out["binary"] = {"fit_ms": fit_ms, "estimate_ms": est_ms, "auc": float(row[("roc_auc", "value")])}
ref, ana = pd.read_parquet(f"{d}/reg_ref.parquet"), pd.read_parquet(f"{d}/reg_ana.parquet").drop(columns=["y"])
def dle():
    return nml.DLE(feature_column_names=["x1", "x2"], y_pred="yhat", y_true="y", metrics=["rmse", "mae"],
                   chunk_number=1)
fit_ms, est = timed(lambda: dle().fit(ref))
est_ms, res = timed(lambda: est.estimate(ana))
row = res.to_df().iloc[-1]
out["regression"] = {"fit_ms": fit_ms, "estimate_ms": est_ms, "rmse": float(row[("rmse", "value")]),
                     "mae": float(row[("mae", "value")])}
print(json.dumps(out))
"""


def nannyml(frames: dict[str, pl.DataFrame], repeat: int) -> dict | None:
    python = NANNYML_VENV / "bin" / "python"
    if not python.exists():
        print("bench: creating bench/.venv-nannyml (NannyML and its pandas; once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(NANNYML_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(HERE / "requirements-nannyml.txt")], check=True
        )
    with tempfile.TemporaryDirectory() as d:
        for name, frame in frames.items():
            frame.write_parquet(f"{d}/{name}.parquet")
        done = subprocess.run([str(python), "-c", NANNYML_RUNNER, d, str(repeat)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"bench: NannyML failed:\n{done.stderr[-2000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="analysis rows (the reference is a tenth)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-nannyml", action="store_true")
    args = parser.parse_args()
    n_ref = max(args.rows // 10, 1000)
    frames = {
        "bin_ref": binary_period(n_ref, 0.0, 1.0, 1),
        "bin_ana": binary_period(args.rows, 0.3, 0.6, 2),
        "reg_ref": regression_period(n_ref, 0.0, 3),
        "reg_ana": regression_period(args.rows, 1.0, 4),
    }
    ana_b, ana_r = frames["bin_ana"], frames["reg_ana"]
    truth = {
        "auc": auc(ana_b["p"].to_numpy(), ana_b["y"].to_numpy()),
        "log_loss": float(per_row_loss("binary", ana_b["p"].to_numpy(), ana_b["y"].to_numpy()).mean()),
        "rmse": float(np.sqrt(((ana_r["y"] - ana_r["yhat"]) ** 2).mean())),
        "mae": float((ana_r["y"] - ana_r["yhat"]).abs().mean()),
    }
    print(f"bench: {n_ref:,} reference rows, {args.rows:,} analysis rows; median of {args.repeat} runs", flush=True)
    kb = keel_binary(frames["bin_ref"], ana_b, args.repeat)
    kr = keel_regression(frames["reg_ref"], ana_r, args.repeat)
    nm = None if args.skip_nannyml else nannyml(frames, args.repeat)
    print("\n| estimator | task | fit (ms) | estimate (ms) | estimated | realized | error |")
    print("|---|---|---|---|---|---|---|")
    rows = [
        ("keel", "binary AUC", kb, "auc"),
        ("keel", "regression RMSE", kr, "rmse"),
        ("keel", "regression MAE", kr, "mae"),
    ]
    if nm:
        name = f"NannyML {nm['nannyml']}"
        rows += [
            (name, "binary AUC", nm["binary"], "auc"),
            (name, "regression RMSE", nm["regression"], "rmse"),
            (name, "regression MAE", nm["regression"], "mae"),
        ]
    for who, task, r, metric in rows:
        err = r[metric] - truth[metric]
        print(
            f"| {who} | {task} | {r['fit_ms']:,.0f} | {r['estimate_ms']:,.0f} | {r[metric]:.4f} | "
            f"{truth[metric]:.4f} | {err:+.4f} |"
        )
    print(f"\nkeel binary log-loss: estimated {kb['log_loss']:.4f}, realized {truth['log_loss']:.4f}")
    if nm:
        for task, k in (("binary", kb), ("regression", kr)):
            n = nm[task]
            print(
                f"{task}: NannyML / keel — fit {n['fit_ms'] / k['fit_ms']:.1f}×, "
                f"estimate {n['estimate_ms'] / k['estimate_ms']:.1f}×"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
