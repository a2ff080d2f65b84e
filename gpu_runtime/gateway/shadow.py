"""Shadow scoring: a version the policy store names as a split's ``shadow`` (the loop's challenger before its canary,
keel/loop/promote.py) scores every request beside the version that answers it — its score goes into the exposure
record (``shadow_version``, ``shadow_score``), never into the answer. Judged later, paired on the same requests'
realized labels (keel/loop/shadow.py).

The shadow call starts with the served one and runs beside it; the answer waits for it at most ``SHADOW_WAIT_S``
past its own and never fails because of it: a shadow error or a slow shadow is logged (``shadow_error``) and
counted (``keel_gateway_shadow_errors_total``), the served answer stands. A mixin of ``Gateway`` (app.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from keel.deploy.routing import RoutingTable

SHADOW_WAIT_S = 1.0  # how long an answer waits for its shadow score after its own is in


class ScoresInShadow:
    def _start_shadow(
        self, table: RoutingTable, routed: int, x: np.ndarray, timeout: float
    ) -> tuple[int, asyncio.Task] | None:
        """The shadow call for this request's inputs, started now: (its version, the task), or None when no split
        names a shadow version that this table serves, or when the request is routed to it anyway."""
        version = self.split.shadow if self.split is not None else None
        if version is None or version == routed or version not in table.versions():
            return None
        return version, asyncio.ensure_future(self._infer(table.model, version, x, timeout, False))

    async def _finish_shadow(self, shadow: tuple[int, asyncio.Task] | None, served: int | None,
                             record: dict[str, Any]) -> None:  # fmt: skip
        """Put the shadow's score into the exposure record (or why there is none)."""
        if shadow is None:
            return
        version, task = shadow
        if version == served:  # the shadow version answered this request itself (a canary step): nothing to add
            task.cancel()
            return
        try:
            scores, _ = await asyncio.wait_for(task, SHADOW_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - a shadow never fails the served answer
            record.update(shadow_version=version, shadow_error=type(exc).__name__)
            self.metrics.inc("keel_gateway_shadow_errors_total", {"model_version": str(version)})
            return
        record.update(
            shadow_version=version,
            shadow_score=float(scores[0]) if len(scores) == 1 else np.round(scores, 6).tolist(),
        )
        self.metrics.inc("keel_gateway_shadow_scores_total", {"model_version": str(version)})
