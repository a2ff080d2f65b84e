"""A use case's sensors and schedule, generated from its declaration over the jobs of assets/jobs.py: its drift
sensor (freezes, challengers), canary sensor (its model's rollouts), guardrail sensor (its model's experiments),
landing sensor (when its sources land day by day
in a live replay) and nightly drift schedule (when its data is partitioned by month). Each is named after the use
case (``flights_drift_sensor``), so several use cases' automation sits side by side in one code location."""

from __future__ import annotations

import dagster as dg

from assets.jobs import UseCaseJobs
from keel.usecase import UseCase
from sensors.canary import build_canary_sensor
from sensors.drift import build_drift_sensor
from sensors.guardrails import build_guardrail_sensor
from sensors.landing import build_landing_sensor
from sensors.schedules import build_nightly_drift


def usecase_sensors(uc: UseCase, jobs: UseCaseJobs) -> list[dg.SensorDefinition]:
    sensors = [build_drift_sensor(uc, jobs), build_canary_sensor(uc, jobs), build_guardrail_sensor(uc)]
    if uc.period is not None and uc.landed:
        sensors.append(build_landing_sensor(uc, jobs))
    return sensors


def usecase_schedules(uc: UseCase, jobs: UseCaseJobs) -> list[dg.ScheduleDefinition]:
    return [build_nightly_drift(uc, jobs)] if uc.period is not None else []
