"""Drift: how far a window of data has moved from a reference window, per feature, with a verdict that can act.

``build_reference`` profiles the reference window once; ``compare`` measures any window against it. See
docs/drift.md for the statistics, their precision and the defined results for bad input.
"""

from keel.drift.profile import CategoricalReference, NumericReference, ReferenceProfile, build_reference
from keel.drift.report import DriftConfig, DriftReport, FeatureDrift, compare

__all__ = [
    "CategoricalReference",
    "DriftConfig",
    "DriftReport",
    "FeatureDrift",
    "NumericReference",
    "ReferenceProfile",
    "build_reference",
    "compare",
]
