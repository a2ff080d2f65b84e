"""The estimator of quality before the labels (keel/loop/estimate.py) on the real data, month by month, with the
verdict on concept drift from each month's labels (keel/loop/concept.py) — issue 62's measurement: does the estimate
hold on months without concept drift, and is every miss one the labels explain?

For each use case, its first model (as its training asset fits it) with the estimator its registry record keeps
(fitted on the model's validation month: flights' calibration on all of it, hotels' error model on the half early
stopping did not see) estimates every later month of its period from the scores alone; beside it the realized value,
the error, and the concept verdict. ``--own-calibration`` adds, for a binary model, the estimate with each month's
own calibration (what the labels show afterwards): how well the estimator does when its one assumption holds.

``--home DIR`` measures a live year's home instead (a ``scripts/up`` run's KEEL_HOME, finished or still going):
every served version's estimate beside its realized value per month, on the rows loop_report uses (the month's
labelled rows each served by the release live that day, keel/loop/report.py ``month_report``), with the estimators
its registry keeps and *this* checkout's concept test — so a change of the test is measured on a year already played.

Usage: .venv/bin/python scripts/estimator_months.py [flights|hotels ...] [--own-calibration]   (about a minute each)
       .venv/bin/python scripts/estimator_months.py --home /tmp/yhome [flights|hotels ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagster as dg  # noqa: E402
import polars as pl  # noqa: E402

from assets.challengers import read_months  # noqa: E402
from assets.models import training_config  # noqa: E402
from keel.home import KeelHome  # noqa: E402
from keel.ledger import Ledger  # noqa: E402
from keel.loop.concept import concept_drift  # noqa: E402
from keel.loop.estimate import (  # noqa: E402
    Calibration,
    Estimator,
    estimate_binary,
    estimation_error,
    estimator_record,
)
from keel.loop.report import Release, month_report  # noqa: E402
from keel.metrics import SUMMARY, summary  # noqa: E402
from keel.registry import ModelRegistry  # noqa: E402
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


def home_months(name: str, root: str) -> list[tuple[str, int, object]]:
    """(month, version, EstimateRecord) of each served version with an estimator, month by month, in the home
    ``root`` — the months whose feature partitions are stored and whose labels are in."""
    uc = get(name)
    fs, home = uc.features, KeelHome.of(root)
    entries = Ledger(home.ledger).of_line(uc.training_asset)
    releases = [
        Release(e.live_from, e.release_id, e.manifest["model"]["parts"]["sha256"])
        for e in entries
        if e.manifest.get("model", {}).get("parts", {}).get("sha256")
    ]
    out = []
    with ModelRegistry(home.registry) as reg:
        static = reg.load(releases[0].model_sha)
        for month in uc.months:
            try:
                frame = read_months(uc, home, [month])
            except dg.Failure:  # the month's features are not stored yet: the year has not got there
                continue
            report = month_report(
                month,
                frame,
                releases,
                reg.load,
                static,
                None,
                fs,
                estimator=lambda sha: Estimator.from_metadata(reg.get(uc.model.name, sha).metadata),
            )
            out += [(month, reg.version(uc.model.name, sha), e) for sha, e in report.estimates.items()]
    return out


def print_home(name: str, root: str) -> None:
    rows = home_months(name, root)
    print(f"\n{name} in {root}: each served version's estimate beside its realized value, month by month")
    for month, version, e in rows:
        err = f"{e.error:+.4f}" if e.metric == "auc" else f"{e.error:+.1%}"
        noise = f" ±{1.96 * e.realized_se / e.realized:.0%}" if e.realized_se is not None else ""
        verdict = e.concept.describe() if e.concept else "too few days to judge"
        held = "held  " if e.held else ("noise " if e.within_noise else "MISSED")
        print(
            f"  {month} v{version:<3} n={e.rows:5d} est {e.estimated:.4f} real {e.realized:.4f}{noise} {err:>8} "
            f"{held} | {verdict}"
        )
    clean = [r for r in rows if r[2].concept and not r[2].concept.drifted]
    own = [f"{m} v{v}" for m, v, e in clean if not e.held and not e.within_noise]
    noise = [f"{m} v{v}" for m, v, e in clean if not e.held and e.within_noise]
    print(
        f"  version-months without concept drift: {len(clean)} — held {sum(e.held for _, _, e in clean)}; "
        f"inside the realized value's own noise: {len(noise)} ({', '.join(noise) or '-'}); the estimator's own "
        f"error: {len(own)} ({', '.join(own) or '-'})"
    )


def main(argv: list[str]) -> int:
    own = "--own-calibration" in argv
    names = [a for a in argv if not a.startswith("--") and a not in _home(argv)] or ["flights", "hotels"]
    if _home(argv):
        for name in names:
            print_home(name, _home(argv)[0])
        return 0
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


def _home(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--home"]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
