"""The answer stage: one builder for every exit of the request path, so a normal answer, the coarse model's, the
last-resort score and every refusal have one shape.

- ``answer``: the 200 — score, confidence_score, model_version, release_id, request_id, variant, degraded flags,
  explanations when asked, ``predictions`` for a batch; header ``x-model-signature`` (the sha256 of the model that
  answered: the coarse model's when it did).
- ``refusal``: every other status, ``{"request_id", "error": {"code", "message", …}}``; a 503 (and a 429) carries
  ``Retry-After``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpu_runtime.gateway.explain import explanations
from gpu_runtime.gateway.limits import RequestError
from gpu_runtime.gateway.request import Answer, RequestContext


def answer(features: Any, ctx: RequestContext) -> Answer:
    """The 200 for the scores in ``ctx`` (the model's, the coarse model's or the policy's last resort)."""
    table = ctx.table
    if ctx.last_resort is not None:
        scores = np.full(ctx.rows or 1, ctx.last_resort, dtype=np.float64)
        route = None
    else:
        scores, route = ctx.scores, ctx.route
    confidence = np.abs(2.0 * scores - 1.0)
    predictions = [
        {"score": s, "confidence_score": c} for s, c in zip(scores.tolist(), confidence.tolist(), strict=True)
    ]
    if ctx.explained is not None:
        shown = explanations(features.names, ctx.values, ctx.explained.contrib, ctx.explained.raw_score, ctx.top_k,
                             explained_units(features))  # fmt: skip
        for p, e in zip(predictions, shown, strict=True):
            p["explanation"] = e
    payload = {
        "request_id": ctx.request_id,
        "model": table.model,
        "model_version": ctx.model_version,
        "release_id": route.release_id if route is not None else None,
        "variant": "coarse" if ctx.coarse else (ctx.variant if route is not None else None),
        "degraded": sorted(set(ctx.degraded)),
        "score": predictions[0]["score"],
        "confidence_score": predictions[0]["confidence_score"],
        **({"coarse_version": route.version} if ctx.coarse else {}),
        **({"explanation": predictions[0]["explanation"]} if ctx.explained is not None else {}),
        **({"predictions": predictions} if len(predictions) > 1 else {}),
    }
    headers = {"x-request-id": ctx.request_id, **ctx.extra_headers}
    if route is not None:
        headers = {"x-model-signature": route.sha256, **headers}
    ctx.status = 200
    return Answer(200, payload, headers)


def refusal(ctx: RequestContext, err: RequestError) -> Answer:
    """The structured answer to a request the gateway did not score."""
    ctx.status, ctx.error = err.status, err.code
    if ctx.stage is None:
        ctx.stage = err.details.get("stage")
    headers = {"x-request-id": ctx.request_id}
    if err.status in (429, 503):
        headers["retry-after"] = str(max(1, math.ceil(float(err.details.get("retry_after_s") or 1))))
    return Answer(err.status, err.body(ctx.request_id), headers)


def internal_error(ctx: RequestContext, exc: Exception) -> Answer:
    ctx.status, ctx.error = 500, "internal"
    return Answer(500, {"request_id": ctx.request_id, "error": {"code": "internal", "message": str(exc)}},
                  {"x-request-id": ctx.request_id})  # fmt: skip


def explained_units(features: Any) -> str:
    """What an explanation's contributions are in: log-odds for a binary label, else the label's own units."""
    label = features.label
    return "log-odds" if label.task == "binary" else f"{label.column} ({label.description or 'the label'})"
