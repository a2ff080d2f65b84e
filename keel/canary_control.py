"""The canary controller's tick, as code a test can call: each running canary policy gets one decision per tick.

The rollout state lives in the canary policy itself (``state``: status, step, started_at, step_started_at; absent =
not started). Each arm's evidence comes from the exposure log since the step started (keel.exposures) — with the
realized outcomes of the entities it scored and the p99 target of the model's SLA tier — and keel.canary.decide says
what to do. For every action but *hold*, the new state and the traffic split (an ``ab_test`` policy named
``<canary>.split``: the challenger gets the step's percent) are one policy commit whose reason is the evidence;
gateways follow the store, so the commit *is* the action. A promotion makes the challenger the registry's champion
first. The canary sensor (sensors/canary.py) calls ``tick`` and turns each commit into a deployment run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from keel.canary import decide
from keel.canary_plan import FINISHED, PROMOTED, RUNNING, ArmStats, CanaryPlan, CanaryState
from keel.exposures import UNREADABLE, arm_stats, read_exposure_scan, realized_labels
from keel.faults import fault
from keel.loop.estimate import CANARY_METRIC, MIN_ROWS, EstimateVerdict, Estimator, compare
from keel.loop.shadow import ShadowPolicy, ShadowVerdict, shadow_verdict
from keel.serving_health import tier_for
from keel.usecase import by_model

AUTHOR = "canary-controller"
log = logging.getLogger(__name__)


def unreadable(what: str, exc: BaseException, problems: list[str] | None) -> str:
    """Evidence that could not be read now (one of ``UNREADABLE``): logged with its traceback and recorded in
    ``problems``; returns the words the tick's decision carries in its reasons."""
    text = f"{what} could not be read: {type(exc).__name__}: {exc}"
    log.warning("canary evidence: %s", text, exc_info=exc)
    if problems is not None:
        problems.append(text)
    return text


def split_for(body: dict, percent: float, salt: str, shadow: bool = False) -> dict:
    """The traffic split of a step: the challenger at ``percent``; in a shadow step, scored in shadow too."""
    share = round(percent / 100.0, 12)
    shadow = {"shadow": body["challenger_version"]} if shadow else {}
    return {
        "model": body["model"],
        "salt": salt,
        "variants": [
            {"name": "champion", "version": body["champion_version"], "weight": round(1.0 - share, 12)},
            {"name": "challenger", "version": body["challenger_version"], "weight": share},
        ],
        **shadow,
    }


def shadowed(frame: pl.DataFrame, body: dict, since: float) -> pl.DataFrame:
    """The canary's pairs since ``since``: the champion's answers that the challenger scored in shadow."""
    return frame.filter(
        (pl.col("ts") >= since)
        & (pl.col("model") == body["model"])
        & (pl.col("model_version") == body["champion_version"])
        & (pl.col("shadow_version") == body["challenger_version"])
        & pl.col("score").is_not_null()
        & pl.col("shadow_score").is_not_null()
    )


