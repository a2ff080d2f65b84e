"""What the canary sensor's tests share: a rollout of flight-delay v2 against v1 (``CANARY``), the instant its
exposures are logged at, the split the policy store holds, and real January flights with their outcomes as the
labels' source. The ``world`` it runs in (registry, policy store, exposure log): tests/policy/conftest.py."""

from __future__ import annotations

import polars as pl

T0 = 1_900_000_000.0  # 2030-03-17: the exposure log's day files follow it
CANARY = {
    "model": "flight-delay",
    "champion_version": 1,
    "challenger_version": 2,
    "steps": [10, 100],
    "interval_s": 60,
    "min_samples": 50,
    "error_ratio": 1.2,
    "alpha": 0.05,
    "progress_deadline_s": 3600,
}


def split(store):
    return {v["name"]: v["weight"] for v in store.state()["rollout.split"].body["variants"]}


def january_outcomes(tmp_path, validated):
    """Real January flights with their outcomes, in storage as the pipeline writes them (the labels' source)."""
    flights = validated["flights"].filter(pl.col("time_hour").dt.month() == 1, pl.col("arr_delay").is_not_null())
    storage = tmp_path / "storage"
    (storage / "flights" / "validated_flights").mkdir(parents=True)
    flights.write_parquet(storage / "flights" / "validated_flights" / "2013-01.parquet")
    return storage, flights
