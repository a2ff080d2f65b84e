"""Reference profiles: the statistics of the reference window, computed once and reused for every window.

A numeric feature keeps its finite values sorted (the sketch every distance is computed from: exact up to
``max_sketch`` values, evenly spaced order statistics beyond), its mean and standard deviation, and the bin edges
PSI and KL use. A categorical feature keeps its category counts. Profiles round-trip through a polars frame, so
they are stored as Parquet like every other asset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from keel.kernels import ArrayBackend, bin_counts, finite_sorted, numpy_backend

DEFAULT_MAX_SKETCH = 2_000_000
PSI_BINS = 10
KL_BINS = 20


@dataclass
class NumericReference:
    name: str
    sorted_values: np.ndarray  # finite values, ascending (host memory)
    rows: int  # rows in the reference window, nulls included
    nulls: int
    non_finite: int
    mean: float
    std: float
    psi_edges: np.ndarray  # inner edges of the PSI bins (reference deciles, deduplicated)
    kl_edges: np.ndarray  # inner edges of the KL bins (reference 5 % quantiles, deduplicated)
    exact: bool = True  # False when the sketch holds order statistics instead of every value
    psi_counts: np.ndarray = field(default_factory=lambda: np.empty(0))  # reference counts per PSI bin
    kl_counts: np.ndarray = field(default_factory=lambda: np.empty(0))  # reference counts per KL bin

    def __post_init__(self) -> None:
        if self.psi_counts.size == 0 and self.sorted_values.size:
            self.psi_counts = _bin_counts(self.sorted_values, self.psi_edges)
            self.kl_counts = _bin_counts(self.sorted_values, self.kl_edges)

    kind = "numeric"


@dataclass
class CategoricalReference:
    name: str
    counts: dict[str, int]
    rows: int
    nulls: int

    kind = "categorical"


@dataclass
class ReferenceProfile:
    window: str
    features: dict[str, NumericReference | CategoricalReference] = field(default_factory=dict)

    def to_frame(self) -> pl.DataFrame:
        """Long format: one row per sketch value / category, plus one metadata row per feature."""
        parts = []
        for ref in self.features.values():
            if isinstance(ref, NumericReference):
                meta = {
                    "rows": ref.rows,
                    "nulls": ref.nulls,
                    "non_finite": ref.non_finite,
                    "mean": ref.mean,
                    "std": ref.std,
                    "psi_edges": ref.psi_edges.tolist(),
                    "kl_edges": ref.kl_edges.tolist(),
                    "exact": ref.exact,
                }
                parts.append(
                    pl.DataFrame(
                        {
                            "feature": ref.name,
                            "kind": "numeric",
                            "value": ref.sorted_values,
                            "category": pl.Series([None] * ref.sorted_values.size, dtype=pl.String),
                            "count": pl.Series([None] * ref.sorted_values.size, dtype=pl.Int64),
                        }
                    )
                )
            else:
                meta = {"rows": ref.rows, "nulls": ref.nulls}
                cats = list(ref.counts)
                parts.append(
                    pl.DataFrame(
                        {
                            "feature": ref.name,
                            "kind": "categorical",
                            "value": pl.Series([None] * len(cats), dtype=pl.Float64),
                            "category": pl.Series(cats, dtype=pl.String),
                            "count": pl.Series([ref.counts[c] for c in cats], dtype=pl.Int64),
                        }
                    )
                )
            parts.append(
                pl.DataFrame(
                    {
                        "feature": [ref.name],
                        "kind": [f"{ref.kind}_meta"],
                        "value": pl.Series([None], dtype=pl.Float64),
                        "category": [json.dumps(meta)],
                        "count": pl.Series([None], dtype=pl.Int64),
                    }
                )
            )
        frame = pl.concat(parts) if parts else pl.DataFrame(schema=_SCHEMA)
        return frame.with_columns(pl.lit(self.window).alias("window"))

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> ReferenceProfile:
        window = frame["window"][0] if frame.height else ""
        profile = cls(window=window)
        for (name,), rows in frame.group_by("feature", maintain_order=True):
            meta_row = rows.filter(pl.col("kind").str.ends_with("_meta"))
            meta = json.loads(meta_row["category"][0])
            if meta_row["kind"][0] == "numeric_meta":
                values = rows.filter(pl.col("kind") == "numeric")["value"].to_numpy()
                profile.features[name] = NumericReference(
                    name=name,
                    sorted_values=np.sort(values),
                    rows=meta["rows"],
                    nulls=meta["nulls"],
                    non_finite=meta["non_finite"],
                    mean=meta["mean"],
                    std=meta["std"],
                    psi_edges=np.asarray(meta["psi_edges"], dtype=np.float64),
                    kl_edges=np.asarray(meta["kl_edges"], dtype=np.float64),
                    exact=meta["exact"],
                )
            else:
                cats = rows.filter(pl.col("kind") == "categorical")
                profile.features[name] = CategoricalReference(
                    name=name,
                    counts=dict(zip(cats["category"].to_list(), cats["count"].to_list(), strict=True)),
                    rows=meta["rows"],
                    nulls=meta["nulls"],
                )
        return profile


def _bin_counts(sorted_values: np.ndarray, inner_edges: np.ndarray) -> np.ndarray:
    b = numpy_backend()
    return b.to_numpy(bin_counts(b, sorted_values, inner_edges)).astype(np.float64)


_SCHEMA = {"feature": pl.String, "kind": pl.String, "value": pl.Float64, "category": pl.String, "count": pl.Int64}


def _inner_quantile_edges(sorted_values: np.ndarray, bins: int) -> np.ndarray:
    if sorted_values.size == 0:
        return np.empty(0)
    qs = np.quantile(sorted_values, np.linspace(0, 1, bins + 1)[1:-1])
    return np.unique(qs)


def numeric_reference(
    name: str, values: pl.Series, *, max_sketch: int = DEFAULT_MAX_SKETCH, b: ArrayBackend | None = None
) -> NumericReference:
    b = b or numpy_backend()
    nulls = values.null_count()
    raw = values.drop_nulls().cast(pl.Float64).to_numpy()
    finite = b.to_numpy(finite_sorted(b, raw))
    non_finite = int(raw.size - finite.size)
    mean = float(finite.mean()) if finite.size else float("nan")
    std = float(finite.std()) if finite.size else float("nan")
    exact = finite.size <= max_sketch
    if not exact:
        # evenly spaced order statistics: W and KS errors bounded by 1/max_sketch of the mass (docs/drift.md)
        finite = finite[np.linspace(0, finite.size - 1, max_sketch).round().astype(np.int64)]
    return NumericReference(
        name=name,
        sorted_values=finite,
        rows=values.len(),
        nulls=nulls,
        non_finite=non_finite,
        mean=mean,
        std=std,
        psi_edges=_inner_quantile_edges(finite, PSI_BINS),
        kl_edges=_inner_quantile_edges(finite, KL_BINS),
        exact=exact,
    )


def categorical_reference(name: str, values: pl.Series) -> CategoricalReference:
    text = values.cast(pl.String)
    counts = text.drop_nulls().value_counts(sort=True)
    return CategoricalReference(
        name=name,
        counts=dict(zip(counts[text.name].to_list(), counts["count"].to_list(), strict=True)),
        rows=values.len(),
        nulls=values.null_count(),
    )


def build_reference(
    frame: pl.DataFrame,
    *,
    window: str,
    numeric: list[str] | None = None,
    categorical: list[str] | None = None,
    max_sketch: int = DEFAULT_MAX_SKETCH,
    b: ArrayBackend | None = None,
) -> ReferenceProfile:
    """Profile ``frame``. Without explicit lists, numeric dtypes are numeric and strings/booleans categorical."""
    if numeric is None and categorical is None:
        numeric = [c for c, t in frame.schema.items() if t.is_numeric() and not c.startswith("_")]
        categorical = [
            c
            for c, t in frame.schema.items()
            if t in (pl.String, pl.Categorical, pl.Boolean) and not c.startswith("_")
        ]
    profile = ReferenceProfile(window=window)
    for name in numeric or []:
        profile.features[name] = numeric_reference(name, frame[name], max_sketch=max_sketch, b=b)
    for name in categorical or []:
        profile.features[name] = categorical_reference(name, frame[name])
    return profile
