"""Small helpers that render polars frames as markdown for Dagster metadata."""

from __future__ import annotations

import polars as pl


def frame_to_markdown(df: pl.DataFrame, max_rows: int = 10, max_width: int = 40) -> str:
    if df.width == 0:
        return "_(no columns)_"
    head = df.head(max_rows)

    def cell(v: object) -> str:
        text = "" if v is None else str(v)
        text = text.replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    lines = ["| " + " | ".join(head.columns) + " |", "|" + "---|" * head.width]
    for row in head.iter_rows():
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    if df.height > max_rows:
        lines.append(f"\n_{df.height - max_rows:,} more rows_")
    return "\n".join(lines)
