from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from usecases.flights.features import offline_features


@pytest.fixture(scope="session")
def feature_months(validated):  # noqa: F811
    """Offline features for 2013-01…02 (real), plus 2013-03…05 made of February's rows moved 28/56/84 days on."""
    feats = offline_features(validated["flights"], validated["weather"], validated["planes"], validated["flights"])
    feb = feats.filter(pl.col("sched_date").dt.month() == 2)
    moved = [
        feb.with_columns(
            (pl.col("sched_date") + timedelta(days=28 * k)).alias("sched_date"),
            (pl.col("flight_id") + f"+{k}").alias("flight_id"),
        )
        for k in (1, 2, 3)
    ]
    return pl.concat([feats, *moved])
