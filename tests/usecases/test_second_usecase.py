"""A second use case, declared here and nowhere else: room prices per hotel (a regression label) on synthetic
bookings this test writes. keel generates its pipeline from the declaration (assets/pipeline.py) — raw tables,
contract, feature table, online store, model behind the quality gate, promotion — and real Dagster materializes it
beside the flights use case, under its own key prefix, with no line of keel/ or gpu_runtime/ that knows it.
"""

from __future__ import annotations

from datetime import date, timedelta

import dagster as dg
import numpy as np
import polars as pl
import pytest

from assets.pipeline import usecase_assets
from keel.features.online import get_online_features
from keel.features.spec import Entity, Feature, FeatureSet, History, Key, Label, Lookup, RequestFeatures
from keel.features.sqlite_store import SQLiteOnlineStore
from keel.registry import ModelRegistry
from keel.usecase import ModelSpec, Serving, Source, UseCase, installed
from resources import keel_resources

MONTHS = ("2020-01", "2020-02", "2020-03", "2020-04")
BASE = {"h1": 80.0, "h2": 150.0, "h3": 260.0}
CITY = {"oslo": 1.4, "rome": 1.0}

BOOKINGS_CONTRACT = """\
contract: bookings
version: 1
owner: revenue
description: One booking per row; arrival is local.
critical_budget:
  max_fraction: 0.02
schema:
  on_violation: {severity: critical, action: quarantine}
  unexpected_columns: drop
  columns:
    ref:    {type: int64, nullable: false}
    hotel:  {type: string, nullable: false}
    city:   {type: string, nullable: false}
    year:   {type: int32, nullable: false}
    month:  {type: int32, nullable: false}
    day:    {type: int32, nullable: false}
    nights: {type: int32, nullable: false}
    price:  {type: float64, nullable: false}
rules:
  - id: price_positive
    type: range
    column: price
    min: 0
    max: 5000
"""

REQUEST_CONTRACT = """\
contract: price_request
version: 1
owner: revenue
description: A stay to price.
schema:
  on_violation: {severity: critical, action: reject}
  unexpected_columns: drop
  columns:
    hotel:  {type: string, nullable: false}
    city:   {type: string, nullable: false}
    year:   {type: int32, nullable: false}
    month:  {type: int32, nullable: false}
    day:    {type: int32, nullable: false}
    nights: {type: int32, nullable: false}
"""


def write_bookings(folder) -> pl.DataFrame:
    """Four months of bookings, ~20 a day: the price is the hotel's base × the city's index × a weekend premium,
    plus noise; three rows break the contract (a negative price)."""
    rng = np.random.default_rng(2020)
    rows = []
    day, ref = date(2020, 1, 1), 0
    while day <= date(2020, 4, 30):
        for _ in range(20):
            hotel, city = str(rng.choice(list(BASE))), str(rng.choice(list(CITY)))
            nights = int(rng.integers(1, 8))
            price = BASE[hotel] * CITY[city] * (1.3 if day.isoweekday() >= 6 else 1.0) + rng.normal(0, 8)
            rows.append((ref, hotel, city, day.year, day.month, day.day, nights, round(price, 2)))
            ref += 1
        day += timedelta(days=1)
    frame = pl.DataFrame(
        rows, schema=["ref", "hotel", "city", "year", "month", "day", "nights", "price"], orient="row"
    )
    frame = frame.with_columns(
        pl.when(pl.col("ref").is_in([5, 700, 1500])).then(-1.0).otherwise(pl.col("price")).alias("price")
    )
    frame.write_csv(folder / "bookings.csv")
    pl.DataFrame({"name": list(CITY), "index": list(CITY.values())}).write_csv(folder / "cities.csv")
    return frame


def read_text(path):
    def read() -> pl.DataFrame:
        df = pl.read_csv(path, infer_schema=False)
        return df.with_row_index("_source_row").with_columns(pl.col("_source_row").cast(pl.Int64))

    return read


def stay(col, ops):
    return {"nights": ops.as_float(col("nights")), "weekday": ops.as_int(ops.weekday(col("arrival")))}


