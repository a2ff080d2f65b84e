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
from gpu_runtime.gateway.policy import GatewayPolicy, effective_policy
from keel.canary import FINISHED, PROMOTED, ArmStats, CanaryPlan, CanaryState, decide
from keel.exposures import arm_stats, read_exposure_frame, realized_labels
from resources.parquet_io import keel_home
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource

AUTHOR = "canary-controller"


def split_for(body: dict, percent: float) -> dict:
    share = round(percent / 100.0, 12)
    return {
        "model": body["model"],
        "variants": [
            {"name": "champion", "version": body["champion_version"], "weight": round(1.0 - share, 12)},
            {"name": "challenger", "version": body["challenger_version"], "weight": share},
        ],
    }


def evidence_for(
    body: dict, state: CanaryState, exposures_dir, storage_dir: Path | None = None
) -> tuple[ArmStats | None, ArmStats | None]:
    try:
        frame = read_exposure_frame(exposures_dir, since=state.step_started_at).filter(
            pl.col("ts") >= state.step_started_at
        )
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


def tick(policies, registry, exposures_dir, now: float, storage_dir: Path | None = None) -> list[dict]:
    """One pass over the canary policies; returns what was committed (for run requests and logs)."""
    acted = []
    current = policies.state()
    for name, policy in current.items():
        if policy.type != "canary":
            continue
        body = dict(policy.body)
        raw = body.get("state")
        if raw is None:  # not started: the first step's split, now
            state = CanaryState(started_at=now, step_started_at=now)
            plan = CanaryPlan.from_policy(body)
            action, percent, reasons, evidence = "start", plan.steps[0], ("rollout started",), {}
        else:
            state = CanaryState(**raw)
            if state.status in FINISHED:
                continue
            plan = CanaryPlan.from_policy(body, p99_target_ms=sla_p99_target(current, body["model"]))
            challenger, champion = evidence_for(body, state, exposures_dir, storage_dir)
            d = decide(plan, state, challenger, champion, now)
            if d.action in ("hold", "none"):
                continue
            action, percent, reasons, evidence, state = d.action, d.percent, d.reasons, d.evidence, d.state
        if action == "promote":
            sha = registry.sha_of_version(body["model"], body["challenger_version"])
            registry.promote(body["model"], sha, f"canary {name} promoted")
        commit = policies.apply(
            {
                name: ("canary", body | {"state": state.__dict__}),
                f"{name}.split": ("ab_test", split_for(body, percent if state.status != PROMOTED else 100.0)),
            },
            author=AUTHOR,
            reason=json.dumps(
                {"action": action, "percent": percent, "reasons": list(reasons), "evidence": evidence}, default=str
            ),
        )
        acted.append({"name": name, "action": action, "percent": percent, "version": commit.version})
    return acted


@dg.sensor(
    name="canary_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    target=dg.AssetSelection.assets(MODEL_DEPLOYMENT),
    description="Drives canary rollouts one decision per tick: advance, hold, promote, roll back or pause — each "
    "decision a policy commit with its evidence, and a model_deployment run.",
)
def canary_sensor(
    context: dg.SensorEvaluationContext, policies: PolicyStoreResource, registry: ModelRegistryResource
):
    store, reg = policies.open(), registry.open()
    try:
        home = keel_home()
        acted = tick(store, reg, home / "serving" / "exposures", time.time(), storage_dir=home / "storage")
    finally:
        store.close()
        reg.close()
    if not acted:
        return dg.SkipReason("no canary decision this tick (none running, or holding)")
    return [
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
