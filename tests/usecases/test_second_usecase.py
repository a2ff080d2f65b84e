"""A second use case, declared by the tests and installed nowhere (tests/usecases/rooms): room prices per hotel, a
regression label, on synthetic bookings the test writes. keel generates its pipeline from the declaration
(assets/pipeline.py) — raw tables, contract, feature table, online store, model behind the quality gate, promotion,
deployment — real Dagster materializes it, and one runtime (real Triton, real gateway) serves it beside flights, with
no line of keel/ or gpu_runtime/ that knows it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import httpx
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
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from tests.serving.conftest import (  # noqa: F401 - shared fixtures
    MODEL,
    Runtime,
    request_body,
    runtime_home,
    serving_models,
    start_serve,
    stop_serve,
)

MONTHS = ("2009-10", "2009-11", "2009-12", "2010-01")  # before the platform's other calendars
ROOMS_POOL = 4096  # bytes: the gateway policy's budget for room-price's requests in flight (× 1.2 headroom)
BASE = {"h1": 80.0, "h2": 150.0, "h3": 260.0}
CITY = {"oslo": 1.4, "rome": 1.0}


def write_bookings(folder) -> pl.DataFrame:
    """Four months of bookings, ~20 a day: the price is the hotel's base × the city's index × a weekend premium,
    plus noise; three rows break the contract (a negative price)."""
    rng = np.random.default_rng(2020)
    rows = []
    day, ref = date(2009, 10, 1), 0
    while day <= date(2010, 1, 31):
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


def build(home, data, instance=None):
    """Write the bookings, point the declaration at them and materialize October…December 2009 of the rooms pipeline
    (all but its deployment) on ``home``; returns the bookings, a runner of more assets and the keys by name."""
    data.mkdir(exist_ok=True)
    bookings = write_bookings(data)
    rooms.DATA = data
    uc = rooms.usecase
    graph = list(usecase_assets(uc))
    resources = keel_resources(home, triton=TritonResource(home=str(home), drain_s=0.3))
    instance = instance or dg.DagsterInstance.ephemeral()
    by_name = {k.path[-1]: k for a in graph for k in ([a.key] if isinstance(a, dg.AssetSpec) else a.keys)}

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
    return bookings, run, by_name


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
    assert usage["usage"]["days"].value == "2009-12-15" and usage["usage"]["requests"].value == 0  # nothing served


# -- served beside flights: one runtime, two models ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(runtime_home, serving_models, tmp_path_factory):  # noqa: F811
    """The serving tests' home (flights models registered, its online store written), the rooms pipeline built on
    it through promotion, one runtime serving both use cases, flights' version 1 and rooms' champion deployed — the
    latter by its generated ``rooms/model_deployment`` asset."""
    home = runtime_home
    instance = dg.DagsterInstance.ephemeral()
    bookings, run, _ = build(home, tmp_path_factory.mktemp("rooms-data"), instance)
    run(["price_model", "model_evaluation", "model_promotion"])
    # rooms' pool is small on purpose (a 4 KiB budget: ~300 stays in flight), flights keeps its declared 64 MiB
    proc, endpoints = start_serve(
        home, {"pool_budgets": {"room-price": ROOMS_POOL}}, env={"KEEL_USECASES": "flights,tests.usecases.rooms"}
    )
    rt = Runtime(home, proc, endpoints, serving_models[0])
    try:
        rt.deployer().deploy(MODEL, [rt.target(1)])
        deployed = run(["model_deployment"])
        rt.wait_ready(timeout=60)
        yield rt, bookings, deployed
    finally:
        stop_serve(rt.proc)


def stays(n: int = 12) -> list[dict]:
    """Stays to price in January 2010 (after the store's snapshot of December's end), as a caller sends them."""
    rng = np.random.default_rng(4)
    return [
        {
            "hotel": str(rng.choice(list(BASE))),
            "city": str(rng.choice(list(CITY))),
            "year": 2010,
            "month": 1,
            "day": int(rng.integers(1, 28)),
            "nights": int(rng.integers(1, 8)),
        }
        for _ in range(n)
    ]


def in_process(home, entities: list[dict]) -> np.ndarray:
    """What the rooms champion says in this process for the same stays: the store's features (defaults where the
    store has none, as the gateway), float32 as Triton receives them."""
    fs = rooms.usecase.features
    rows = [
        {k: e[k] for k in ("hotel", "city", "nights")} | {"arrival": date(e["year"], e["month"], e["day"])}
        for e in entities
    ]
    with SQLiteOnlineStore(home / "online" / "rooms.sqlite", features=fs) as store:
        feats = get_online_features(store, rows)
    x = np.array([[np.nan if f[n] is None else f[n] for n in fs.names] for f in feats], dtype=np.float64)
    x = np.where(np.isnan(x), fs.defaults, x).astype(np.float32).astype(np.float64)
    registry = ModelRegistry(home / "registry")
    text = registry.load(registry.alias("room-price", "champion"))
    registry.close()
    return lgb.Booster(model_str=text).predict(x)


def test_one_runtime_serves_both_models_each_by_its_own_declaration(served, serving_models):  # noqa: F811
    rt, _, deployed = served
    [event] = deployed.get_asset_materialization_events()
    assert event.asset_key == dg.AssetKey(["rooms", "model_deployment"])
    ready = httpx.get(f"{rt.url}/readyz", timeout=10).json()
    assert ready["ready"] and set(ready["models"]) == {MODEL, "room-price"}
    assert all(m["ready"] for m in ready["models"].values())
    # rooms: a batch of stays, scored by its champion on its features, the same as in this process
    entities = stays()
    r = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": entities, "tenant_id": "tests"})
    assert r.status_code == 200, r.text
    answer = r.json()
    predictions = answer["predictions"]
    assert (answer["model"], answer["model_version"], len(predictions)) == ("room-price", 1, len(entities))
    assert [p["score"] for p in predictions] == pytest.approx(list(in_process(rt.home, entities)), rel=1e-5)
    assert all(50 < p["score"] < 500 for p in predictions)  # prices, not probabilities
    # flights, beside it on the same gateway: the same answer as its alias route
    _, feb = serving_models
    body = request_body(feb.row(7, named=True))
    alias = rt.post(body).json()
    generic = httpx.post(
        f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": [body.pop("flight")], **body}, timeout=10
    ).json()
    assert (generic["model"], generic["model_version"], generic["score"]) == (MODEL, 1, alias["score"])
    # the exposure log names each answer's model
    day = sorted((rt.home / "serving" / "exposures").glob("exposures-*.jsonl"))[-1]
    logged = {line.split('"model":')[1].split(",")[0].strip(' "') for line in day.read_text().splitlines()}
    assert {"room-price", MODEL} <= logged


def test_each_model_refuses_by_its_own_contract_and_an_unknown_model_lists_both(served, serving_models):  # noqa: F811
    rt, _, _ = served
    good = stays(1)[0]
    broken = httpx.post(
        f"{rt.url}/v1/models/room-price/predict", json={"entities": [good, good | {"nights": 0}]}, timeout=10
    )
    assert broken.status_code == 422, broken.text
    error = broken.json()["error"]
    assert "contract price_request" in error["message"] and [v["index"] for v in error["violations"]] == [1]
    # a flight is not a stay: the rooms contract refuses it, naming the missing fields
    _, feb = serving_models
    flight = request_body(feb.row(3, named=True))["flight"]
    assert httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": [flight]}).status_code == 422
    wrong = httpx.post(f"{rt.url}/v1/models/no-such-model/predict", json={"entities": [good]}, timeout=10)
    assert wrong.status_code == 404 and wrong.json()["error"]["models"] == [MODEL, "room-price"]
    metrics = httpx.get(f"{rt.url}/metrics", timeout=10).text
    assert 'model="room-price"' in metrics and f'model="{MODEL}"' in metrics


def test_one_model_over_its_memory_pool_is_refused_and_the_other_model_is_unaffected(served, serving_models):  # noqa: F811
    """Rooms' 4 KiB pool holds ~300 stays (4 float32 features each, × 1.2): a 1,000-stay batch is refused with a
    structured 503 naming the model, while flights' 300-flight batches, sent at the same moment, are all answered;
    afterwards rooms' pool is empty again and a normal batch is priced."""
    from concurrent.futures import ThreadPoolExecutor

    rt, _, _ = served
    _, feb = serving_models
    flights = [request_body(feb.row(i, named=True))["flight"] for i in range(300)]
    big = stays(1000)

    def rooms_big():
        return httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": big}, timeout=60)

    def flights_batch():
        return httpx.post(f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": flights}, timeout=60)

    with ThreadPoolExecutor(max_workers=6) as pool:
        refused = [pool.submit(rooms_big) for _ in range(3)]
        answered = [pool.submit(flights_batch) for _ in range(3)]
        refused, answered = [f.result() for f in refused], [f.result() for f in answered]
    for r in refused:
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "memory_budget_exceeded" and error["model"] == "room-price", error
    for r in answered:
        assert r.status_code == 200, r.text
        assert len(r.json()["predictions"]) == len(flights)
    metrics = httpx.get(f"{rt.url}/metrics", timeout=10).text
    limit = int(ROOMS_POOL * 1.2)
    assert f'keel_gpu_pool_limit_bytes{{device="cpu",model="room-price"}} {limit}' in metrics
    assert 'keel_gpu_pool_bytes_in_use{device="cpu",model="room-price"} 0' in metrics  # nothing held after
    small = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": stays(12)}, timeout=10)
    assert small.status_code == 200, small.text


def test_under_a_tier_policy_with_no_room_for_l2_the_l1_model_is_answered_and_l2_is_shed_with_a_structured_503(
    served,
    serving_models,  # noqa: F811
):
    """Tier admission across the models of one runtime, through the real gateway and the policy store: rooms is put
    in L1, and L2 (flights' declared tier) gets no place (admit_in_flight 0, no wait) — a runtime with all its room
    reserved for L1. Flights' requests are shed with 503 ``shed`` naming the tier, logged as such; rooms' are priced.
    (Which request gets a place when places free up is tested on the admission itself, tests/serving/test_admission.py.)
    Runs last here; the policy is set back to the default tiers afterwards."""
    from keel.policies import PolicyStore
    from keel.policies.gateway import DEFAULT_TIERS

    rt, _, _ = served
    tiers = {name: {"p99_ms": t.p99_ms, "availability": t.availability, "timeout_ms": t.timeout_ms}
             for name, t in DEFAULT_TIERS.items()}  # fmt: skip

    def set_tiers(body: dict, reason: str) -> None:
        store = PolicyStore(rt.home / "policies.sqlite")
        applied = store.apply({"tiers": ("sla_tier", body)}, author="tests", reason=reason).version
        store.close()
        deadline = time.monotonic() + 60
        while {m["policy_version"] for m in httpx.get(f"{rt.url}/readyz", timeout=5).json()["models"].values()} != {
            applied
        }:  # every model's context follows the store
            assert time.monotonic() < deadline, f"the gateway did not follow the policy store to version {applied}"
            time.sleep(0.05)

    set_tiers(
        {
            "tiers": tiers,
            "models": {"room-price": "L1"},
            "admit_in_flight": {"L1": 256, "L2": 0, "L3": 0},
            "admit_wait_ms": {"L2": 0, "L3": 0},
        },
        "all room to L1",
    )
    try:
        _, feb = serving_models
        flight = request_body(feb.row(5, named=True))["flight"]
        shed = httpx.post(f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": [flight]}, timeout=10)
        assert shed.status_code == 503, shed.text
        error = shed.json()["error"]
        assert (error["code"], error["tier"], error["in_flight_limit"]) == ("shed", "L2", 0)
        priced = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": stays(3)}, timeout=10)
        assert priced.status_code == 200, priced.text
        day = sorted((rt.home / "serving" / "exposures").glob("exposures-*.jsonl"))[-1]
        lines = [json.loads(x) for x in day.read_text().splitlines()]
        by_id = {x["request_id"]: x for x in lines}
        assert by_id[shed.json()["request_id"]]["error"] == "shed"
        assert by_id[shed.json()["request_id"]]["tier"] == "L2"
        assert by_id[priced.json()["request_id"]]["tier"] == "L1"
        metrics = httpx.get(f"{rt.url}/metrics", timeout=10).text
        assert f'keel_gateway_shed_total{{model="{MODEL}",tier="L2"}} 1' in metrics
    finally:
        set_tiers({"tiers": tiers, "models": {}}, "back to the default tiers")
    answered = httpx.post(f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": [flight]}, timeout=10)
    assert answered.status_code == 200, answered.text


def test_a_regression_answer_is_explained_in_the_labels_units_and_the_contributions_add_up_to_the_price(served):
    """TreeSHAP of the rooms model, from the Triton model that answered: base value + contributions = the raw
    score, which for a regression is the predicted price itself — and the champion in this process agrees."""
    rt, _, _ = served
    entities = stays(20)
    r = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": entities, "explain": True}, timeout=10)
    assert r.status_code == 200, r.text
    answers = r.json()["predictions"]
    local = in_process(rt.home, entities)
    for answer, price in zip(answers, local, strict=True):
        e = answer["explanation"]
        assert e["units"] == "label_price (price paid)"
        total = e["base_value"] + sum(c["contribution"] for c in e["contributions"]) + e["rest"]
        assert total == pytest.approx(e["raw_score"], abs=1e-6)
        assert answer["score"] == pytest.approx(e["raw_score"], abs=1e-4) == pytest.approx(price, rel=1e-5)
        assert {c["feature"] for c in e["contributions"]} == set(rooms.usecase.features.names)
