"""The request path as named stages: parse → admit → validate → features → route → infer (or coarse) → answer → log.

``handle`` reads like that list. Each stage is a function of the served model (model.py), the request's context
(request.py) and, where it needs what the process shares, the server (app.py); each starts with ``ctx.check``: past
the request's deadline it does no work (a fast 503 ``deadline_exceeded`` naming the stage), for a client that has
gone it drops the request. Every exit builds its answer in answers.py and is logged once by ``log``.

- **parse**: the JSON body, the entities (or direct features), tenant, risk level, unit, experiment, explanation.
- **admit** (admit.py): the tenant's rate limit (429) and budget (429), then a place in the process for the model's
  tier (admission.py, at most the adaptive concurrency limit's share for the tier, concurrency.py) and in the
  request's risk lane — waiting no longer than its deadline allows; otherwise a 503 ``shed`` / ``overloaded``.
- **validate**: the request contract (422 ``invalid_input``, or scored on defaults when the policy says so).
- **features**: the online store's features into the request matrix.
- **route**: the routing table, the runtime's state, the sticky split or experiment variant.
- **infer**: Triton (scoring.py: breakers, retries; the shadow beside it), else the coarse model off the event loop
  (coarse.py) — also for a call that timed out on local overload, or a request with no time left for Triton before
  the time kept for the coarse model, for that request alone —, else the policy's last resort, else a structured
  error.
- **answer** / **log**: answers.py; one exposure-log line, usage metering and metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

from gpu_runtime.gateway.admit import admitted, tier_rank
from gpu_runtime.gateway.answers import answer, internal_error, refusal
from gpu_runtime.gateway.control import choose_route
from gpu_runtime.gateway.explain import requested_top_k
from gpu_runtime.gateway.health import count_degraded
from gpu_runtime.gateway.limits import RequestError, identifier, parse_json, tenant_identifier
from gpu_runtime.gateway.overload import lateness
from gpu_runtime.gateway.request import CLIENT_GONE_STATUS, Answer, ClientGone, RequestContext
from gpu_runtime.gateway.shadow import finish_shadow, start_shadow

COARSE_RESERVE_SHARE = 0.3  # of a request's budget kept for the coarse model when Triton does not answer
HEDGE_SHARE = 0.4  # of its budget, when the highest tier's request is scored by the coarse model too (``hedge``)


async def handle(server: Any, model: Any, ctx: RequestContext, body: bytes | RequestError) -> Answer | None:
    """Answer one request and log it; None when the client has gone (nothing to send)."""
    result: Answer | None = None
    shadow = None
    try:
        if isinstance(body, RequestError):
            raise body
        parse(server, model, ctx, body)
        async with admitted(server, model, ctx):
            deployed(model, ctx)  # a model with nothing deployed refuses before its input is judged
            if needs_features(model):
                validate(model, ctx)
                features(model, ctx)
            route(model, ctx)
            shadow = await infer(server, model, ctx)
        await finish_shadow(shadow, ctx, model.metrics)
        result = answer(model.features, ctx)
    except ClientGone as gone:
        ctx.status, ctx.error, ctx.stage = CLIENT_GONE_STATUS, "client_gone", gone.stage
        model.metrics.inc("keel_gateway_client_gone_total", {"stage": gone.stage})
    except RequestError as err:
        if shadow is not None:
            shadow[1].cancel()
        if err.code == "deadline_exceeded":
            ctx.late = lateness(server.load.signals(), ctx.arrived, ctx.admitted_at, time.monotonic())
        result = refusal(ctx, err)
    except Exception as exc:  # noqa: BLE001 - the gateway answers 500 and logs, never drops a request silently
        result = internal_error(ctx, exc)
    log(server, model, ctx)
    return result


def parse(server: Any, model: Any, ctx: RequestContext, body: bytes) -> None:
    ctx.check("parse")
    if ctx.asked_model is not None and ctx.asked_model not in server.models:
        shown = ctx.asked_model if len(ctx.asked_model) <= 64 else ctx.asked_model[:64] + "…"
        raise RequestError(404, "unknown_model", f"no model {shown!r} is served here", models=list(server.models))
    req = parse_json(body)
    ctx.req = req
    ctx.tenant = tenant_of(model.config.edge_token, ctx.headers, req)  # who asks, before what is asked is judged
    ctx.entities = model.inputs.entities_of(req, ctx.generic)
    risk = req.get("risk_level", 3)
    if not isinstance(risk, int) or isinstance(risk, bool) or risk not in model.lanes:
        raise RequestError(
            422, "invalid_risk_level", f"risk_level must be one of {sorted(model.lanes)}", value=str(risk)[:40]
        )
    given = ctx.headers.get("x-keel-risk-levels") if model.config.edge_token is not None else None
    if given is not None and str(risk) not in given.split(","):  # behind the edge: the tenant's levels only
        raise RequestError(403, "forbidden", f"tenant {ctx.tenant} may use risk levels {given}, not {risk}",
                           field="risk_level")  # fmt: skip
    if model.config.edge_token is not None:
        claim(model, ctx.tenant, risk)
    ctx.risk_level = risk
    ctx.unit_id = identifier(req["unit_id"], "unit_id") if req.get("unit_id") is not None else ctx.request_id
    experiment = ctx.headers.get("x-experiment-id")
    ctx.experiment_id = identifier(experiment, "header x-experiment-id") if experiment is not None else None
    ctx.parsed = True  # every identifier is known to be safe to log
    ctx.top_k = requested_top_k(req, model.features.names)


def tenant_of(edge_token: str | None, headers: Any, req: dict) -> str:
    """Who is asking. Behind the edge: the tenant its filter authenticated (``x-keel-tenant``, trusted only with the
    edge's token: a request that did not come through the edge is 401), and a body ``tenant_id`` naming another
    tenant is 403 — a caller cannot spend another tenant's budget. Without an edge: the body's ``tenant_id``."""
    claimed = tenant_identifier(req["tenant_id"]) if req.get("tenant_id") is not None else None
    if edge_token is None:
        return claimed or "default"
    token = headers.get("x-keel-edge") or ""
    if not hmac.compare_digest(token.encode(), edge_token.encode()) or not headers.get("x-keel-tenant"):
        raise RequestError(401, "unauthenticated", "requests come through the edge with an API key (docs/serving.md)")
    tenant = tenant_identifier(headers.get("x-keel-tenant"))
    if claimed is not None and claimed != tenant:
        raise RequestError(403, "tenant_mismatch", f"the API key is tenant {tenant}'s; the body names {claimed}",
                           field="tenant_id")  # fmt: skip
    return tenant


def claim(model: Any, tenant: str, risk: int) -> None:
    """Behind the edge, the tenant's own policy must give it this model's tier and the risk level — checked here too,
    whatever the edge let through (defence in depth: a request that reached a worker without the edge's tier check
    is still refused, 403). A tenant the gateway has not seen yet is looked for once more in the store (the edge may
    have applied a new tenant's version first); one not in force there is 403."""
    follower = model.follower
    if follower.tenants is None:  # no policy store followed: no tenant is in force here
        return
    found = follower.tenants.get(tenant)
    if found is None:
        follower.reload_policies(force=True)
        found = follower.tenants.get(tenant)
    if found is None:
        raise RequestError(
            403, "forbidden", f"tenant {tenant} is not in force at policy version {follower.policy_version}"
        )
    refused = found.may_claim(model.tier(), risk)
    if refused is not None:
        raise RequestError(403, "forbidden", refused)


def needs_features(model: Any) -> bool:
    """False only while the runtime is down and no coarse model can stand in: the answer is then the policy's last
    resort or 503 ``runtime_unavailable`` whatever the request holds, so it is not validated."""
    runtime = model.runtime
    return runtime is None or runtime.up or model.coarse.booster(model.routing) is not None


def validate(model: Any, ctx: RequestContext) -> None:
    ctx.check("validate")
    ctx.checked = model.inputs.validate(ctx.req, ctx.entities, model.policy.invalid_input)
    ctx.rows = ctx.checked.rows
    ctx.entity_key = ctx.checked.entity_key


def features(model: Any, ctx: RequestContext) -> None:
    ctx.check("features")
    ctx.values, degraded = model.inputs.matrix(ctx.checked)
    ctx.degraded += degraded


def deployed(model: Any, ctx: RequestContext) -> None:
    """The routing table in force, or 503 ``not_deployed``."""
    table = model.routing
    if table is None:  # the first deployment may be newer than the watcher's last look
        model.follower.reload_routing(force=True)
        table = model.routing
    if table is None:
        raise RequestError(503, "not_deployed", "no model is deployed yet (no routing table)", retry_after_s=1)
    ctx.table = table


def route(model: Any, ctx: RequestContext) -> None:
    ctx.check("route")
    if model.runtime is not None and not model.runtime.up:
        return  # infer answers without Triton (runtime_unavailable)
    split, experiments = model.follower.split, model.follower.experiments  # the store's, as the gateway follows it
    chosen, variant, flags = choose_route(ctx.table, split, ctx.unit_id, ctx.experiment_id, experiments)
    ctx.route, ctx.variant, ctx.routed_version = chosen, variant, chosen.version  # who was asked, before any fallback
    ctx.degraded += flags


async def infer(server: Any, model: Any, ctx: RequestContext):
    """Triton's scores (and the shadow call, returned for the answer to wait on), else the coarse model's."""
    ctx.check("infer")
    if ctx.route is None:  # the runtime is down
        await runtime_unavailable(server, model, ctx)
        return None
    scorer = model.scorer
    scorer.follow_restarts()
    table = ctx.table
    x = model.pooled(ctx.values)
    has_coarse = table.coarse is not None
    budget_s = ctx.budget_ms / 1000
    reserve = COARSE_RESERVE_SHARE * budget_s if has_coarse else 0.0
    scorer.retry_budget.on_request()
    shadow = start_shadow(
        scorer, model.follower.split, table, ctx.route.version, ctx.values, max(ctx.remaining_s(), 0.001)
    )
    try:
        triton = scorer.score(
            table, ctx.route, x, ctx.top_k is not None, ctx.deadline, model.follower.fresh_table, budget_s, reserve
        )
        if has_coarse and tier_rank(model, ctx.tier or model.tier()) == 0:
            hedged = await hedge(server, model, ctx, triton)
            if hedged is None:  # the coarse model answered first
                if shadow is not None:
                    shadow[1].cancel()
                return None
            scores, served, more, explained = hedged
        else:
            scores, served, more, explained = await triton
    except RequestError as err:
        if shadow is not None:
            shadow[1].cancel()
        runtime = model.runtime
        if err.code == "backend_error" and runtime is not None and (not runtime.up or runtime.died()):
            await runtime_unavailable(server, model, ctx)  # it died under this request
            return None
        late = err.code == "deadline_exceeded"  # a local timeout, or no time left for Triton before the reserve
        if err.code not in ("backend_error", "no_healthy_model") and not late:
            raise
        # this request, within the time kept for it; a local overload opens no breaker, so the next one tries Triton
        why = ("local_overload" if err.details.get("local_overload") else "backend_error"
               if err.details.get("version_timeout") else "deadline_near") if late else \
            "breaker_open" if err.code == "no_healthy_model" else "backend_error"  # fmt: skip
        if not await coarse(server, model, ctx, why):
            raise
        return None
    ctx.scores, ctx.route, ctx.explained = scores, served, explained
    ctx.degraded += more
    return shadow


async def hedge(server: Any, model: Any, ctx: RequestContext, triton) -> tuple | None:
    """The highest tier's Triton call, hedged: not answered by ``HEDGE_SHARE`` of the budget, the coarse model scores
    it too (first in the coarse pool's queue); the first answer is the request's — Triton's result, or None when the
    coarse model's came first (in ``ctx``, flagged ``hedged``). The call left behind is abandoned (never cancelled,
    scoring.py) and still judged when it ends. docs/serving.md: why (a busy machine's run queues)."""
    call = asyncio.ensure_future(triton)
    wait = ctx.arrived + HEDGE_SHARE * ctx.budget_ms / 1000 - time.monotonic()
    if wait > 0:
        await asyncio.wait((call,), timeout=wait)
    if call.done():
        return call.result()
    booster = model.coarse.booster(ctx.table)
    if booster is None or server.coarse_pool.full(0):
        return await call
    model.metrics.inc("keel_gateway_hedges_total", {"tier": ctx.tier or model.tier()})
    fallback = asyncio.ensure_future(model.coarse.score(
        server.coarse_pool, booster, ctx.values, ctx.top_k is not None, ctx.deadline, 0
    ))  # fmt: skip
    await asyncio.wait((call, fallback), return_when=asyncio.FIRST_COMPLETED)
    if call.done():
        failed = call.exception()
        if failed is None or not _coarse_may_answer(failed):  # Triton's answer, or a refusal the coarse model
            fallback.add_done_callback(_consumed)  # cannot mend (the input refused): its result is not needed
            return call.result()
    try:
        scores, explained = await fallback
    except RequestError:  # the coarse pool could not answer in time: Triton's outcome is the request's
        return await call
    call.add_done_callback(_consumed)  # its outcome is judged in scoring.py; the request has its answer
    coarse_answered(model, ctx, scores, explained, "hedged")
    return None


def _coarse_may_answer(exc: BaseException) -> bool:  # would infer answer a call that failed so from the coarse model?
    return isinstance(exc, RequestError) and exc.code in ("backend_error", "no_healthy_model", "deadline_exceeded")


def _consumed(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned call's error is no "never retrieved" warning


async def coarse(server: Any, model: Any, ctx: RequestContext, why: str) -> bool:
    """The coarse model's answer, off the event loop (False: the model has no usable coarse model)."""
    booster = model.coarse.booster(ctx.table)
    if booster is None:
        return False
    rank = tier_rank(model, ctx.tier or model.tier())
    scores, explained = await model.coarse.score(server.coarse_pool, booster, ctx.values, ctx.top_k is not None,
                                                 ctx.deadline, rank)  # fmt: skip
    coarse_answered(model, ctx, scores, explained, why)
    return True


def coarse_answered(model: Any, ctx: RequestContext, scores, explained, why: str) -> None:  # flagged, counted
    ctx.scores, ctx.explained, ctx.coarse, ctx.route = scores, explained, True, ctx.table.coarse
    ctx.degraded += [why, "coarse_fallback"]
    model.metrics.inc("keel_gateway_coarse_answers_total", {"model": ctx.table.model})


async def runtime_unavailable(server: Any, model: Any, ctx: RequestContext) -> None:
    """Triton is down (the supervisor is restarting it): the coarse model's answer when the model has one, else the
    policy's last-resort score — both flagged ``runtime_unavailable`` — or a structured 503."""
    model.metrics.inc("keel_gateway_runtime_unavailable_total", {})
    ctx.variant = ctx.routed_version = None
    if await coarse(server, model, ctx, "runtime_unavailable"):
        return
    runtime = model.runtime
    score = model.policy.last_resort_score
    if score is None:
        raise RequestError(
            503, "runtime_unavailable",
            (f"the model runtime is {runtime.state} ({runtime.last_failure}); retry shortly"
             if not runtime.up else "the model runtime's process has exited; it is being restarted, retry shortly"),
            retry_after_s=1,
        )  # fmt: skip
    ctx.last_resort = score
    ctx.rows = ctx.rows or (len(ctx.entities) if ctx.entities else 1)
    ctx.explained = None
    ctx.degraded = ["runtime_unavailable"]


def log(server: Any, model: Any, ctx: RequestContext) -> None:
    """The log stage: the exposure-log line, usage metering and the request metrics — for every request."""
    latency = time.perf_counter() - ctx.started
    ctx.latency_ms = round(latency * 1000, 3)
    if ctx.status == 200:
        count_degraded(model.metrics, ctx.degraded)
    record = ctx.exposure_record()
    if not server.exposures.append(record):  # the answer stands; the lost record is counted and reported
        model.metrics.inc("keel_gateway_exposure_write_failures_total", {})
    model.meter.meter(record)
    version = str(record["model_version"]) if record.get("model_version") is not None else "none"
    status = str(ctx.status)
    model.metrics.inc("keel_gateway_requests_total", {"model_version": version, "status": status})
    model.metrics.observe("keel_gateway_request_duration_seconds", {"model_version": version}, latency)
    if ctx.status >= 400:
        model.metrics.inc("keel_gateway_errors_total", {"model_version": version, "code": str(ctx.error or status)})
