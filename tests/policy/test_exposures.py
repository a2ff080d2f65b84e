"""Canary evidence from the exposure log: arms by routed version, errors hidden by the fallback, p99, log-loss."""

from __future__ import annotations

import math
import statistics

import polars as pl
import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from keel.exposures import arm_stats, exposure_frame, outcome_labels
from tests import CONTRACTS
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from usecases.flights.features import FLIGHT, FLIGHT_FEATURES


def line(ts, routed, answered, status=200, latency=5.0, score=0.3, key=None):
    return {
        "ts": ts,
        "routed_version": routed,
        "model_version": answered,
        "status": status,
        "latency_ms": latency,
        "score": score,
        "entity_key": key,
        "request_id": f"r{ts}",
    }


def test_arms_count_what_was_routed_and_fallbacks_are_challenger_errors():
    rows = [line(t, 1, 1, latency=float(t)) for t in range(100)]  # champion: 100 good answers
    rows += [line(100 + t, 2, 2) for t in range(18)]  # challenger answered 18 …
    rows += [line(200, 2, 1), line(201, 2, 1)]  # … the fallback answered 2 for it (users saw 200s)
    rows += [{"ts": 300, "routed_version": 2, "status": 502, "error": "backend_error", "latency_ms": 3}]
    rows += [{"ts": 5, "status": 422, "error": "invalid_input"}]  # never routed: in no arm
    frame = exposure_frame(rows)
    champ, chal = arm_stats(frame, 1, since=0), arm_stats(frame, 2, since=0)
    assert (champ.requests, champ.errors) == (100, 0) and champ.p99_ms == 98.0
    assert (chal.requests, chal.errors) == (21, 3)
    assert arm_stats(frame, 2, since=150).requests == 3  # the window


def test_log_loss_on_realized_labels():
    rows = [line(1, 2, 2, score=0.9, key="a"), line(2, 2, 2, score=0.2, key="b"), line(3, 2, 2, score=0.5, key="c")]
    stats = arm_stats(exposure_frame(rows), 2, since=0, labels={"a": 1, "b": 0})  # c's outcome is not in yet
    assert stats.labelled == 2
    losses = [-math.log(0.9), -math.log(0.8)]
    assert stats.log_loss == pytest.approx(sum(losses) / 2)
    assert stats.log_loss_var == pytest.approx(statistics.variance(losses))
    assert arm_stats(exposure_frame(rows), 2, since=0).log_loss is None


def test_the_gateways_flight_key_meets_the_outcomes(validated):  # noqa: F811
    flights = validated["flights"]
    labels = outcome_labels(FLIGHT_FEATURES, flights)
    request = CompiledContract(load_contract(CONTRACTS / "predict_request.yaml"))
    row = flights.filter(pl.col("arr_delay").is_not_null()).row(123, named=True)
    sent = {
        k: row[k]
        for k in ("carrier", "flight", "origin", "dest", "tailnum", "year", "month", "day", "hour", "distance")
    }
    sent["time_hour"] = row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ")  # as a client sends it
    verdict = request.validate_record(sent)
    assert verdict.sink == "valid"
    key = FLIGHT.key.of(verdict.record)
    assert labels[key] == int(row["arr_delay"] > 15)
    assert len(labels) > 0.95 * flights.filter(pl.col("arr_delay").is_not_null()).height  # keys are near-unique
