"""The single Definitions object of this keel deployment: assets, checks, jobs, resources, sensors, schedules.

``dagster dev`` at the repository root loads this file through workspace.yaml.
"""

from __future__ import annotations

import dagster as dg

from assets.deployment import deployment_assets, rollback_job
from assets.drift import drift_assets
from assets.experiments import experiment_assets
from assets.features import feature_assets
from assets.models import model_assets
from assets.raw import raw_assets
from assets.streaming import streaming_assets
from assets.validated import build_validated_assets
from resources import keel_resources
from sensors.canary import canary_sensor
from sensors.drift import drift_sensor
from sensors.guardrails import guardrail_sensor

validated_assets = build_validated_assets()

# Materializes the whole graph for one month; the set-up script backfills all twelve.
pipeline_job = dg.define_asset_job(
    "keel_pipeline",
    selection=dg.AssetSelection.all() - dg.AssetSelection.tag("keel/backfill", "skip"),
    description="Raw → validated + quarantine → features → drift report → model → deployment, one month of NYC "
    "2013 flights at a time.",
)

defs = dg.Definitions(
    assets=[
        *raw_assets,
        *validated_assets,
        *feature_assets,
        *drift_assets,
        *model_assets,
        *deployment_assets,
        *experiment_assets,
        *streaming_assets,
    ],
    jobs=[pipeline_job, rollback_job],
    sensors=[drift_sensor, canary_sensor, guardrail_sensor],
    resources=keel_resources(dg.EnvVar("KEEL_HOME")),  # scripts/env.sh sets it (default: .keel in the repository)
)
