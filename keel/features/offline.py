"""The offline path: one row per entity, every feature point-in-time correct, computed from a ``FeatureSet``.

Nothing a row's features use comes from after its date: request features read the row itself, lookups match on
their keys (an hourly observation on the row's UTC hour), and histories count only rows of *earlier days* whose
value was known by then (an as-of join that excludes the row's own day). ``as_of`` replaces each row's own date
with one fixed day — the online store's point of view — for the skew check.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date

import polars as pl

from keel.features.spec import FeatureSet, FeatureSpecError, History, PolarsOps


def entity_frame(fs: FeatureSet, rows: pl.DataFrame) -> pl.DataFrame:
    """Source rows → entity rows (the date and id columns added; rows that already have them are kept as they are)."""
    return rows if fs.entity.id_column in rows.columns else fs.entity.with_date(rows)


def daily_totals(fs: FeatureSet, history: pl.DataFrame, view: History) -> pl.DataFrame:
    """Per group and day the values became known (the view's ``known_on``, else the row's own day): rows with a
    known value, the sum of their values, and both summed over the days so far. A row without a key counts toward no
    group (a row without it is scored with the prior, offline and online alike)."""
    day = fs.entity.date
    return (
        history.with_columns(view.value.cast(pl.Float64).alias("_value"))
        .filter(pl.col("_value").is_not_null() & pl.all_horizontal(pl.col(k).is_not_null() for k in view.keys))
        .with_columns((pl.col(day) if view.known_on is None else view.known_on).cast(pl.Date).alias(day))
        .group_by([*view.keys, day])
        .agg(pl.len().alias("n"), pl.col("_value").sum().alias("total"))
        .sort(day)
        .with_columns(
            pl.col("n").cum_sum().over(list(view.keys)).alias("n_cum"),
            pl.col("total").cum_sum().over(list(view.keys)).alias("sum_cum"),
        )
    )


def history_features(
    fs: FeatureSet, entities: pl.DataFrame, history: pl.DataFrame, as_of: date | None = None
) -> pl.DataFrame:
    """Each entity row plus one column per history, from days strictly before its date (or ``as_of``)."""
    day = fs.entity.date
    out = entities.with_columns((pl.lit(as_of) if as_of else pl.col(day)).cast(pl.Date).alias("_as_of"))
    for view in fs.histories:
        daily = daily_totals(fs, history, view).select([*view.keys, day, "n_cum", "sum_cum"]).rename({day: "_day"})
        out = (
            out.sort("_as_of")
            .join_asof(
                daily.sort("_day"),
                left_on="_as_of",
                right_on="_day",
                by=list(view.keys),
                strategy="backward",
                allow_exact_matches=False,
                check_sortedness=False,
            )
            .with_columns(view.smoothed(pl.col("sum_cum"), pl.col("n_cum"), PolarsOps).alias(view.feature))
            .drop("_day", "n_cum", "sum_cum")
        )
    return out.drop("_as_of")


def offline_features(
    fs: FeatureSet,
    rows: pl.DataFrame,
    sources: Mapping[str, pl.DataFrame],
    history: pl.DataFrame,
    *,
    as_of: date | None = None,
) -> pl.DataFrame:
    """The feature table for ``rows`` (validated source rows of the entity). ``sources``: each lookup's table by its
    ``source`` name; ``history``: every validated row the histories may count."""
    missing = [v.source for v in fs.lookups if v.source not in sources]
    if missing:
        raise FeatureSpecError(f"feature set of {fs.entity.name}: no table given for {', '.join(missing)}")
    out = entity_frame(fs, rows)
    for r in fs.request:
        out = out.with_columns([e.alias(name) for name, e in r.compute(pl.col, PolarsOps).items()])
    for view in fs.lookups:
        out = out.join(view.table(sources[view.source]), on=[k.column for k in view.keys], how="left")
        if view.compute is not None:
            out = out.with_columns([e.alias(name) for name, e in view.compute(pl.col, PolarsOps).items()])
    out = history_features(fs, out, entity_frame(fs, history), as_of)
    label = fs.label.expr.alias(fs.label.column)
    return out.with_columns(label).select(fs.table_columns).sort(fs.entity.id_column)
