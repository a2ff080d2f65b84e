"""Which model serves which month well: AUC / log-loss of the static model and of each monthly-retrained model on
every later month, from a KEEL_HOME whose flight_features cover 2013 (after the live year or the backfill).

``wN`` is fitted on the three months before N and early-stopped on month N (the naive baseline for month N+1);
``static`` is the first model (January–February, early-stopped on March). docs/live.md quotes its output.

Usage: .venv/bin/python scripts/loop_matrix.py [--home $KEEL_HOME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import polars as pl  # noqa: E402

from keel.home import KeelHome  # noqa: E402
from keel.training.model import TrainingConfig, auc, log_loss, predict, train_model  # noqa: E402
from usecases.flights.features import FLIGHT_FEATURES  # noqa: E402


def month(k: int) -> str:
    return f"2013-{k:02d}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", help="KEEL_HOME (default: $KEEL_HOME)")
    args = parser.parse_args()
    home = KeelHome.of(args.home) if args.home else KeelHome.from_env()
    paths = [home.asset_file("flights/flight_features", month(k)) for k in range(1, 13)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        print(f"flight_features is missing {', '.join(missing)} under {home.root}", file=sys.stderr)
        return 2
    frame = pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")
    models = {"static": TrainingConfig(train_months=(month(1), month(2)), valid_month=month(3))}
    for last in range(4, 12):
        models[f"w{last}"] = TrainingConfig(
            train_months=tuple(month(k) for k in range(max(1, last - 3), last)), valid_month=month(last)
        )
    print("model  " + " ".join(f"{month(m):>13}" for m in range(4, 13)))
    for name, config in models.items():
        text = train_model(frame, config, FLIGHT_FEATURES).text
        cells = []
        for m in range(4, 13):
            s, y = predict(text, frame.filter(pl.col("sched_date").dt.month() == m), FLIGHT_FEATURES)
            cells.append(f"{auc(s, y):.3f}/{log_loss(s, y):.3f}")
        print(f"{name:6} " + " ".join(f"{c:>13}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
