"""What simple retraining policies would have served the hotel's rate quotes, offline, at quote time: for each arrival
month December 2016 – August 2017, the RMSE and MAE of the static first model and of models refitted at the start of
the month each booking was *quoted* in — what loop_report's baselines do (keel/loop/report.py) — on the bookings
quoted from the first release on (2016-11-15). docs/live.md quotes its output.

- ``static``: fitted on arrivals of July–September 2016, early-stopped on October (the first model);
- ``naive``: refitted at the quote month's start on the four arrival months before it (three fitted, the last
  early-stopped on), no gate — loop_report's naive baseline;
- ``rolling``: the loop's rolling candidate, three months before the newest labelled, early-stopped on its days 1–14
  as the loop does (the best of 200 trees: hotels' ``Loop.early_stopping_rounds``);
- ``expanding``: all labelled history (July 2016 … quote month − 2), early-stopped the same way on month − 1's days
  1–14;
- ``committee``: the mean raw score of the static model and this quote month's ``expanding`` (and the previous
  month's, when the use case's ``Loop.committee_previous``; keel/loop/committee.py), as the loop's committee averages
  them;
- ``recalibrated``: the static model with a bias fitted on month − 1's arrivals of days 1–14 (keel/loop/recalibrate.py,
  the loop's recalibrated candidate of the champion);
- ``robust``: the expanding window fitted to the median (LightGBM's L1 loss), early-stopped the same way — the loop's
  robust candidate.

Usage: .venv/bin/python scripts/hotel_policies.py   (about a minute; reads the package's bookings)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datetime import date  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from keel.features.offline import offline_features  # noqa: E402
from keel.loop.candidates import ROBUST_OBJECTIVE  # noqa: E402
from keel.loop.committee import committee_model_text  # noqa: E402
from keel.loop.recalibrate import affine_model_text, fit_recalibration  # noqa: E402
from keel.loop.report import naive_window  # noqa: E402
from keel.metrics import summary  # noqa: E402
from keel.training.model import TrainingConfig, month_of, predict, train_model  # noqa: E402
from keel.usecase import get  # noqa: E402
from usecases.hotels.replay import valid_bookings  # noqa: E402

FIRST_RELEASE = date(2016, 11, 15)
ARRIVALS = ("2016-12", *(f"2017-{m:02d}" for m in range(1, 9)))


def month_before(month: str, k: int = 1) -> str:
    y, m = (int(x) for x in month.split("-"))
    i = y * 12 + m - 1 - k
    return f"{i // 12}-{i % 12 + 1:02d}"


def main() -> int:
    uc = get("hotels")
    fs, params = uc.features, uc.model.params
    months = uc.months
    valid = valid_bookings()
    feats = offline_features(fs, valid, {}, valid)
    print(f"{feats.height:,} bookings with features", flush=True)

    def fit(train: tuple[str, ...], valid_month: str, days=None, patience: int = 20, objective=None) -> str:
        config = TrainingConfig(
            train_months=train,
            valid_month=valid_month,
            valid_days=days,
            params=params | {"objective": objective} if objective else params,
            early_stopping_rounds=patience,
        )
        return train_model(feats, config, fs).text

    static = fit(uc.model.train_months, uc.model.valid_month)  # the first model and naive: 20 rounds of patience
    patience = uc.loop.early_stopping_rounds
    quote_months = sorted({m for m in months if m >= FIRST_RELEASE.strftime("%Y-%m")} | set(ARRIVALS))
    policies: dict[str, dict[str, str]] = {
        p: {} for p in ("naive", "rolling", "expanding", "committee", "recalibrated", "robust")
    }
    for q in quote_months:
        newest = month_before(q)  # the newest labelled arrival month at q's start
        history = tuple(m for m in months if m < newest)
        window = naive_window(q, months=months)
        policies["naive"][q] = fit(*window) if window else static
        policies["rolling"][q] = fit(history[-3:], newest, (1, 14), patience)
        policies["expanding"][q] = fit(history, newest, (1, 14), patience)
        policies["robust"][q] = fit(history, newest, (1, 14), patience, ROBUST_OBJECTIVE)
        before = policies["expanding"].get(month_before(q)) if uc.loop.committee_previous else None
        members = [static, policies["expanding"][q]] + ([before] if before else [])
        policies["committee"][q] = committee_model_text(members, [1 / len(members)] * len(members))
        newest_days = month_of(feats, newest, fs).filter(fs.entity.partition_day.dt.day() < 15)
        raw, y = predict(static, newest_days, fs)  # a regression's raw score is its value
        bias = fit_recalibration("regression", raw, y, "bias")
        policies["recalibrated"][q] = affine_model_text(static, bias.a, bias.b)
        print(f"  refitted at {q}", flush=True)

    quoted = pl.col(fs.entity.date)
    table: dict[str, dict[str, dict]] = {}
    for arrival in ARRIVALS:
        rows = feats.filter(
            (fs.entity.partition_day.dt.strftime("%Y-%m") == arrival) & (quoted >= FIRST_RELEASE)
        ).filter(pl.col(fs.label.column).is_not_null())
        by_quote = rows.with_columns(quoted.dt.strftime("%Y-%m").alias("_q")).partition_by("_q", as_dict=True)
        table[arrival] = {}
        for name in ("static", *policies):
            parts = [predict(static if name == "static" else policies[name][q], part, fs)
                     for (q,), part in sorted(by_quote.items())]  # fmt: skip
            s, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            table[arrival][name] = summary("regression", s, y) | {"rows": y.size}
    names = ("static", *policies)
    print("\narrival   rows   " + "  ".join(f"{n:>15}" for n in names) + "   (RMSE / MAE)")
    for arrival, row in table.items():
        cells = "  ".join(f"{row[n]['rmse']:7.2f}/{row[n]['mae']:6.2f}" for n in names)
        print(f"{arrival}  {row['static']['rows']:5d}  {cells}")
    n = np.array([table[a]["static"]["rows"] for a in ARRIVALS])
    print("\nmean of the months (as loop_report's):")
    for name in names:
        rmse = np.mean([table[a][name]["rmse"] for a in ARRIVALS])
        mae = np.mean([table[a][name]["mae"] for a in ARRIVALS])
        pooled = np.sqrt(np.sum([table[a][name]["rmse"] ** 2 * table[a][name]["rows"] for a in ARRIVALS]) / n.sum())
        print(f"  {name:10} RMSE {rmse:6.2f}  MAE {mae:6.2f}   (pooled RMSE {pooled:6.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
