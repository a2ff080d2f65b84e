"""Every use case's core pipeline, generated from its declaration (keel/usecase.py): raw tables → validated tables
(contracts) → feature table and online store → model, evaluation behind the quality gate, promotion → deployment,
the drift reference and monthly drift report of what the serving model was trained on, and what the online store
serves frozen; the loop: a challenger when drift asks for one, its gate against the champion, and the monthly
loop_report of what served against the static first model and a naive retrain; the monthly explanations; its
experiments (the lake of its model's exposures, the impact predictor, its causal questions) and its Flink mirrors.

``usecase_assets(uc)`` is what definitions.py puts in the graph for each installed use case, with the jobs
(assets/jobs.py), sensors and schedule (sensors/usecase.py) generated over them; a test builds the same for a use
case it declares itself.
"""

from __future__ import annotations

from functools import cache

import dagster as dg

from assets.deployment import build_deployment_assets
from assets.drift import build_drift_assets
from assets.experiments import build_experiment_assets
from assets.explanations import build_explanation_assets
from assets.features import build_feature_assets
from assets.freezes import build_freezes_spec
from assets.loop import build_loop_assets
from assets.models import model_assets_of
from assets.raw import build_raw_assets
from assets.streaming import build_streaming_assets
from assets.validated import build_validated_assets
from keel.usecase import UseCase


@cache
def usecase_assets(uc: UseCase) -> tuple[dg.AssetsDefinition | dg.AssetSpec, ...]:
    """The use case's assets, under its key prefix and in its own groups."""
    return (
        *build_raw_assets(uc),
        *build_validated_assets(uc),
        *build_feature_assets(uc),
        *model_assets_of(uc),
        *build_deployment_assets(uc),
        *build_drift_assets(uc),
        build_freezes_spec(uc),
        *build_loop_assets(uc),
        *build_explanation_assets(uc),
        *build_experiment_assets(uc),
        *build_streaming_assets(uc),
    )
