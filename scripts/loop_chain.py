"""The loop's chain of decisions, offline: what the flights loop would serve May–December 2013 if every candidate its
gate chose were promoted on day ``--promote-day`` of the decision month (no shadow, no canary: the gate's choice and
the delay only) — by choice rule. keel/loop/candidates.py and docs/live.md quote its output.

Each month M: the candidates of the drift decision at M's start (rolling, expanding, recency, committee — fitted as
``challenger_model`` fits them, early-stopped on month M−1's days before ``--gate-from-day``) are judged against the
current champion on M−1's days from ``--gate-from-day`` on by ``choose_candidate`` (the gate's policy, Holm); the
chosen one serves M from the promotion day and is the champion after. Rules: ``lowest difference`` (prefer=()),
``committee first`` (the default PREFER), ``committee only`` (no other candidate trained).

Usage: .venv/bin/python scripts/loop_chain.py [--gate-from-day 22] [--promote-day 11]   (about 8 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from loop_policies import MONTHS, features  # noqa: E402

from keel.loop.candidates import PREFER, RECENCY_HALF_LIFE_DAYS, choose_candidate  # noqa: E402
from keel.loop.committee import committee_model_text  # noqa: E402
from keel.loop.gate import DEFAULT_GATE  # noqa: E402
from keel.loop.shadow import ShadowPolicy  # noqa: E402
from keel.metrics import summary  # noqa: E402
from keel.training.model import TrainingConfig, month_of, predict, train_model  # noqa: E402
from usecases.flights.features import FLIGHT_FEATURES as FS  # noqa: E402

RULES = {"lowest difference": (), "committee first": PREFER, "committee only": PREFER}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gate-from-day", type=int, default=22)
    parser.add_argument("--promote-day", type=int, default=11)
    args = parser.parse_args()
    feats = features()
    d = args.gate_from_day

    def fit(train, valid, days=None, half_life=None) -> str:
        config = TrainingConfig(train_months=tuple(train), valid_month=valid, valid_days=days,
                                half_life_days=half_life)  # fmt: skip
        return train_model(feats, config, FS).text

    def labelled(frame: pl.DataFrame, expr: pl.Expr) -> np.ndarray:
        rows = frame.filter(pl.col(FS.label.column).is_not_null()).sort(FS.entity.id_column)
        return rows.select(expr.alias("v"))["v"].to_numpy()

    static = fit(MONTHS[:2], MONTHS[2])
    policy = ShadowPolicy(margin=DEFAULT_GATE.margin, alpha=DEFAULT_GATE.alpha, min_labelled=1000, min_clusters=5)
    candidates, previous = {}, None
    for k in range(5, 13):
        gate, history, rolling = MONTHS[k - 2], MONTHS[: k - 2], MONTHS[max(0, k - 5) : k - 2]
        c = {"rolling": fit(rolling, gate, (1, d - 1))}
        if history != rolling:
            c["expanding"] = fit(history, gate, (1, d - 1))
        refit = c.get("expanding", c["rolling"])
        c["recency"] = fit(history, gate, (1, d - 1), RECENCY_HALF_LIFE_DAYS)
        c["committee"] = committee_model_text([static] + ([previous] if previous else []) + [refit])
        previous = refit
        candidates[MONTHS[k - 1]] = c
        print(f"fitted the candidates of {MONTHS[k - 1]}", flush=True)
    for rule, prefer in RULES.items():
        champion, served = static, []
        for k in range(5, 13):
            month, gate = MONTHS[k - 1], MONTHS[k - 2]
            c = {"committee": candidates[month]["committee"]} if rule == "committee only" else candidates[month]
            rows = month_of(feats, gate, FS).filter(FS.entity.partition_day.dt.day() >= d)
            champion_scores, y = predict(champion, rows, FS)
            scores = {n: predict(t, rows, FS)[0] for n, t in c.items()}
            days = labelled(rows, FS.entity.partition_day)
            chosen = choose_candidate(y, champion_scores, scores, days, policy, prefer=prefer).chosen
            test = month_of(feats, month, FS)
            old, y = predict(champion, test, FS)
            if chosen:
                day = labelled(test, FS.entity.partition_day.dt.day())
                old = np.where(day < args.promote_day, old, predict(c[chosen], test, FS)[0])
                champion = c[chosen]
            m = summary("binary", old, y)
            served.append((m["auc"], m["log_loss"]))
            print(f"  {rule}: {month} chose {chosen}: AUC {m['auc']:.4f} log-loss {m['log_loss']:.4f}", flush=True)
        print(f"{rule:<18} gate from day {d}, promoted on day {args.promote_day}: mean AUC "
              f"{np.mean([s[0] for s in served]):.4f}, log-loss {np.mean([s[1] for s in served]):.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
