"""A use case's validated tables: each partitioned source with a contract of its name in the use case's contracts
folder (usecases/<name>/contracts/<source>.yaml) applied to each monthly partition — valid rows, the quarantine and
one check per rule (keel/factories/contracts.py)."""

from __future__ import annotations

from functools import cache

from assets.usecase import wiring
from keel.factories.contracts import contract_assets
from keel.usecase import UseCase


@cache
def build_validated_assets(uc: UseCase) -> list:
    """One contract multi-asset per validated table, under the use case's prefix and in its contracts group."""
    w = wiring(uc)
    return [
        contract_assets(
            uc.contract_path(src.name), raw_key=w.key(f"raw_{src.name}"), partitions_def=w.monthly,
            key_prefix=w.prefix, group_name=w.group("contracts"),
        )
        for src in uc.sources
        if src.partitioned and uc.contract_path(src.name).is_file()
    ]  # fmt: skip