def rooms(folder) -> UseCase:
    contracts = folder / "contracts"
    contracts.mkdir()
    (contracts / "bookings.yaml").write_text(BOOKINGS_CONTRACT)
    (contracts / "price_request.yaml").write_text(REQUEST_CONTRACT)
    features = FeatureSet(
        entity=Entity(
            name="booking",
            source="validated_bookings",
            id_column="booking_id",
            id_parts=("ref",),
            date="arrival",
            date_parts=("year", "month", "day"),
            request_columns=("hotel", "city", "arrival", "nights"),
            carried=("hotel", "city", "arrival"),
        ),
        features=(
            Feature("nights", "float", 0, 60, 2, "nights booked"),
            Feature("weekday", "int", 1, 7, 4, "ISO weekday of arrival"),
            Feature("city_index", "float", 0, 10, 1, "the city's price index"),
            Feature("hotel_price", "float", 0, 5000, 150, "the hotel's mean price, earlier days"),
        ),
        label=Label("label_price", pl.col("price"), task="regression", known_after="check-out"),
        request=(RequestFeatures("stay", stay),),
        lookups=(
            Lookup(
                "city",
                source="raw_cities",
                keys=(Key("city", "name"),),
                fields={"city_index": pl.col("index").cast(pl.Float64)},
            ),
        ),
        histories=(History("hotel_price", ("hotel",), pl.col("price"), prior=150.0, weight=5.0),),
    )
    return UseCase(
        name="rooms",
        title="Room prices (a test's use case)",
        contracts=contracts,
        features=features,
        model=ModelSpec(
            "room-price",
            asset="price_model",
            train_months=("2020-01", "2020-02"),
            valid_month="2020-03",
            params={"objective": "regression", "min_data_in_leaf": 20},
        ),
        serving=Serving("price_request", pool_budget_bytes=8 << 20),
        sources=(
            Source("bookings", read_text(folder / "bookings.csv"), description="Bookings, as text."),
            Source("cities", read_text(folder / "cities.csv"), partitioned=False),
        ),
        period=(date(2020, 1, 1), date(2020, 4, 30)),
        segments=("hotel",),
        feature_table="room_features",
    )


@pytest.fixture
def built(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    bookings = write_bookings(data)
    uc = rooms(data)
    graph = [a for a in usecase_assets(uc) if all(k.path[-1] != "model_deployment" for k in a.keys)]
    resources = keel_resources(tmp_path / "home")
    instance = dg.DagsterInstance.ephemeral()
    by_name = {k.path[-1]: k for a in graph for k in a.keys}

    def run(names, partition=None):
        result = dg.materialize(
            graph,
            selection=[by_name[n] for n in names],
            partition_key=partition,
            resources=resources,
            instance=instance,
        )
        assert result.success
        return result

    run(["raw_cities"])
    for month in MONTHS[:3]:
        run(["raw_bookings", "validated_bookings", "bookings_quarantine", "room_features", "online_features"], month)
    return uc, bookings, run, by_name, tmp_path / "home"


def test_its_pipeline_is_generated_under_its_own_prefix_and_groups(built):
    uc, _, _, by_name, _ = built
    assert "rooms" not in installed()  # declared in this test only: keel knows it through the declaration alone
    assert {k.path[0] for k in by_name.values()} == {"rooms"}
    assert {
        "raw_bookings", "raw_cities", "validated_bookings", "bookings_quarantine", "room_features",
        "online_features", "price_model", "model_evaluation", "model_promotion",
    } <= set(by_name)  # fmt: skip
    groups = {a.group_names_by_key[k] for a in usecase_assets(uc) for k in a.keys}
    assert groups == {"rooms_raw", "rooms_contracts", "rooms_features", "rooms_models", "rooms_deployments"}


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
    # history from earlier days only: the first day of January has the prior for every hotel
    jan = pl.read_parquet(storage / "room_features" / "2020-01.parquet")
    assert jan.filter(pl.col("arrival") == date(2020, 1, 1))["hotel_price"].unique().to_list() == [150.0]
    # the online store, as of March's end, answers a stay with the values the offline path computed
    with SQLiteOnlineStore(home / "online" / "rooms.sqlite", features=uc.features) as store:
        [served] = get_online_features(
            store, [{"hotel": "h3", "city": "oslo", "arrival": date(2020, 4, 4), "nights": 2}]
        )
    assert served["city_index"] == 1.4 and served["weekday"] == 6 and served["nights"] == 2.0
    # h3's mean price over every valid booking up to March's end, smoothed towards the prior
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
    assert set(meta["metrics"]) == {"holdout_month", "rmse", "mae"} and meta["metrics"]["holdout_month"] == "2020-03"
    # it learned the prices: far better than the mean price of March as the answer for every booking
    march = bookings.filter((pl.col("month") == 3) & (pl.col("price") > 0))["price"]
    assert meta["metrics"]["rmse"] < 0.25 * float(march.std())
    assert set(meta["data_versions"]["rooms/room_features"]) == {"2020-01", "2020-02", "2020-03"}
    assert set(meta["contracts"]) == {"bookings"}  # the contract its training data passed
    assert registry.alias("flight-delay", "champion") is None  # the other use case's model is untouched
