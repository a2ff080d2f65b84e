"""The canary sensor: each tick, ``keel.canary_control.tick`` drives every running canary policy one decision, and
each commit it makes becomes a run of ``model_deployment`` (run key = the policy version, so a duplicate tick or a
restarted daemon never acts twice). A canary that cannot be judged is reported on model_deployment's page."""

import time

import dagster as dg

from assets.deployment import MODEL_DEPLOYMENT
from keel.canary_control import tick
from resources.home import KeelHomeResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from sensors.problems import automation_problems


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
