"""The estimator of quality before the labels (keel/loop/estimate.py) on the real data, month by month, with the
verdict on concept drift from each month's labels (keel/loop/concept.py) — issue 62's measurement: does the estimate
hold on months without concept drift, and is every miss one the labels explain?

For each use case, its first model (as its training asset fits it) with the estimator its registry record keeps
(fitted on the model's validation month: flights' calibration on all of it, hotels' error model on the half early
stopping did not see) estimates every later month of its period from the scores alone; beside it the realized value,
the error, and the concept verdict. ``--own-calibration`` adds, for a binary model, the estimate with each month's
own calibration (what the labels show afterwards): how well the estimator does when its one assumption holds.

Usage: .venv/bin/python scripts/estimator_months.py [flights|hotels ...] [--own-calibration]   (about a minute each)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import polars as pl  # noqa: E402

from assets.models import training_config  # noqa: E402
from keel.loop.concept import concept_drift  # noqa: E402
from keel.loop.estimate import (  # noqa: E402
    Calibration,
    Estimator,
    estimate_binary,
    estimation_error,
    estimator_record,
)
from keel.metrics import SUMMARY, summary  # noqa: E402
from keel.training.model import (  # noqa: E402
    feature_matrix,
    labelled_days,
    month_of,
    predict,
    train_model,
)
from keel.usecase import get  # noqa: E402


def features_of(name: str) -> pl.DataFrame:
    if name == "flights":
        from scripts.loop_policies import features

        return features()
    from keel.features.offline import offline_features
    from usecases.hotels.replay import valid_bookings

    valid = valid_bookings()
    return offline_features(get("hotels").features, valid, {}, valid)


def months_of(name: str, own_calibration: bool) -> list[dict]:
    uc = get(name)
    fs, task = uc.features, uc.task
    feats = features_of(name)
    text = train_model(feats, training_config(uc), fs).text  # as the use case's training asset fits it
    valid = month_of(feats, uc.model.valid_month, fs)
    estimator = Estimator.from_metadata(estimator_record(text, valid, fs, uc.model.valid_month))
    metric = SUMMARY[task][0]
    rows = []
    for month in (m for m in uc.months if m > uc.model.valid_month):
        frame = month_of(feats, month, fs)
        scores, labels = predict(text, frame, fs)
        if labels.size < 30:
            continue
        x, days = feature_matrix(frame, fs), labelled_days(frame, fs)
        estimated = estimator.estimate(scores, x)[metric].value
        realized = summary(task, scores, labels)[metric]
        error, held = estimation_error(metric, estimated, realized)
        concept = concept_drift(estimator, scores, labels, days, x)
        row = dict(month=month, estimated=estimated, realized=realized, error=error, held=held, concept=concept)
        if own_calibration and task == "binary":
            own = estimate_binary(scores, Calibration.fit(scores, labels))[metric].value
            row["own"] = estimation_error(metric, own, realized)[0]
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    own = "--own-calibration" in argv
    names = [a for a in argv if not a.startswith("--")] or ["flights", "hotels"]
    for name in names:
        metric = SUMMARY[get(name).task][0]
        rows = months_of(name, own)
        print(f"\n{name}: the first model's {metric}, estimated from the scores alone vs realized on the labels")
        for r in rows:
            err = f"{r['error']:+.4f}" if metric == "auc" else f"{r['error']:+.1%}"
            extra = f"  own calibration {r['own']:+.4f}" if "own" in r else ""
            verdict = r["concept"].describe() if r["concept"] else "too few days to judge"
            held = "held  " if r["held"] else "MISSED"
            print(
                f"  {r['month']}  est {r['estimated']:.4f}  real {r['realized']:.4f}  {err:>8}  {held}{extra}  | {verdict}"
            )
        clean = [r for r in rows if r["concept"] and not r["concept"].drifted]
        missed = [r for r in rows if not r["held"]]
        unexplained = [r["month"] for r in missed if not (r["concept"] and r["concept"].drifted)]
        print(
            f"  months without concept drift: {len(clean)} — the estimate held in {sum(r['held'] for r in clean)}; "
            f"missed: {len(missed)} of {len(rows)}, explained by concept drift: {len(missed) - len(unexplained)}"
            + (f" (not: {', '.join(unexplained)})" if unexplained else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
