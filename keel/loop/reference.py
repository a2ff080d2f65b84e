"""What a month's drift is judged against: what the serving model was trained on.

A fixed January–March reference flags every summer month on temperature — a season, not a fault, once a model
trained on summer serves. The reference is the champion's data window (its registry metadata's ``train_months``
and the ``valid_month`` it early-stopped on: the months it learned from); before any champion exists, the initial
window.
"""

from __future__ import annotations

from typing import Any


def trained_on(metadata: dict[str, Any] | None) -> tuple[str, ...]:
    """The months a registered model learned from: its ``train_months`` and its ``valid_month``, sorted."""
    metadata = metadata or {}
    months = list(metadata.get("train_months") or [])
    if months and metadata.get("valid_month"):
        months.append(metadata["valid_month"])
    return tuple(sorted(set(months)))


def reference_window(champion_metadata: dict[str, Any] | None, initial: tuple[str, ...]) -> tuple[str, ...]:
    months = trained_on(champion_metadata)
    if not months:
        return tuple(initial)
    if not all(isinstance(m, str) and len(m) == 7 and m[4] == "-" for m in months):
        raise ValueError(f"the champion's train_months are not YYYY-MM keys: {months!r}")
    return tuple(sorted(set(months)))


def window_label(months: tuple[str, ...]) -> str:
    return f"{months[0]}..{months[-1]}" if len(months) > 1 else months[0]
