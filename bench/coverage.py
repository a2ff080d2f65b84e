"""Realized interval coverage month by month (issue 61 item 6): does a regression model's split-conformal interval
cover what it declares on the months it then serves — calibrated as keel calibrates it now (on the validation rows
early stopping never saw, keel.training.model.split_validation), and as it was before (on the rows early stopping
chose the model on)?

For each served month M of a use case: a model trained on every labelled month before M − 1 (the loop's expanding
candidate), early-stopped and calibrated on M − 1, with keel's own code (train_model, interval_record's split);
then on M's rows the share of labels inside ŷ ± q — what loop_report shows per month as ``interval_coverage`` for
the answers a live replay served — against the declared coverage. Beside it, keel's drift report of M against M − 1
(the use case's monitoring: its thresholds, categorical and unmonitored columns, the label included): a month whose
features or label drifted is outside the conformal guarantee (exchangeable rows), and is marked.

    .venv/bin/python bench/coverage.py                      # hotels (its own package)
    .venv/bin/python bench/third_table.py /tmp/jfk_weather.csv     # a third table (JFK hourly weather, 2013)
    .venv/bin/keel new jfkweather --from /tmp/jfk_weather.csv --label temp --time time_hour --months 0 --root /tmp/jfk
    .venv/bin/python bench/coverage.py --usecases-dir /tmp/jfk/usecases --usecase usecases.jfkweather \
        --rows usecases.jfkweather.replay:valid_rows

Pure CPU, no runtime: LightGBM and keel's drift kernels; a minute or two a table.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from keel import intervals  # noqa: E402
from keel.drift.profile import build_reference  # noqa: E402
from keel.drift.report import DriftConfig, compare  # noqa: E402
from keel.features.offline import offline_features  # noqa: E402
from keel.training.model import (  # noqa: E402
    DEFAULT_PARAMS,
    TrainingConfig,
    month_of,
    predict,
    split_validation,
    train_model,
    training_rows,
)

TOLERANCE = 0.03  # the bound: within 3 points of the declared coverage


def load(target: str):
    """``module:function`` → the function."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def month_row(uc, features: pl.DataFrame, months: list[str], served: str, coverage: float) -> dict:
    """The model that serves ``served``: trained on every month before the one before it, early-stopped and
    calibrated on that one; its coverage on ``served`` calibrated both ways, and the drift of ``served``."""
    fs = uc.features
    i = months.index(served)
    config = TrainingConfig(
        tuple(months[: i - 1]), months[i - 1], params={**DEFAULT_PARAMS, **uc.model.params}, early_stopping_rounds=20
    )
    text = train_model(features, config, fs).text
    _, valid = training_rows(features, config, fs)
    stopped_on, never_seen = split_validation(valid, fs)
    now = intervals.fit(*predict(text, never_seen, fs), coverage, "never seen")
    before = intervals.fit(*predict(text, valid, fs), coverage, "early stopping's")  # the calibration of before
    scores, labels = predict(text, month_of(features, served, fs), fs)
    # the guarantee where it holds — rows exchangeable with the calibration's: half of the never-seen rows calibrate,
    # the other half are served (the same month, no drift by construction)
    cs, cl = predict(text, never_seen, fs)
    half = intervals.fit(cs[0::2], cl[0::2], coverage, "never seen, even half")
    same_month = intervals.realized_coverage(cs[1::2], cl[1::2], half.half_width)
    numeric, categorical = uc.monitored
    reference = build_reference(valid, window=months[i - 1], numeric=numeric, categorical=categorical)
    drift = compare(
        reference,
        month_of(features, served, fs),
        window=served,
        config=DriftConfig(thresholds=dict(uc.monitoring.thresholds)),
    )
    return {
        "month": served,
        "rows": int(labels.size),
        "calibration_rows": now.calibration_rows,
        "coverage": intervals.realized_coverage(scores, labels, now.half_width),
        "coverage_before": intervals.realized_coverage(scores, labels, before.half_width),
        "coverage_same_month": same_month,
        "half_width": now.half_width,
        "half_width_before": before.half_width,
        "drifted": drift.drifted_features,
    }


def table(rows: list[dict], declared: float) -> str:
    out = [
        "| served month | rows | calibration rows | q now / before | coverage now | before | same month, unseen rows | "
        "drifted (vs the month before) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if abs(r["coverage"] - declared) <= TOLERANCE else " ✗"
        out.append(
            f"| {r['month']} | {r['rows']} | {r['calibration_rows']} | {r['half_width']:.2f} / "
            f"{r['half_width_before']:.2f} | {r['coverage']:.1%}{mark} | {r['coverage_before']:.1%} | "
            f"{r['coverage_same_month']:.1%} | "
            f"{', '.join(r['drifted']) or '—'} |"
        )
    return "\n".join(out)


def summary(rows: list[dict], declared: float) -> str:
    calm = [r for r in rows if not r["drifted"]]
    lines = [f"declared coverage {declared:.0%}; a month is held when its coverage is within {TOLERANCE:.0%} of it"]
    same = [r["coverage_same_month"] for r in rows]
    lines.append(
        f"the same month's unseen rows (exchangeable: no drift): median {statistics.median(same):.1%}, "
        f"held {sum(abs(c - declared) <= TOLERANCE for c in same)} of {len(same)}, pooled "
        f"{sum(same) / len(same):.1%}"
    )
    for name, subset in (("every month", rows), ("months without drift", calm)):
        if not subset:
            lines.append(f"{name}: none")
            continue
        now = [r["coverage"] for r in subset]
        before = [r["coverage_before"] for r in subset]
        held = sum(abs(c - declared) <= TOLERANCE for c in now)
        lines.append(
            f"{name} ({len(subset)}): median coverage {statistics.median(now):.1%} now, "
            f"{statistics.median(before):.1%} calibrated before; held {held} of {len(subset)}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--usecase", default="usecases.hotels", help="the use case's package (default: hotels)")
    parser.add_argument(
        "--rows", default="usecases.hotels.replay:valid_bookings", help="module:function giving its valid rows"
    )
    parser.add_argument("--first", type=int, default=3, help="months of training before the first served month")
    parser.add_argument("--usecases-dir", type=Path, help="a folder of use case packages keel new wrote elsewhere")
    args = parser.parse_args()
    if args.usecases_dir:  # its packages importable as usecases.<name>, beside this checkout's
        import usecases

        usecases.__path__.append(str(args.usecases_dir.resolve()))
    uc = importlib.import_module(args.usecase).usecase
    if uc.features.label.task != "regression":
        raise SystemExit(f"bench/coverage: {uc.name}'s label is {uc.features.label.task}: intervals are regression's")
    rows = load(args.rows)()
    print(f"bench/coverage: {uc.name}: {rows.height:,} valid rows; building the features …", flush=True)
    features = offline_features(uc.features, rows, {}, rows)
    fs = uc.features
    months = sorted(set(features.select(fs.entity.partition_day.dt.strftime("%Y-%m")).to_series().to_list()))
    declared = uc.model.interval_coverage
    out = []
    for served in months[args.first + 1 :]:
        out.append(month_row(uc, features, months, served, declared))
        r = out[-1]
        print(
            f"  {served}: coverage {r['coverage']:.1%} (before: {r['coverage_before']:.1%}, same month: {r['coverage_same_month']:.1%})",
            flush=True,
        )
    print(f"\n## {uc.name}\n\n{table(out, declared)}\n\n{summary(out, declared)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
