"""Every use case's core pipeline, generated from its declaration (keel/usecase.py): raw tables → validated tables
(contracts) → feature table and online store → model, evaluation behind the quality gate, promotion → deployment.

``usecase_assets(uc)`` is what definitions.py puts in the graph for each installed use case; a test builds the same
for a use case it declares itself. The parts that are still the flights use case's own (drift, loop, experiments,
explanations, streaming; assets/*.py) sit beside it in definitions.py.
"""

from __future__ import annotations

from functools import cache

import dagster as dg

from assets.deployment import build_deployment_assets
from assets.features import build_feature_assets
from assets.models import model_assets_of
from assets.raw import build_raw_assets
from assets.validated import build_validated_assets
from keel.usecase import UseCase


@cache
def usecase_assets(uc: UseCase) -> tuple[dg.AssetsDefinition, ...]:
    """The use case's assets, under its key prefix and in its own groups."""
    return (
        *build_raw_assets(uc),
        *build_validated_assets(uc),
        *build_feature_assets(uc),
        *model_assets_of(uc),
        *build_deployment_assets(uc),
    )
