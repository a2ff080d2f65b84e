"""The single Definitions object of this keel deployment: assets, checks, jobs, resources, sensors, schedules.

``dagster dev`` at the repository root loads this file through workspace.yaml. Every installed use case (the
``keel.usecases`` entry points) contributes its pipeline — assets, jobs, sensors, schedule — generated from its
declaration (``usecase_definitions``); the platform's own parts (metering, incidents, drills, watchdog, the
rollback job) are single.
"""

from __future__ import annotations

import os

import dagster as dg

from assets.deployment import rollback_job
from assets.groups import with_group_metadata
from assets.incidents import incidents, incidents_job
from assets.jobs import UseCaseJobs, build_jobs
from assets.metering import metering_assets, metering_job
from assets.pipeline import usecase_assets
from assets.serving_health import serving_health
from keel.faults import announce_faults
from keel.usecase import UseCase, installed
from resources import keel_resources
from sensors.drills import chaos_drill_job, weekly_chaos_drill
from sensors.metering import metering_sensor
from sensors.usecase import usecase_schedules, usecase_sensors
from sensors.watchdog import watchdog_sensor


def usecase_definitions(uc: UseCase) -> tuple[UseCaseJobs, dg.Definitions]:
    """One use case's assets, jobs, sensors and schedules, generated from its declaration; and its jobs by stage."""
    assets = usecase_assets(uc)
    jobs = build_jobs(uc, assets)
    return jobs, dg.Definitions(
        assets=with_group_metadata(assets, uc),  # each group's owner and documentation (assets/groups.py)
        jobs=jobs.all,
        sensors=usecase_sensors(uc, jobs),
        schedules=usecase_schedules(uc, jobs),
    )


def platform_definitions() -> dg.Definitions:
    """The parts of the platform that are single, whatever the use cases, and the resources they all share."""
    return dg.Definitions(
        assets=with_group_metadata([*metering_assets, serving_health, incidents]),
        jobs=[rollback_job, incidents_job, chaos_drill_job, metering_job],
        sensors=[watchdog_sensor, metering_sensor],
        schedules=[weekly_chaos_drill],  # the weekly drill (sensors/drills.py); each use case has its nightly drift
        resources=keel_resources(dg.EnvVar("KEEL_HOME")),  # scripts/env.sh sets it (default: .keel in the repository)
    )


# The failing controls' switches (keel/faults.py) are refused outside a test home, and announced by every process that
# loads this module (the webserver, the daemon and each run) and recorded as an incident.
announce_faults(f"keel's code location (definitions.py, pid {os.getpid()})")

_generated = {name: usecase_definitions(uc) for name, uc in installed().items()}
# Each installed use case's jobs by stage, for scripts/materialize.py (the set-up's build order) and the tests.
JOBS: dict[str, UseCaseJobs] = {name: jobs for name, (jobs, _) in _generated.items()}

# The one Definitions object at module scope (Dagster, and keel's lineage CLI, load the module's only one).
defs = dg.Definitions.merge(platform_definitions(), *(d for _, d in _generated.values()))
