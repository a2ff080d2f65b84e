"""Columns that give the label away (issue 61 item 9): a model trained on them is perfect on the table and useless at
serving time, when the label is what nobody knows yet. ``keel new`` refuses them as features and names each, with
the evidence, in PROFILE.md and the contract's defects:

- **a copy, or near one**: a numeric column whose correlation with the label is ±``NEAR_EXACT`` or more;
- **the label shifted**: a column equal to the label of the row before or after it in time on ``SHARE`` of the rows
  (a value known only once that row's label is);
- **parts of the label**: two numeric columns whose sum or difference equals the label on ``SHARE`` of the rows (a
  count of casual and registered riders that add up to all riders);
- **a category that decides it**: a text column with two or more values, each of which goes with one label value on
  ``SHARE`` of the rows (a status "late" / "on time" beside a late flag).

Pure polars over the profiled frame; a column that fails none of these is not said to be safe — only not caught.
"""

from __future__ import annotations

import itertools

import polars as pl

from keel.new.profile import ColumnProfile

NEAR_EXACT = 0.99  # |correlation| at or above which a column is a copy of the label
SHARE = 0.99  # of the labelled rows on which a dependence must hold
TOLERANCE = 1e-6  # relative: a sum that equals the label up to rounding


def _equal(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    return (a - b).abs() <= TOLERANCE * pl.max_horizontal(a.abs(), b.abs(), pl.lit(1.0))


def label_leaks(
    frame: pl.DataFrame, label: str, time: str, columns: list[ColumnProfile], label_values: pl.Expr
) -> dict[str, str]:
    """column → why it gives the label away, for the candidate ``columns`` of ``frame`` (``label_values``: the label
    as a number, e.g. a binary label's 0/1)."""
    rows = (
        frame.filter(pl.col(label).is_not_null()).sort(time).with_columns(label_values.cast(pl.Float64).alias("_y"))
    )
    if rows.height < 10:
        return {}
    n = rows.height
    numeric = [c.ident for c in columns if c.numeric and c.ident != label]
    found: dict[str, str] = {}
    for col in numeric:
        x = pl.col(col).cast(pl.Float64)
        r = rows.select(pl.corr(x, pl.col("_y"))).item()
        if r is not None and abs(r) >= NEAR_EXACT:
            found[col] = f"a copy of the label: correlation {r:+.4f} with {label}"
            continue
        for step, when in ((1, "before"), (-1, "after")):
            same = rows.select(_equal(x, pl.col("_y").shift(step)).fill_null(False).mean()).item()
            if same >= SHARE:
                found[col] = f"the label shifted: equal to {label} of the row {when} it on {same:.1%} of the rows"
                break
    rest = [c for c in numeric if c not in found]
    for a, b in itertools.combinations(rest, 2):
        xa, xb, y = pl.col(a).cast(pl.Float64), pl.col(b).cast(pl.Float64), pl.col("_y")
        for shown, expr in ((f"{a} + {b}", xa + xb), (f"{a} − {b}", xa - xb), (f"{b} − {a}", xb - xa)):
            same = rows.select(_equal(expr, y).fill_null(False).mean()).item()
            if same >= SHARE:
                for col in (a, b):
                    found[col] = f"part of the label: {shown} equals {label} on {same:.1%} of the rows"
                break
    for c in columns:
        if c.kind != "string" or c.ident == label or c.distinct < 2 or c.distinct > 0.5 * n:
            continue
        purity = (
            rows.filter(pl.col(c.ident).is_not_null())
            .group_by(c.ident, "_y")
            .len()
            .group_by(c.ident)
            .agg(pl.col("len").max().alias("top"), pl.col("len").sum().alias("all"))
            .select(pl.col("top").sum() / pl.col("all").sum())
            .item()
        )
        groups = rows.select(pl.col(c.ident).n_unique()).item()
        labels = rows.select(pl.col("_y").n_unique()).item()
        if purity is not None and purity >= SHARE and labels >= 2 and groups >= 2 and labels <= groups:
            found[c.ident] = (
                f"decides the label: each of its values goes with one {label} on {purity:.1%} of the rows"
            )
    return found
