"""Check specs whose results belong to partitions."""

from __future__ import annotations

import warnings

import dagster as dg


def partitioned_check(
    name: str, *, asset: dg.AssetKey, partitions_def: dg.PartitionsDefinition | None, **kwargs
) -> dg.AssetCheckSpec:
    """An ``AssetCheckSpec`` carrying its asset's partitions: each result is recorded for the partition the run
    evaluated, so the asset's partitions view shows which months fail which checks (without it, a partitioned run
    records a skipped planned execution for the partition plus an unpartitioned result). ``partitions_def`` on a
    check spec is a preview feature of Dagster 1.13; keel relies on it knowingly, so its PreviewWarning is not
    repeated on every import."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, asset=asset, partitions_def=partitions_def, **kwargs)
