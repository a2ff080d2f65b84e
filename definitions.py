"""The single Definitions object of this keel deployment: assets, checks, jobs, resources, sensors, schedules.

``dagster dev`` at the repository root loads this file through workspace.yaml.
"""

from __future__ import annotations

import dagster as dg

from assets.deployment import rollback_job
from assets.experiments import experiment_assets
from assets.explanations import explanations
from assets.groups import with_group_metadata
from assets.incidents import incidents, incidents_job
from assets.jobs import build_jobs, challenger_job
from assets.metering import metering_assets, metering_job
from assets.pipeline import usecase_assets
from assets.streaming import streaming_assets
from keel.usecase import installed
from resources import keel_resources
from sensors.canary import canary_sensor
from sensors.drift import drift_sensor
from sensors.drills import chaos_drill_job, weekly_chaos_drill
from sensors.guardrails import guardrail_sensor
from sensors.landing import landing_sensor
from sensors.metering import metering_sensor
from sensors.schedules import nightly_drift
from sensors.watchdog import watchdog_sensor

defs = dg.Definitions(
    assets=with_group_metadata(  # each group's owner and documentation (assets/groups.py)
        [
            # every installed use case's pipeline, generated from its declaration (assets/pipeline.py)
            *(a for uc in installed().values() for a in usecase_assets(uc)),
            # the flights use case's experiments and explanations (still its own wiring)
            explanations,
            *experiment_assets,
            *metering_assets,
            *streaming_assets,
            incidents,
        ]
    ),
    # build_jobs: the set-up's stages, in order (assets/jobs.py)
    jobs=[*build_jobs, challenger_job, rollback_job, incidents_job, chaos_drill_job, metering_job],
    sensors=[drift_sensor, canary_sensor, guardrail_sensor, landing_sensor, watchdog_sensor, metering_sensor],
    schedules=[nightly_drift, weekly_chaos_drill],  # the production cadence (sensors/schedules.py, sensors/drills.py)
    resources=keel_resources(dg.EnvVar("KEEL_HOME")),  # scripts/env.sh sets it (default: .keel in the repository)
)
