"""The answer stage: one builder for every exit of the request path, so a normal answer, the coarse model's, the
last-resort score and every refusal have one shape.

- ``answer``: the 200 — score, confidence_score (and a regression's ``interval``: ``scored``), model_version, release_id, request_id, variant, degraded flags,
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
from keel import intervals
from keel.deploy.routing import Route
from keel.features.spec import LabelDomain


def answer(features: Any, ctx: RequestContext) -> Answer:
    """The 200 for the scores in ``ctx`` (the model's, the coarse model's or the policy's last resort)."""
    table = ctx.table
    if ctx.last_resort is not None:
        scores = np.full(ctx.rows or 1, ctx.last_resort, dtype=np.float64)
        route = None
    else:
        scores, route = ctx.scores, ctx.route
    predictions = scored(
        features.label.task, scores, route if ctx.last_resort is None else None, features.label.domain
    )
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
        **({k: predictions[0][k] for k in ("interval", "interval_coverage")} if "interval" in predictions[0] else {}),
        **({"coarse_version": route.version} if ctx.coarse else {}),
        **({"explanation": predictions[0]["explanation"]} if ctx.explained is not None else {}),
        **({"predictions": predictions} if len(predictions) > 1 else {}),
    }
    headers = {"x-request-id": ctx.request_id, **ctx.extra_headers}
    if route is not None:
        headers = {"x-model-signature": route.sha256, **headers}
    ctx.status = 200
    return Answer(200, payload, headers)


def scored(
    task: str, scores: np.ndarray, route: Route | None, domain: LabelDomain | None = None
) -> list[dict[str, Any]]:
    """Each row's score and its confidence in [0, 1] (keel/intervals.py): a binary model's |2·p − 1|; a regression's
    from the prediction interval its version carries (``route.interval``: coverage, half-width, the label's spread),
    which the answer shows as ``interval: [lo, hi]`` at ``interval_coverage`` — score and interval held to the label's
    ``domain``. No model (``route`` None: the policy's last-resort score), or a regression version without an
    interval: confidence 0, no interval."""
    if task == "regression":
        scores = intervals.clip_scores(scores, domain)
    if route is None:
        return [{"score": s, "confidence_score": 0.0} for s in scores.tolist()]
    if task == "binary":
        return [{"score": s, "confidence_score": c} for s, c in zip(scores.tolist(), np.abs(2.0 * scores - 1.0).tolist(), strict=True)]  # fmt: skip
    if route.interval is None:
        return [{"score": s, "confidence_score": 0.0} for s in scores.tolist()]
    coverage, half_width, spread = route.interval
    lo, hi = intervals.bounds(scores, half_width, domain)
    conf = intervals.confidence(scores, half_width, spread)
    return [{"score": s, "confidence_score": c, "interval": [a, b], "interval_coverage": coverage}
            for s, c, a, b in zip(scores.tolist(), conf.tolist(), lo.tolist(), hi.tolist(), strict=True)]  # fmt: skip


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
