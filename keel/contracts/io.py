"""Reading data files for validation without losing rows to a reader's opinions about types.

CSV is read with every column as text (the contract types it) and invalid UTF-8 replaced by U+FFFD, which the
engine reports as a type violation of that value; Parquet keeps its own types.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from keel.errors import DataReadError


def read_data_file(path: str | Path) -> pl.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise DataReadError(f"{p}: no such data file")
    suffix = p.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pl.read_parquet(p)
        if suffix in (".csv", ".txt", ".tsv"):
            return pl.read_csv(
                p,
                infer_schema=False,
                null_values=["NA", ""],
                encoding="utf8-lossy",
                separator="\t" if suffix == ".tsv" else ",",
                truncate_ragged_lines=False,
            )
    except Exception as exc:  # polars/arrow raise many types; all mean "cannot read this file"
        raise DataReadError(f"{p}: cannot read as {suffix.lstrip('.')}: {str(exc).splitlines()[0]}") from None
    raise DataReadError(f"{p}: unknown data format '{suffix}' (use .csv or .parquet)")


def read_typed_data_file(path: str | Path) -> pl.DataFrame:
    """Read CSV with types inferred from every row (not the first 100), or Parquet as stored: for statistics."""
    p = Path(path)
    if not p.is_file():
        raise DataReadError(f"{p}: no such data file")
    suffix = p.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pl.read_parquet(p)
        if suffix in (".csv", ".txt", ".tsv"):
            return pl.read_csv(
                p,
                infer_schema_length=None,
                null_values=["NA", ""],
                encoding="utf8-lossy",
                separator="\t" if suffix == ".tsv" else ",",
            )
    except Exception as exc:  # polars/arrow raise many types; all mean "cannot read this file"
        raise DataReadError(f"{p}: cannot read as {suffix.lstrip('.')}: {str(exc).splitlines()[0]}") from None
    raise DataReadError(f"{p}: unknown data format '{suffix}' (use .csv or .parquet)")
