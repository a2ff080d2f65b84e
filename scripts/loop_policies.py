"""What simple retraining policies would have served, offline: for each month May–December 2013, the AUC and log-loss of
the static first model and of models refitted at the month's start (no delay) by each of the loop's recipes, on the
month's real flights — the reference issue 32's bar is set against. docs/live.md quotes its output.

- ``static``: fitted on January–February, early-stopped on March (the first model);
- ``expanding``: all labelled history (January … month−2), early-stopped on month−1 (loop_report's reference row);
- ``candidate:<recipe>``: the loop's candidates at the month's start — rolling (three months), expanding, recency
  (expanding, half-life 60 days) — early-stopped on month−1's days 1–21, as ``challenger_model`` fits them;
- ``candidate:committee``: the mean raw score of the static model, the previous month's ``candidate:expanding`` and
  this month's (keel/loop/committee.py), as the loop's committee candidate averages them;
- ``<model>+platt``: that model recalibrated (Platt, keel/loop/recalibrate.py) on month−1's labelled flights;
- ``committee from day N``: the committee serving from the month's day N on, the month before's committee (the static
  model in May) before it — the loop's delay (gate, shadow, canary) priced in. Its AUC is over the whole month.

Usage: .venv/bin/python scripts/loop_policies.py   (about 6 minutes on 2 cores; reads the package's 2013 data)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lightgbm as lgb  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from keel.contracts.engine import CompiledContract  # noqa: E402
from keel.contracts.spec import load_contract  # noqa: E402
from keel.loop.candidates import RECENCY_HALF_LIFE_DAYS  # noqa: E402
from keel.loop.committee import committee_model_text  # noqa: E402
from keel.loop.recalibrate import affine_model_text, fit_recalibration  # noqa: E402
from keel.metrics import summary  # noqa: E402
from keel.training.model import TrainingConfig, month_of, predict, train_model  # noqa: E402
from keel.usecase import get  # noqa: E402
from usecases.flights.data import read_raw, read_raw_month  # noqa: E402
from usecases.flights.features import FLIGHT_FEATURES as FS  # noqa: E402
from usecases.flights.features import offline_features  # noqa: E402

MONTHS = tuple(f"2013-{m:02d}" for m in range(1, 13))


def features() -> pl.DataFrame:
    """2013's flight features, from the raw data through the contracts, as the pipeline builds them."""
    uc = get("flights")
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    valid = {}
    for table in ("flights", "weather"):
        contract = CompiledContract(load_contract(uc.contract_path(table)))
        valid[table] = pl.concat([contract.validate(read_raw_month(table, m), references=refs).valid for m in MONTHS])
    return offline_features(valid["flights"], valid["weather"], read_raw("planes"), valid["flights"])


def platt(text: str, rows: pl.DataFrame) -> str:
    labelled = rows.filter(pl.col(FS.label.column).is_not_null()).sort(FS.entity.id_column)
    x = labelled.select([pl.col(f).cast(pl.Float64) for f in FS.names]).to_numpy()
    y = labelled[FS.label.column].to_numpy().astype(np.float64)
    fit = fit_recalibration("binary", lgb.Booster(model_str=text).predict(x, raw_score=True), y, "platt")
    return affine_model_text(text, fit.a, fit.b)


def main() -> int:
    feats = features()

    def fit(train, valid, days=None, half_life=None) -> str:
        config = TrainingConfig(
            train_months=tuple(train), valid_month=valid, valid_days=days, half_life_days=half_life
        )
        return train_model(feats, config, FS).text

    static = fit(MONTHS[:2], MONTHS[2])
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    previous = None  # the previous month's expanding candidate: the committee's second member
    committee_before = static  # the committee that served the month before (the static model before the first)
    delays = (10, 16, 21)
    for k in range(5, 13):
        month, before, history = MONTHS[k - 1], MONTHS[k - 2], MONTHS[: k - 2]
        models = {
            "static": static,
            "expanding": fit(history, before),
            "candidate:rolling": fit(MONTHS[max(0, k - 5) : k - 2], before, (1, 21)),
            "candidate:expanding": fit(history, before, (1, 21)),
            "candidate:recency": fit(history, before, (1, 21), RECENCY_HALF_LIFE_DAYS),
        }
        refits = [static] + ([previous] if previous else []) + [models["candidate:expanding"]]
        models["candidate:committee"] = committee_model_text(refits)
        previous = models["candidate:expanding"]
        newest = month_of(feats, before, FS)
        models |= {f"{n}+platt": platt(models[n], newest) for n in ("static", "expanding")}
        test = month_of(feats, month, FS)
        rows[month] = {}
        for name, text in models.items():
            m = summary("binary", *predict(text, test, FS))
            rows[month][name] = (m["auc"], m["log_loss"])
        day = test.filter(pl.col(FS.label.column).is_not_null()).sort(FS.entity.id_column)
        day = day.select(FS.entity.partition_day.dt.day().alias("d"))["d"].to_numpy()
        (new, y), (old, _) = predict(models["candidate:committee"], test, FS), predict(committee_before, test, FS)
        for first in delays:
            m = summary("binary", np.where(day < first, old, new), y)
            rows[month][f"committee from day {first}"] = (m["auc"], m["log_loss"])
        committee_before = models["candidate:committee"]
        print(month, "  ".join(f"{n} {a:.4f}/{ll:.4f}" for n, (a, ll) in rows[month].items()), flush=True)
    print(f"\n{'mean May–December':<22} {'AUC':>7} {'log-loss':>9}")
    for name in rows[MONTHS[4]]:
        auc = np.mean([rows[m][name][0] for m in rows])
        loss = np.mean([rows[m][name][1] for m in rows])
        print(f"{name:<22} {auc:7.4f} {loss:9.4f}")
    best = [
        min((v for n, v in r.items() if "from day" not in n), key=lambda v: v[1]) for r in rows.values()
    ]  # each month's lowest log-loss, in hindsight
    print(f"{'hindsight best':<22} {np.mean([b[0] for b in best]):7.4f} {np.mean([b[1] for b in best]):9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
