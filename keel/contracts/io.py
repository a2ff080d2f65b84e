"""Reading data files without losing rows to a reader's opinions about types.

For validation, CSV is read with every column as text (the contract types it) and invalid UTF-8 replaced by
U+FFFD, which the engine reports as a type violation of that value. For statistics (``typed=True``), CSV types are
inferred from every row, not the first 100. Parquet keeps its own types either way.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from keel.errors import DataReadError


def read_data_file(path: str | Path, *, typed: bool = False) -> pl.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise DataReadError(f"{p}: no such data file")
    suffix = p.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pl.read_parquet(p)
        if suffix in (".csv", ".txt", ".tsv"):
            schema = {"infer_schema_length": None} if typed else {"infer_schema": False}
            return pl.read_csv(
                p,
                null_values=["NA", ""],
                encoding="utf8-lossy",
                separator="\t" if suffix == ".tsv" else ",",
                **schema,
            )
    except Exception as exc:  # polars/arrow raise many types; all mean "cannot read this file"
        raise DataReadError(f"{p}: cannot read as {suffix.lstrip('.')}: {str(exc).splitlines()[0]}") from None
    raise DataReadError(f"{p}: unknown data format '{suffix}' (use .csv or .parquet)")


def read_typed_data_file(path: str | Path) -> pl.DataFrame:
    """CSV with inferred types (every row looked at), or Parquet as stored: the input of statistics."""
    return read_data_file(path, typed=True)
