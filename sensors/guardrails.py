"""The guardrail sensor: each tick, ``keel.experiments.guardrails.tick`` judges every running experiment's guardrails
on the exposure log (sequential test); a breach pauses or rolls the experiment back through the policy store, and
the sensor requests a run of the day's exposures and wide table (run key = the policy version: a replayed tick
cannot act twice). The always-valid p-values are carried in the sensor's cursor.

One sensor per use case, ``<use case>_guardrail_sensor`` (``build_guardrail_sensor``): the experiments on its model,
and runs of its experiment assets."""

from __future__ import annotations

import json
import time

import dagster as dg

from assets.usecase import wiring
from keel.alerts import Alert
from keel.experiments.guardrails import tick
from keel.usecase import UseCase, plays
from resources.home import KeelHomeResource
from resources.ledger import LedgerResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from sensors.alerting import send_alerts
from sensors.problems import automation_problems


def build_guardrail_sensor(uc: UseCase) -> dg.SensorDefinition:
    """``<use case>_guardrail_sensor``: the guardrails of the experiments on the use case's model."""
    w = wiring(uc)
    exposures, wide, analysis = (
        w.key(n) for n in ("experiment_exposures", "experiment_wide_table", "experiment_analysis")
    )
    name = f"{uc.name}_guardrail_sensor"

    @dg.sensor(
        name=name,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING if plays(uc.name) else dg.DefaultSensorStatus.STOPPED,
        target=dg.AssetSelection.assets(exposures, wide),
        description=f"Evaluates the guardrails of every running experiment on {uc.model.name} on the exposure log each "
        "tick (sequential test); a breach pauses or rolls back the experiment through the policy store, with its "
        "evidence.",
    )
    def _sensor(
        context: dg.SensorEvaluationContext,
        policies: PolicyStoreResource,
        registry: ModelRegistryResource,
        ledger: LedgerResource,
        keel_home: KeelHomeResource,
    ):
        return guardrail_tick(context, uc, name, (exposures, wide, analysis), policies, registry, ledger, keel_home)

    return _sensor


def guardrail_tick(context, uc: UseCase, name: str, keys, policies, registry, ledger, keel_home):
    exposures, wide, analysis = keys
    cursor = json.loads(context.cursor) if context.cursor else {}
    problems: list[str] = []
    with policies.open() as store, registry.open() as reg, ledger.open() as led:
        acted, cursor = tick(
            store, keel_home.layout().root, registry=reg, ledger=led, cursor=cursor, problems=problems,
            models=frozenset({uc.model.name}),
        )  # fmt: skip
    send_alerts(
        keel_home.layout(),
        [
            Alert(f"guardrail_{a['action']}", "warning", f"experiment {a['experiment']}: guardrail breached, "
                  f"{a['action']}", {"policy_version": a["version"], "breached": a.get("breached")},
                  source=name)
            for a in acted
        ],
        problems,
    )  # fmt: skip
    for p in problems:
        context.log.error(p)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    requests = [
        dg.RunRequest(
            run_key=f"guardrail:{a['experiment']}:{a['version']}",
            partition_key=today,
            asset_selection=[exposures, wide],
            tags={
                "keel/experiment": a["experiment"],
                "keel/guardrail_action": a["action"],
                "keel/policy_version": str(a["version"]),
            },
        )
        for a in acted
    ]
    return dg.SensorResult(
        run_requests=requests,
        cursor=json.dumps(cursor),
        asset_events=automation_problems(analysis, name, problems),
        skip_reason=None if requests else dg.SkipReason("no guardrail breached (or no running experiment)"),
    )
