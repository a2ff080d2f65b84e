"""Validated flights and weather: the contracts in assets/contracts/ applied to each monthly partition."""

from __future__ import annotations

from pathlib import Path

from assets.partitions import monthly_2013
from assets.raw import RAW_FLIGHTS, RAW_WEATHER
from keel.factories.contracts import contract_assets

CONTRACTS_DIR = Path(__file__).resolve().parent / "contracts"
FLIGHTS_CONTRACT = CONTRACTS_DIR / "flights.yaml"
WEATHER_CONTRACT = CONTRACTS_DIR / "weather.yaml"


def build_validated_assets(contracts_dir: Path = CONTRACTS_DIR) -> list:
    return [
        contract_assets(contracts_dir / "flights.yaml", raw_key=RAW_FLIGHTS, partitions_def=monthly_2013),
        contract_assets(contracts_dir / "weather.yaml", raw_key=RAW_WEATHER, partitions_def=monthly_2013),
    ]
