"""The year at a glance, as the newest ``loop_report`` partition shows it (assets/loop.py): every month so far in one
table and one chart — what was served against the static first model, the naive retrain and the expanding-window
reference — with the releases and the canaries' decisions on the months they happened; and the loop's actions in
words a person reads (a shadow step is "shadow (0 % of traffic)", long text shortened with what was left out).

Pure: frames and records in, text and values out.
"""

from __future__ import annotations

import polars as pl

MODELS = ("served", "static", "naive", "expanding")  # the rows of each month's loop_report frame


def shorten(text: str, limit: int = 160) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return f"{cut.rstrip(' ,;')} … (+{len(text) - len(cut)} chars)"


def step_words(action: str, percent: str | float | None) -> str:
    """A canary decision as a person reads it: ``start at 0 %`` is a shadow step, nobody served by the challenger."""
    try:
        share = float(percent) if percent is not None else None
    except ValueError:
        share = None
    if share == 0.0 and action in ("start", "advance", "hold"):
        return f"{action}: shadow (0 % of traffic)"
    return f"{action} at {share:g} %" if share is not None else action


def year_so_far(frame: pl.DataFrame, metric: str) -> tuple[list[str], dict[str, list[float | None]]]:
    """The months of ``frame`` (loop_report frames of several months, concatenated) in order, and for each model
    (served, static, naive, expanding) its ``metric`` per month (None where a month has none)."""
    months = sorted(frame["month"].unique().to_list())
    series: dict[str, list[float | None]] = {}
    for model in MODELS:
        rows = {r["month"]: r[metric] for r in frame.filter(pl.col("model") == model).iter_rows(named=True)}
        series[model] = [rows.get(m) for m in months]
    return months, series


def on_the_months(marks: list[tuple[str, str]], months: list[str]) -> list[tuple[str, str]]:
    """``marks`` ((YYYY-MM, text): releases, canary decisions) placed on ``months``: a mark after the last month (the
    replay serves on after a use case's period while a longer one lands) is shown on the last month as
    "then <text> (<its month>)", never dropped; one before the first month is dropped (no row to put it on)."""
    if not months:
        return []
    out = []
    for month, text in marks:
        if month > months[-1]:
            out.append((months[-1], f"then {text} ({month})"))
        elif month >= months[0]:
            out.append((month, text))
    return out


def year_rows(
    months: list[str], series: dict[str, list[float | None]], metric: str, notes: dict[str, str]
) -> list[dict[str, str | float | None]]:
    """The year as rows of a table: one per month, a column per model's ``metric`` (``served_auc``, …; None where a
    month has none; 4 decimals), and what happened that month (``notes``: releases, canary decisions)."""
    return [
        {"month": m}
        | {f"{model}_{metric}": None if vs[i] is None else round(vs[i], 4) for model, vs in series.items()}
        | {"what_happened": notes.get(m, "")}
        for i, m in enumerate(months)
    ]
