"""The flights use case's generated assets and keys, by name, for the tests that drive them one at a time.

assets/ generates every use case's pipeline from its declaration and names none; a test of the flights pipeline
takes its parts from here — the same factories definitions.py calls, so the same keys, checks and code versions.
"""

from __future__ import annotations

from assets.deployment import build_deployment_assets
from assets.drift import build_drift_assets
from assets.loop import build_loop_assets
from assets.models import model_assets_of, trained_contracts, training_config
from assets.usecase import wiring
from usecases.flights import usecase as FLIGHTS  # noqa: F401 - re-exported for the tests

W = wiring(FLIGHTS)
monthly = W.monthly  # 2013-01 … 2013-12
FEATURE_TABLE = W.key(FLIGHTS.feature_table)  # flights/flight_features

model_assets = model_assets_of(FLIGHTS)
DELAY_MODEL, MODEL_EVALUATION, MODEL_PROMOTION = (a.key for a in model_assets)
CONFIG = training_config(FLIGHTS)
CONTRACTS = trained_contracts(FLIGHTS)  # the contracts its training data passed

[model_deployment] = build_deployment_assets(FLIGHTS)
MODEL_DEPLOYMENT = model_deployment.key

drift_reference, drift_report = build_drift_assets(FLIGHTS)
DRIFT_REFERENCE, DRIFT_REPORT = drift_reference.key, drift_report.key
REFERENCE_MONTHS = list(FLIGHTS.monitoring.reference_months)
MONITORED_NUMERIC, MONITORED_CATEGORICAL = FLIGHTS.monitored

challenger_model, challenger_evaluation, loop_report = build_loop_assets(FLIGHTS)
