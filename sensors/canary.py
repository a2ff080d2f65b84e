"""The canary sensor: drives each running canary policy one decision per tick.

Per tick and canary policy (type ``canary`` in the policy store): the rollout state lives in the policy itself
(``state``: status, step, started_at, step_started_at; absent = not started). The sensor builds each arm's evidence
from the exposure log since the step started (keel.exposures) — with the realized outcomes of the flights it
scored, from the validated flights in storage, and the p99 target of the model's SLA tier (the store's ``sla_tier``
policy, else the gateway's default tiers) — asks keel.canary.decide, and — for every action
but *hold* — commits the new state together with the traffic split (an ``ab_test`` policy named
``<canary>.split``: the challenger gets the step's percent) as one policy commit whose reason is the evidence.
Gateways follow the store, so the commit *is* the action. Each commit also becomes a run of ``model_deployment``
(run key = the policy version, so a duplicate tick or a restarted daemon never acts twice), and a promotion makes
the challenger the registry's champion first.
"""

import json
import time
from pathlib import Path

import dagster as dg
import polars as pl

from assets.deployment import MODEL_DEPLOYMENT
from keel.canary import FINISHED, PROMOTED, ArmStats, CanaryPlan, CanaryState, decide
from keel.exposures import arm_stats, read_exposure_scan, realized_labels
from keel.policies.gateway import GatewayPolicy, effective_policy
from resources.home import KeelHomeResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from sensors.problems import automation_problems

AUTHOR = "canary-controller"


def split_for(body: dict, percent: float, salt: str) -> dict:
    share = round(percent / 100.0, 12)
    return {
        "model": body["model"],
        "salt": salt,
        "variants": [
            {"name": "champion", "version": body["champion_version"], "weight": round(1.0 - share, 12)},
            {"name": "challenger", "version": body["challenger_version"], "weight": share},
        ],
    }


def canary_salt(name: str, body: dict, state: CanaryState) -> str:
    """This rollout's own salt: the canary, its two versions and when it started — the next canary (or this one run
    again) places units independently of this one, while every step of one rollout keeps units where they were."""
    return f"{name}:v{body['champion_version']}->v{body['challenger_version']}@{state.started_at:.0f}"


def evidence_for(
    body: dict, state: CanaryState, exposures_dir, storage_dir: Path | None = None, problems: list[str] | None = None
) -> tuple[ArmStats | None, ArmStats | None]:
    try:
        frame, scan = read_exposure_scan(exposures_dir, since=state.step_started_at)
        frame = frame.filter(pl.col("ts") >= state.step_started_at)
        if scan.skipped and problems is not None:
            problems.append(f"exposure log: {scan.skipped} lines were not whole records, e.g. {scan.examples[0]}")
        labels = realized_labels(frame["flight_key"], storage_dir)
    except Exception:  # noqa: BLE001 - a provider failure is "no data": the controller holds
        return None, None
    since = state.step_started_at
    return (
        arm_stats(frame, body["challenger_version"], since=since, labels=labels),
        arm_stats(frame, body["champion_version"], since=since, labels=labels),
    )


def sla_p99_target(policies: dict, model: str) -> float:
    """The p99 target of ``model``'s SLA tier, read as the gateways read it (committed policies over defaults)."""
    try:
        policy, _, _ = effective_policy(GatewayPolicy(), policies, None, set(), 0)
    except Exception:  # noqa: BLE001 - an invalid store state: the gateways keep their defaults, so do we
        policy = GatewayPolicy()
    return policy.tier_of(model).p99_ms


def tick(
    policies, registry, exposures_dir, now: float, storage_dir: Path | None = None, problems: list[str] | None = None
) -> list[dict]:
    """One pass over the canary policies; returns what was committed (for run requests and logs). A canary whose
    policy is malformed, or whose step fails, is reported in ``problems`` and skipped: the others proceed."""
    acted = []
    current = policies.state()
    for name, policy in sorted(current.items()):
        if policy.type != "canary":
            continue
        try:
            done = _tick_one(
                policies, registry, current, name, dict(policy.body), exposures_dir, now, storage_dir, problems
            )
        except Exception as exc:  # noqa: BLE001 - one bad canary must not stop every other rollout
            if problems is not None:
                problems.append(f"canary '{name}' skipped: {type(exc).__name__}: {exc}")
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
        challenger, champion = evidence_for(body, state, exposures_dir, storage_dir, problems)
        d = decide(plan, state, challenger, champion, now)
        if d.action in ("hold", "none"):
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
                split_for(body, percent if state.status != PROMOTED else 100.0, canary_salt(name, body, state)),
            ),
        },
        author=AUTHOR,
        reason=json.dumps(
            {"action": action, "percent": percent, "reasons": list(reasons), "evidence": evidence}, default=str
        ),
    )
    return {"name": name, "action": action, "percent": percent, "version": commit.version}


@dg.sensor(
    name="canary_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    target=dg.AssetSelection.assets(MODEL_DEPLOYMENT),
    description="Drives canary rollouts one decision per tick: advance, hold, promote, roll back or pause — each "
    "decision a policy commit with its evidence, and a model_deployment run.",
)
def canary_sensor(
    context: dg.SensorEvaluationContext,
    policies: PolicyStoreResource,
    registry: ModelRegistryResource,
    keel_home: KeelHomeResource,
):
    problems: list[str] = []
    with policies.open() as store, registry.open() as reg:
        home = keel_home.layout()
        acted = tick(store, reg, home.serving.exposures, time.time(), storage_dir=home.storage, problems=problems)
    for p in problems:
        context.log.error(p)
    requests = [
        dg.RunRequest(
            run_key=f"canary:{a['name']}:{a['version']}",
            asset_selection=[MODEL_DEPLOYMENT],
            tags={
                "keel/canary": a["name"],
                "keel/canary_action": a["action"],
                "keel/policy_version": str(a["version"]),
                "keel/canary_percent": str(a["percent"]),
            },
        )
        for a in acted
    ]
    return dg.SensorResult(
        run_requests=requests,
        asset_events=automation_problems(MODEL_DEPLOYMENT, "canary_sensor", problems),
        skip_reason=None if requests else dg.SkipReason(
            "no canary decision this tick (none running, or holding)" + (f"; {len(problems)} skipped" if problems else "")
        ),
    )  # fmt: skip