def shadow_evidence(
    body: dict, plan: CanaryPlan, state: CanaryState, exposures_dir, storage_dir: Path | None = None,
    cluster_s: float = 86400.0, problems: list[str] | None = None,
) -> ShadowVerdict | None:  # fmt: skip
    """The paired verdict on the requests the champion answered and the challenger scored in shadow since the step
    began, on their realized labels, clustered by ``cluster_s`` of (simulated) time — a day for the shadow step's
    verdict, an hour for a canary step's quality guard; None when the evidence cannot be read (said in ``problems``;
    any other error propagates: a bug is not "no data")."""
    try:
        frame, _ = read_exposure_scan(exposures_dir, since=state.step_started_at)
        uc = by_model(body["model"])
        if "shadow_score" not in frame.columns:
            return shadow_verdict(np.array([]), np.array([]), np.array([]), np.array([]), plan.shadow, uc.task)
        both = shadowed(frame, body, state.step_started_at)
        labels = realized_labels(uc.features, both["entity_key"], storage_dir and Path(storage_dir) / uc.name)
    except UNREADABLE as exc:
        unreadable("the shadow's exposure log or labels", exc, problems)
        return None
    pairs = both.height
    both = both.filter(pl.col("entity_key").is_in(list(labels)))
    y = both["entity_key"].replace_strict(dict(labels), return_dtype=pl.Float64).to_numpy()
    clusters = (both["ts"].to_numpy() // cluster_s).astype(np.int64)
    policy = plan.shadow or ShadowPolicy(min_labelled=plan.min_labelled, min_clusters=2)
    verdict = shadow_verdict(y, both["score"].to_numpy(), both["shadow_score"].to_numpy(), clusters, policy, uc.task)
    span = float((clusters.max() - clusters.min() + 1) * cluster_s) if clusters.size else 0.0
    return replace(verdict, labelled_span_s=span, reason=verdict.reason + missing_labels(verdict, pairs, policy))


def estimate_evidence(
    body: dict, plan: CanaryPlan, state: CanaryState, exposures_dir, registry, problems: list[str] | None = None
) -> EstimateVerdict | None:
    """The two arms judged on their quality estimated from their scores since the step began, before any label
    (keel/loop/estimate.py): on the same requests where the challenger scored the champion's in shadow (the shadow
    step, a paired plan), else each arm on its own answers. None when there is nothing to estimate with: a version
    whose registry record keeps no estimator, a regression (its error model needs the features the exposure log does
    not keep), fewer than ``MIN_ROWS`` scored answers an arm, or a log that cannot be read."""
    try:
        frame, _ = read_exposure_scan(exposures_dir, since=state.step_started_at)
    except UNREADABLE as exc:
        unreadable("the exposure log (for the estimates)", exc, problems)
        return None
    champion, challenger = body["champion_version"], body["challenger_version"]
    frame = frame.filter(
        (pl.col("ts") >= state.step_started_at) & (pl.col("model") == body["model"]) & (pl.col("status") == 200)
    )
    pairs = shadowed(frame, body, state.step_started_at)
    if plan.in_shadow(state) or plan.paired:
        arms = {champion: pairs["score"].to_numpy(), challenger: pairs["shadow_score"].to_numpy()}
    else:
        scored = frame.filter(pl.col("score").is_not_null())
        arms = {v: scored.filter(pl.col("model_version") == v)["score"].to_numpy() for v in (champion, challenger)}
    metric = (plan.estimate or {}).get("metric") or CANARY_METRIC[by_model(body["model"]).task]
    estimates = {}
    for version, scores in arms.items():
        estimator = Estimator.from_metadata(
            registry.get(body["model"], registry.sha_of_version(body["model"], version)).metadata
        )
        if estimator is None or scores.size < MIN_ROWS:
            return None
        estimates[version] = estimator.estimate(scores).get(metric)
        if estimates[version] is None:
            return None
    margin = (plan.estimate or {}).get("margin", plan.max_log_loss_increase)
    alpha = (plan.estimate or {}).get("alpha", 0.01)
    return compare(estimates[challenger], estimates[champion], margin, alpha)


def missing_labels(verdict: ShadowVerdict, pairs: int, policy: ShadowPolicy) -> str:
    """Why a shadow has too few labelled pairs to be judged, said beside its verdict (a rollback for lack of labels
    then says where they went): no pair at all, or pairs whose outcomes are not in yet."""
    if verdict.labelled >= policy.min_labelled:
        return ""
    if pairs == 0:
        return (" — no request was scored by both since the step began: the challenger scored none in shadow (not "
                "deployed yet, or its shadow scoring failed), or the champion answered none")  # fmt: skip
    return (f" — {pairs:,} requests scored by both, {verdict.labelled:,} of them with a realized label: the others' "
            "outcomes are not built yet (they land the day after, and a month's new days are built a week at a time "
            "on the stepped clock)")  # fmt: skip


def first_answer(body: dict, state: CanaryState, exposures_dir, problems: list[str] | None = None) -> float | None:
    """When the challenger first answered a request, or scored one in shadow, since the rollout started (None: not
    yet — its deployment may still be to run on a busy machine; or the log cannot be read now, said in
    ``problems``)."""
    try:
        frame, _ = read_exposure_scan(exposures_dir, since=state.started_at)
    except UNREADABLE as exc:
        unreadable("the exposure log (the challenger's first answer)", exc, problems)
        return None
    if frame.is_empty() or "model" not in frame.columns:
        return None
    version = body["challenger_version"]
    answered = pl.col("model_version") == version
    if "shadow_version" in frame.columns and "shadow_score" in frame.columns:
        answered = answered | ((pl.col("shadow_version") == version) & pl.col("shadow_score").is_not_null())
    ts = frame.filter((pl.col("ts") >= state.started_at) & (pl.col("model") == body["model"]) & answered)["ts"]
    return float(ts.min()) if len(ts) else None


def canary_salt(name: str, body: dict, state: CanaryState) -> str:
    """This rollout's own salt: the canary, its two versions and when it started — the next canary (or this one run
    again) places units independently of this one, while every step of one rollout keeps units where they were."""
    return f"{name}:v{body['champion_version']}->v{body['challenger_version']}@{state.started_at:.0f}"


def evidence_for(
    body: dict,
    state: CanaryState,
    exposures_dir,
    storage_dir: Path | None = None,
    problems: list[str] | None = None,
    slow_over_ms: float | None = None,
    before_s: float = 0.0,
) -> tuple[ArmStats | None, ArmStats | None, ArmStats | None]:
    """The step's two arms (challenger, champion) from the exposure log and the realized labels, and — with
    ``before_s`` — the champion's answers in the ``before_s`` seconds before the step: the same host's recent latency,
    for a step where the champion answers nothing. None for what could not be read."""
    start = state.step_started_at - before_s
    try:
        frame, scan = read_exposure_scan(exposures_dir, since=start)
        # the runtime's log holds every model's requests: the canary's evidence is its model's
        frame = frame.filter((pl.col("ts") >= start) & (pl.col("model") == body["model"]))
        if scan.skipped and problems is not None:
            problems.append(f"exposure log: {scan.skipped} lines were not whole records, e.g. {scan.examples[0]}")
        uc = by_model(body["model"])
        labels = realized_labels(uc.features, frame["entity_key"], storage_dir and Path(storage_dir) / uc.name)
    except UNREADABLE as exc:
        unreadable("the exposure log or the realized labels", exc, problems)
        return None, None, None
    since, champion = state.step_started_at, body["champion_version"]
    before = (
        arm_stats(frame, champion, since=start, until=since, task=uc.task, slow_over_ms=slow_over_ms)
        if before_s > 0
        else None
    )
    return (
        arm_stats(
            frame, body["challenger_version"], since=since, labels=labels, task=uc.task, slow_over_ms=slow_over_ms
        ),
        arm_stats(frame, champion, since=since, labels=labels, task=uc.task, slow_over_ms=slow_over_ms),
        before,
    )


def sla_p99_target(policies: dict, model: str) -> float:
    """The p99 target of ``model``'s SLA tier, read as the gateways read it (keel.serving_health.tier_for)."""
    return tier_for(policies, model).p99_ms


def tick(
    policies,
    registry,
    exposures_dir,
    now: float,
    storage_dir: Path | None = None,
    problems: list[str] | None = None,
    models: frozenset[str] | None = None,
) -> list[dict]:
    """One pass over the canary policies (of ``models`` only, when given); returns what was committed (for run
    requests and logs). A canary whose policy is malformed, or whose step fails, is reported in ``problems`` and
    skipped: the others proceed."""
    acted = []
    current = policies.state()
    for name, policy in sorted(current.items()):
        if policy.type != "canary" or (models is not None and policy.body.get("model") not in models):
            continue
        try:
            done = _tick_one(
                policies, registry, current, name, dict(policy.body), exposures_dir, now, storage_dir, problems
            )
        except Exception as exc:  # noqa: BLE001 - one bad canary must not stop every other rollout; no decision is made
            log.exception("canary %r skipped this tick: its decision failed", name)
            if problems is not None:
                problems.append(f"canary '{name}' skipped, no decision made: {type(exc).__name__}: {exc}")
            continue
        if done is not None:
            acted.append(done)
    return acted


def _tick_one(policies, registry, current, name, body, exposures_dir, now, storage_dir, problems) -> dict | None:
    raw = body.get("state")
    if raw is None:  # not started: the first step's split, now
        state = CanaryState(started_at=now, step_started_at=now)
        plan = CanaryPlan.from_policy(body)
        action, percent, reasons, evidence = "start", plan.steps[0], ("rollout started",), {}
    else:
        state = CanaryState(**raw)
        if state.status in FINISHED:
            return None
        plan = CanaryPlan.from_policy(body, p99_target_ms=sla_p99_target(current, body["model"]))
        unread: list[str] = []  # evidence this tick could not read: in the problems and the decision's reasons
        first = state.armed_at if state.armed_at is not None else first_answer(body, state, exposures_dir, unread)
        estimate = estimate_evidence(body, plan, state, exposures_dir, registry, unread)
        if plan.in_shadow(state):
            shadow = shadow_evidence(body, plan, state, exposures_dir, storage_dir, problems=unread)
            d = decide(plan, state, None, None, now, shadow, first_answer=first, estimate=estimate)
        else:
            last = state.step + 1 >= len(plan.steps)  # the champion answers nothing: its answers before the step
            challenger, champion, before = evidence_for(
                body, state, exposures_dir, storage_dir, unread, plan.p99_target_ms, plan.interval_s if last else 0.0
            )
            paired = (
                shadow_evidence(body, plan, state, exposures_dir, storage_dir, 3600.0, problems=unread)
                if plan.paired
                else None
            )
            d = decide(
                plan,
                state,
                challenger,
                champion,
                now,
                paired=paired,
                first_answer=first,
                champion_before=before,
                estimate=estimate,
            )
        if estimate is not None:  # recorded beside every decision, acted on only where the plan says
            d = replace(d, evidence={**d.evidence, "estimate": estimate.as_metadata()})
        if unread:
            d = replace(d, reasons=(*d.reasons, *unread))
            if problems is not None:
                problems.extend(unread)
        if d.action in ("hold", "none"):
            return None
        if d.action == "promote" and fault("KEEL_FAULT_PROMOTION"):  # a failing control (keel/faults.py): held
            return None
        action, percent, reasons, evidence, state = d.action, d.percent, d.reasons, d.evidence, d.state
    if action == "promote":
        sha = registry.sha_of_version(body["model"], body["challenger_version"])
        registry.promote(body["model"], sha, f"canary {name} promoted")
    commit = policies.apply(
        {
            name: ("canary", body | {"state": state.__dict__}),
            f"{name}.split": (
                "ab_test",
                split_for(
                    body,
                    percent if state.status != PROMOTED else 100.0,
                    canary_salt(name, body, state),
                    shadow=plan.in_shadow(state) or (plan.paired and state.status == RUNNING),
                ),  # fmt: skip
            ),
        },
        author=AUTHOR,
        reason=json.dumps(
            {"action": action, "percent": percent, "reasons": list(reasons), "evidence": evidence}, default=str
        ),
    )
    return {"name": name, "action": action, "percent": percent, "version": commit.version, "reasons": list(reasons)}
