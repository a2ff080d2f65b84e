"""Validated flights and weather: the contracts in usecases/flights/contracts/ applied to each monthly partition."""

from __future__ import annotations

import dagster as dg

from assets.partitions import monthly_2013
from assets.raw import RAW_FLIGHTS, RAW_WEATHER
from keel.contracts.catalog import contract_path
from keel.factories.contracts import contract_assets

VALIDATED_FLIGHTS = dg.AssetKey("validated_flights")  # what contract_assets names them: validated_<contract>
VALIDATED_WEATHER = dg.AssetKey("validated_weather")


def build_validated_assets() -> list:
    return [
        contract_assets(contract_path("flights"), raw_key=RAW_FLIGHTS, partitions_def=monthly_2013),
        contract_assets(contract_path("weather"), raw_key=RAW_WEATHER, partitions_def=monthly_2013),
    ]
