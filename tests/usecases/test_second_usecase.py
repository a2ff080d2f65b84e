"""A second use case, declared by the tests and installed nowhere (tests/usecases/rooms): room prices per hotel, a
regression label, on synthetic bookings the test writes. keel generates its pipeline from the declaration
(assets/pipeline.py) — raw tables, contract, feature table, online store, model behind the quality gate, promotion,
deployment — real Dagster materializes it, and one runtime (real Triton, real gateway) serves it beside flights, with
no line of keel/ or gpu_runtime/ that knows it.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import dagster as dg
import lightgbm as lgb
import numpy as np
import polars as pl
import pytest

import tests.usecases.rooms as rooms
from assets.metering import build_metering_assets
from assets.pipeline import usecase_assets
from keel.features.online import get_online_features
from keel.features.sqlite_store import SQLiteOnlineStore
from keel.ledger import Ledger
from keel.registry import ModelRegistry
from keel.usecase import first_day, installed
from resources import TritonResource, keel_resources
from tests.usecases.rooms_pipeline import MONTHS, build


@pytest.fixture
def built(tmp_path):
    bookings, run, by_name = build(tmp_path / "home", tmp_path / "data")
    return rooms.usecase, bookings, run, by_name, tmp_path / "home"


def test_its_pipeline_is_generated_under_its_own_prefix_and_groups(built):
    uc, _, _, by_name, _ = built
    assert "rooms" not in installed()  # declared in this test only: keel knows it through the declaration alone
    assert uc is rooms.usecase and {k.path[0] for k in by_name.values()} == {"rooms"}
    assert {
        "raw_bookings", "raw_cities", "validated_bookings", "bookings_quarantine", "room_features",
        "online_features", "price_model", "model_evaluation", "model_promotion", "model_deployment",
    } <= set(by_name)  # fmt: skip
    assert {"drift_reference", "drift_report", "feature_freezes", "challenger_model", "loop_report"} <= set(by_name)
    # its explanations and its model's experiment lake; no impact predictor or causal asset: it declares none
    assert {"explanations", "experiment_exposures", "experiment_wide_table", "experiment_analysis"} <= set(by_name)
    assert "impact_predictor" not in by_name
    groups = {
        a.group_name if isinstance(a, dg.AssetSpec) else a.group_names_by_key[k]
        for a in usecase_assets(uc)
        for k in ([a.key] if isinstance(a, dg.AssetSpec) else a.keys)
    }
    assert groups == {
        "rooms_raw", "rooms_contracts", "rooms_features", "rooms_models", "rooms_deployments", "rooms_drift",
        "rooms_loop", "rooms_experiments",
    }  # fmt: skip


def test_every_booking_ends_in_one_sink_and_the_features_follow_the_declaration(built):
    uc, bookings, _, _, home = built
    storage = home / "storage" / "rooms"
    for month in MONTHS[:3]:
        y, m = (int(x) for x in month.split("-"))
        raw = bookings.filter((pl.col("year") == y) & (pl.col("month") == m))
        valid = pl.read_parquet(storage / "validated_bookings" / f"{month}.parquet")
        quarantined = pl.read_parquet(storage / "bookings_quarantine" / f"{month}.parquet")
        assert valid.height + quarantined.height == raw.height  # no row lost, none twice
        assert set(quarantined["price"].to_list()) <= {"-1.0"}  # only the broken rows are held back
        table = pl.read_parquet(storage / "room_features" / f"{month}.parquet")
        assert table.height == valid.height and table.columns == list(uc.features.table_columns)
    assert (
        sum(pl.read_parquet(storage / "bookings_quarantine" / f"{m}.parquet").height for m in MONTHS[:3]) == 3
    )  # the three negative prices
    # history from earlier days only: the first day of October has the prior for every hotel
    first = pl.read_parquet(storage / "room_features" / "2009-10.parquet")
    assert first.filter(pl.col("arrival") == date(2009, 10, 1))["hotel_price"].unique().to_list() == [150.0]
    # the online store, as of December's end, answers a stay with the values the offline path computed
    with SQLiteOnlineStore(home / "online" / "rooms.sqlite", features=uc.features) as store:
        [served] = get_online_features(
            store, [{"hotel": "h3", "city": "oslo", "arrival": date(2010, 1, 2), "nights": 2}]
        )
    assert served["city_index"] == 1.4 and served["weekday"] == 6 and served["nights"] == 2.0
    # h3's mean price over every valid booking up to December's end, smoothed towards the prior
    mar = pl.concat([pl.read_parquet(storage / "validated_bookings" / f"{m}.parquet") for m in MONTHS[:3]])
    h3 = mar.filter(pl.col("hotel") == "h3")["price"]
    assert served["hotel_price"] == pytest.approx((h3.sum() + 150.0 * 5.0) / (h3.len() + 5.0))


def test_it_trains_a_regression_model_judged_by_rmse_and_promotes_it(built):
    uc, bookings, run, _, home = built
    result = run(["price_model", "model_evaluation", "model_promotion"])
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    sha = mats["price_model"]["sha256"].value
    assert mats["model_promotion"]["champion"].value == sha
    [gate] = result.get_asset_check_evaluations()
    assert gate.passed and gate.asset_key == dg.AssetKey(["rooms", "model_evaluation"])
    registry = ModelRegistry(home / "registry")
    assert registry.alias("room-price", "champion") == sha
    meta = registry.get("room-price", sha).metadata
    assert set(meta["metrics"]) == {"holdout_month", "rmse", "mae"} and meta["metrics"]["holdout_month"] == "2009-12"
    # it learned the prices: far better than the mean price of December as the answer for every booking
    march = bookings.filter((pl.col("month") == 12) & (pl.col("price") > 0))["price"]
    assert meta["metrics"]["rmse"] < 0.25 * float(march.std())
    assert set(meta["data_versions"]["rooms/room_features"]) == {"2009-10", "2009-11", "2009-12"}
    assert set(meta["contracts"]) == {"bookings"}  # the contract its training data passed
    assert registry.alias("flight-delay", "champion") is None  # the other use case's model is untouched


def test_its_drift_is_judged_against_the_months_its_model_was_trained_on(built):
    """January 2010's prices double (the test rewrites them before January lands): the label drifts, the stays do not."""
    uc, bookings, run, by_name, home = built
    data = rooms.DATA / "bookings.csv"
    frame = pl.read_csv(data, infer_schema=False)
    april = (pl.col("month") == "1") & (pl.col("price") != "-1.0")
    frame.with_columns(
        pl.when(april)
        .then((pl.col("price").cast(pl.Float64) * 2).round(2).cast(pl.String))
        .otherwise(pl.col("price"))
    ).write_csv(data)
    run(["raw_bookings", "validated_bookings", "bookings_quarantine", "room_features"], "2010-01")
    run(["price_model", "model_evaluation", "model_promotion"])
    reference = run(["drift_reference"]).get_asset_materialization_events()[0].materialization.metadata
    assert reference["window"].value == "2009-10..2009-12"  # the first model's training and validation months
    report = run(["drift_report"], "2010-01")
    checks = {c.check_name: c.passed for c in report.get_asset_check_evaluations()}
    assert set(checks) == {f"drift_{c}" for c in (*uc.features.names, uc.features.label.column)}
    assert checks["drift_label_price"] is False and checks["drift_nights"] is True and checks["drift_weekday"] is True
    meta = report.get_asset_materialization_events()[0].materialization.metadata
    assert meta["memory_pool"].value.startswith("room-price on ")  # the arrays in its own model's pool
    assert "label_price" in meta["drifted_features"].value


