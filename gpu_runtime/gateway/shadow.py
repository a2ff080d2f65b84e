"""Shadow scoring: a version the policy store names as a split's ``shadow`` (the loop's challenger before its canary,
keel/loop/promote.py) scores every request beside the version that answers it — its score goes into the exposure
record (``shadow_version``, ``shadow_score``), never into the answer. Judged later, paired on the same requests'
realized labels (keel/loop/shadow.py).

The shadow call starts with the served one and runs beside it; the answer waits for it at most ``SHADOW_WAIT_S``
past its own and never fails because of it: a shadow error or a slow shadow is logged (``shadow_error``) and
counted (``keel_gateway_shadow_errors_total``), the served answer stands. Part of the infer stage (stages.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from gpu_runtime.gateway.request import RequestContext
from gpu_runtime.gateway.scoring import TritonScorer
from keel.deploy.routing import RoutingTable
from keel.policies.gateway import Split

SHADOW_WAIT_S = 1.0  # how long an answer waits for its shadow score after its own is in


def start_shadow(
    scorer: TritonScorer, split: Split | None, table: RoutingTable, routed: int, x: np.ndarray, timeout: float
) -> tuple[int, asyncio.Task] | None:
    """The shadow call for this request's inputs, started now: (its version, the task), or None when no split names
    a shadow version that this table serves, or when the request is routed to it anyway."""
    version = split.shadow if split is not None else None
    if version is None or version == routed or version not in table.versions():
        return None
    return version, asyncio.ensure_future(scorer.infer(table.model, version, x, timeout, False))


async def finish_shadow(shadow: tuple[int, asyncio.Task] | None, ctx: RequestContext, metrics: Any) -> None:
    """Put the shadow's score into the request's context (or why there is none)."""
    if shadow is None:
        return
    version, task = shadow
    if version == ctx.model_version:  # the shadow version answered this request itself (a canary step)
        task.cancel()
        return
    try:
        scores, _ = await asyncio.wait_for(task, SHADOW_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - a shadow never fails the served answer
        ctx.shadow_version, ctx.shadow_error = version, type(exc).__name__
        metrics.inc("keel_gateway_shadow_errors_total", {"model_version": str(version)})
        return
    ctx.shadow_version = version
    ctx.shadow_score = float(scores[0]) if len(scores) == 1 else np.round(scores, 6).tolist()
    metrics.inc("keel_gateway_shadow_scores_total", {"model_version": str(version)})
