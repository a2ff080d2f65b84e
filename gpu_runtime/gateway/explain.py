"""Explained predictions: what a request asks for (``"explain": true`` or a top-k) and the answer's ``explanation``.

The numbers come from the Triton model itself (gpu_runtime/triton_model.py: LightGBM's exact TreeSHAP,
``pred_contrib``, and the raw score of the same predict), so the explanation is of the version that answered —
a fallback's when the fallback answered. Contributions are in raw-score units — log-odds for a binary label (a late
arrival), the label's own units for a regression (a price): ``units`` says which; the answer carries the base value,
the ``k`` largest contributions by magnitude (with each feature's value), and the sum of the others in ``rest``, so
that ``base_value + Σ contributions + rest == raw_score`` for every answer, and ``score == 1 / (1 + exp(-raw_score))``
for a binary label, ``score == raw_score`` for a regression.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_runtime.gateway.limits import RequestError


def requested_top_k(req: dict[str, Any], names: tuple[str, ...]) -> int | None:
    """How many contributions the request asks for: None (no explanation), every feature for ``true``, else k.
    Anything else is 422 ``invalid_input`` naming the field."""
    value = req.get("explain")
    if value is None or value is False:
        return None
    if value is True:
        return len(names)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(names):
        return value
    raise RequestError(
        422, "invalid_input",
        f"explain must be true, false or a top-k from 1 to {len(names)}, got {str(value)[:40]!r}",
        field="explain",
    )  # fmt: skip


def explanations(
    names: tuple[str, ...], x: np.ndarray, contrib: np.ndarray, raw_score: np.ndarray, k: int, units: str = "log-odds"
) -> list[dict[str, Any]]:
    """One explanation per row of ``x`` (the feature values scored) from Triton's ``contrib`` and ``raw_score``."""
    out = []
    for row, c, raw in zip(x, contrib, raw_score, strict=True):
        parts = c[:-1]
        order = np.argsort(-np.abs(parts), kind="stable")
        top, others = order[:k], order[k:]
        out.append(
            {
                "base_value": float(c[-1]),
                "raw_score": float(raw),
                "contributions": [
                    {"feature": names[i], "value": float(row[i]), "contribution": float(parts[i])} for i in top
                ],
                "rest": float(parts[others].sum()) if len(others) else 0.0,
                "units": units,
            }
        )
    return out
