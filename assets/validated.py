"""Validated flights and weather: the contracts in usecases/flights/contracts/ applied to each monthly partition."""

from __future__ import annotations

from assets.partitions import monthly_2013
from assets.raw import RAW_FLIGHTS, RAW_WEATHER
from assets.usecase import PREFIX, group, key
from keel.contracts.catalog import contract_path
from keel.factories.contracts import contract_assets

VALIDATED_FLIGHTS = key("validated_flights")  # what contract_assets names them: validated_<contract>
VALIDATED_WEATHER = key("validated_weather")


def build_validated_assets() -> list:
    """One contract multi-asset per validated table, under the use case's prefix and in its contracts group."""
    return [
        contract_assets(
            contract_path(table), raw_key=raw, partitions_def=monthly_2013, key_prefix=PREFIX,
            group_name=group("contracts"),
        )
        for table, raw in (("flights", RAW_FLIGHTS), ("weather", RAW_WEATHER))
    ]  # fmt: skip