def test_its_loop_gates_a_challenger_and_reports_the_month_on_squared_errors(built):
    """A challenger fitted on November, gated on December's last days; January's loop_report of what the ledger
    says served: RMSE and MAE, recomputed here from the champion's own predictions."""
    uc, bookings, run, by_name, home = built
    run(["raw_bookings", "validated_bookings", "bookings_quarantine", "room_features"], "2010-01")
    promoted = run(["price_model", "model_evaluation", "model_promotion"])
    sha = (
        {e.asset_key.path[-1]: e.materialization for e in promoted.get_asset_materialization_events()}["price_model"]
        .metadata["sha256"]
        .value
    )
    config = {"train_months": ["2009-11"], "gate_month": "2009-12", "gate_from_day": 22}
    result = dg.materialize(
        list(usecase_assets(uc)),
        selection=[by_name["challenger_model"], by_name["challenger_evaluation"]],
        resources=keel_resources(home, triton=TritonResource(home=str(home), drain_s=0.3)),
        run_config={
            "ops": {f"rooms__{n}": {"config": config} for n in ("challenger_model", "challenger_evaluation")}
        },
    )
    evaluation = {
        e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()
    }["challenger_evaluation"]
    assert evaluation["loss"].value == "squared_error" and evaluation["champion_version"].value == 1
    march_end = bookings.filter((pl.col("month") == 12) & (pl.col("day") >= 22) & (pl.col("price") > 0))
    assert evaluation["rows"].value == march_end.height  # judged on the days neither model saw
    with Ledger(home / "ledger.sqlite") as ledger:
        ledger.append(
            "rel-rooms",
            {"model": {"hash": "h", "parts": {"sha256": sha, "asset": "rooms/price_model"}}},
            datetime(2009, 12, 1, tzinfo=UTC),
        )
    report = run(["loop_report"], "2010-01").get_asset_materialization_events()[0].materialization.metadata
    april = pl.read_parquet(home / "storage" / "rooms" / "room_features" / "2010-01.parquet").sort("booking_id")
    x = april.select([pl.col(f).cast(pl.Float64) for f in uc.features.names]).to_numpy()
    error = (
        lgb.Booster(model_str=ModelRegistry(home / "registry").load(sha)).predict(x) - april["label_price"].to_numpy()
    )
    assert report["labelled_bookings"].value == april.height
    assert report["served_rmse"].value == pytest.approx(float(np.sqrt(np.mean(error**2))), abs=1e-4)
    assert report["served_mae"].value == pytest.approx(float(np.mean(np.abs(error))), abs=1e-4)
    assert report["static_rmse"].value == report["served_rmse"].value  # one release: the static model served
    assert "served_auc" not in report
    # metering partitions come from the use cases' periods (issue 46 item 4): a day of 2009 is metered, not refused
    days = dg.DailyPartitionsDefinition(start_date=first_day([uc]).isoformat(), end_offset=1)
    assert days.get_first_partition_key() == "2009-10-01"
    metered = dg.materialize(build_metering_assets(days), partition_key="2009-12-15",
                             resources=keel_resources(home, triton=TritonResource(home=str(home), drain_s=0.3)))  # fmt: skip
    assert metered.success
    usage = {e.asset_key.path[-1]: e.materialization.metadata for e in metered.get_asset_materialization_events()}
    assert usage["usage"]["day"].value == "2009-12-15" and usage["usage"]["requests"].value == 0  # nothing served
