"""What a month's drift is judged against: what the serving model was trained on.

A fixed January–March reference flags every summer month on temperature — a season, not a fault, once a model
trained on summer serves. The reference is the champion's training window (its registry metadata's
``train_months``); before any champion exists, the initial window.
"""

from __future__ import annotations

from typing import Any


def reference_window(champion_metadata: dict[str, Any] | None, initial: tuple[str, ...]) -> tuple[str, ...]:
    months = (champion_metadata or {}).get("train_months")
    if not months:
        return tuple(initial)
    if not all(isinstance(m, str) and len(m) == 7 and m[4] == "-" for m in months):
        raise ValueError(f"the champion's train_months are not YYYY-MM keys: {months!r}")
    return tuple(sorted(set(months)))


def window_label(months: tuple[str, ...]) -> str:
    return f"{months[0]}..{months[-1]}" if len(months) > 1 else months[0]
