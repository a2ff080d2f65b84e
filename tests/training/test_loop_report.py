"""loop_report's numbers, recomputed independently: which release served each day from the ledger's own ``at``
query, each flight scored by that release's model, AUC and log-loss from scratch — the same numbers as the asset's."""

from __future__ import annotations

from datetime import UTC, datetime, time

import dagster as dg
import lightgbm as lgb
import numpy as np
import polars as pl
import pytest
from scipy.stats import mannwhitneyu

from keel.exposure_log import ExposureLog
from keel.home import KeelHome
from keel.ledger import Ledger
from keel.registry import ModelRegistry
from keel.storage import write_parquet_atomic
from keel.training.model import TrainingConfig, month_of, train_model
from resources import keel_resources
from tests.flights import loop_report
from usecases.flights.features import FEATURE_NAMES, FLIGHT_FEATURES

MONTHS = ("2013-01", "2013-02", "2013-03", "2013-04", "2013-05")


def manifest(sha: str) -> dict:
    return {"release_id": "x", "model": {"hash": "h", "parts": {"sha256": sha, "asset": "flights/delay_model"}}}


@pytest.fixture
def home(tmp_path, feature_months):
    """Stored features for 2013-01…05; the static model (v1) live from March, a retrained one (v2) from 15 May."""
    home = KeelHome.of(tmp_path)
    for m in MONTHS:
        write_parquet_atomic(
            month_of(feature_months, m, FLIGHT_FEATURES), home.asset_file("flights/flight_features", m)
        )
    static = train_model(
        feature_months, TrainingConfig(train_months=("2013-01",), valid_month="2013-02"), FLIGHT_FEATURES
    )
    later = train_model(
        feature_months, TrainingConfig(train_months=("2013-02", "2013-03"), valid_month="2013-04"), FLIGHT_FEATURES
    )
    with ModelRegistry(home.registry) as reg:
        reg.register("flight-delay", static.text, {})
        reg.register("flight-delay", later.text, {"trigger": {"drift_window": "2013-04", "drift_event": 3}})
    with Ledger(home.ledger) as ledger:
        ledger.append("rel-static", manifest(static.sha256), datetime(2013, 3, 1, 12, tzinfo=UTC))
        ledger.append("rel-later", manifest(later.sha256), datetime(2013, 5, 15, 3, tzinfo=UTC))
        # the same model redeployed (a policy change): no promotion of its own
        ledger.append("rel-again", manifest(later.sha256), datetime(2013, 5, 20, 3, tzinfo=UTC))
    return home


def labelled(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("label_late15").is_not_null()).sort("flight_id")


def scores(model_text: str, frame: pl.DataFrame) -> np.ndarray:
    x = frame.select([pl.col(f).cast(pl.Float64) for f in FEATURE_NAMES]).to_numpy()
    return lgb.Booster(model_str=model_text).predict(x)


def auc_of(s: np.ndarray, y: np.ndarray) -> float:
    return mannwhitneyu(s[y == 1], s[y == 0]).statistic / ((y == 1).sum() * (y == 0).sum())


def log_loss_of(s: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(s, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_the_report_is_what_the_ledger_and_the_labels_say(home):
    may = labelled(pl.read_parquet(home.asset_file("flights/flight_features", "2013-05")))
    april = pl.DataFrame({"month": ["2013-04"] * 4, "model": ["served", "static", "naive", "expanding"],
                          "auc": [0.70, 0.69, None, None], "log_loss": [0.5, 0.51, None, None]})  # fmt: skip
    write_parquet_atomic(april, home.asset_file("flights/loop_report", "2013-04"))  # as the asset stored it
    log = ExposureLog(home.serving.exposures)  # May 10: three answers by the model, one by its coarse fallback
    may_10 = datetime(2013, 5, 10, 12, tzinfo=UTC).timestamp()
    for i, coarse in enumerate((False, False, False, True)):
        log.append({"ts": may_10 + i, "status": 200, "model": "flight-delay", "model_version": None if coarse else 1,
                    "variant": "coarse" if coarse else None, "latency_ms": 3.0})  # fmt: skip
    log.append({"ts": may_10, "status": 200, "model": "room-rate", "model_version": 1, "latency_ms": 3.0})  # not ours
    log.close()
    with dg.instance_for_test() as instance:
        context = dg.build_asset_context(
            partition_key="2013-05", resources=keel_resources(home.root), instance=instance
        )
        out, estimate = loop_report(context, features=may)  # flights' (binary): no coverage check
    meta = {k: v.value for k, v in out.metadata.items()}
    # these versions were registered with no estimator: nothing to measure it by, said so
    assert estimate.check_name == "estimate_held" and estimate.passed and "no served version" in estimate.description

    # which release served each day, by the ledger's own query (noon UTC of the flight's day); the serving periods
    ledger, registry = Ledger(home.ledger), ModelRegistry(home.registry)
    served_by = {}
    for (day,) in may.select("sched_date").unique().iter_rows():
        served_by[day] = ledger.at(datetime.combine(day, time(12, tzinfo=UTC))).manifest["model"]["parts"]["sha256"]
    periods = {}
    for day, sha in sorted(served_by.items()):
        periods.setdefault(sha, []).append(day)  # here each model served one run of days
    parts = [may.filter(pl.col("sched_date").is_in(days)) for days in periods.values()]
    texts = [registry.load(sha) for sha in periods]
    static_text = registry.load(ledger.log()[0].manifest["model"]["parts"]["sha256"])
    feats = pl.concat([pl.read_parquet(home.asset_file("flights/flight_features", m)) for m in MONTHS])
    naive_text = train_model(
        feats, TrainingConfig(train_months=("2013-01", "2013-02", "2013-03"), valid_month="2013-04"), FLIGHT_FEATURES
    ).text  # retrained on January–March, early-stopped on April, without a gate

    def measured(models: list[str]) -> tuple[float, float]:
        """AUC within each serving period weighted by its flights; log-loss over all flights."""
        scored = [(scores(t, part), part["label_late15"].to_numpy()) for t, part in zip(models, parts, strict=True)]
        weighted = sum(auc_of(s, y) * y.size for s, y in scored) / sum(y.size for _, y in scored)
        s, y = np.concatenate([s for s, _ in scored]), np.concatenate([y for _, y in scored])
        return weighted, log_loss_of(s, y)

    # the expanding reference for May: all labelled history before it (January–March), early-stopped on April —
    # in May the same window as the naive one (they part from June on: the naive one keeps only four months)
    expanding_text = naive_text
    for name, models in (("served", texts), ("static", [static_text] * 2), ("naive", [naive_text] * 2),
                         ("expanding", [expanding_text] * 2)):  # fmt: skip
        auc, loss = measured(models)
        assert meta[f"{name}_auc"] == pytest.approx(auc, abs=1e-4), name
        assert meta[f"{name}_log_loss"] == pytest.approx(loss, abs=1e-4), name
    # the 15th's noon is after 03:00: days 1–14 by v1, 15–31 by v2
    first_half = may.filter(pl.col("sched_date").dt.day() < 15).height
    assert meta["served_by"] == f"v1: {first_half:,} flights, v2: {may.height - first_half:,} flights"
    assert meta["labelled_flights"] == may.height
    assert [r.data["model"] for r in out.metadata["scores"].value.records] == ["served", "static", "naive",
                                                                               "expanding"]  # fmt: skip
    # the release that went live in May, and its delay from the end of the drift month that caused it
    [promotion] = [r.data for r in out.metadata["promotions"].value.records]
    assert (promotion["release"], promotion["version"], promotion["drift_window"]) == ("rel-later", 2, "2013-04")
    assert promotion["delay_days"] == meta["promotion_delay_days"] == pytest.approx(14.125)  # May 15 03:00
    # the year at a glance: April's report (built before) and May's, with the model changes on their months
    assert meta["year_months"] == 2
    april, may_row = (r.data for r in out.metadata["year"].value.records)
    assert (april["month"], april["served_auc"], april["static_auc"], april["naive_auc"]) == (
        "2013-04",
        0.7,
        0.69,
        None,
    )
    assert may_row["month"] == "2013-05" and may_row["served_auc"] == pytest.approx(meta["served_auc"], abs=1e-4)
    assert may_row["what_happened"] == "v2 live 05-15" and "![plot](data:image/svg+xml;base64," in meta["year_chart"]
    # what answered May's requests, from the exposure log (whatever the ledger says served)
    assert meta["answered"] == "of 4 requests: the model 75.0%, coarse 25.0%, last resort 0.0%, failed 0.0%"
    assert meta["answered_by_model_share"] == 0.75


def test_a_month_before_any_release_is_a_clear_failure(tmp_path, feature_months):
    home = KeelHome.of(tmp_path)
    with dg.instance_for_test() as instance:
        context = dg.build_asset_context(
            partition_key="2013-05", resources=keel_resources(home.root), instance=instance
        )
        with pytest.raises(dg.Failure, match="nothing has served yet"):
            list(loop_report(context, features=month_of(feature_months, "2013-05", FLIGHT_FEATURES)))


def test_each_row_is_scored_by_the_baseline_of_the_month_it_was_scored_as_of(feature_months):
    """A hotel booking of August quoted in January is scored by January's naive model, not August's: rows of one
    report scored as of two months get each month's baseline; a month without one gets the static model."""
    from keel.loop.report import Release, month_report

    april_may = labelled(
        feature_months.filter(pl.col("sched_date").dt.strftime("%Y-%m").is_in(["2013-04", "2013-05"]))
    )
    static = train_model(feature_months, TrainingConfig(train_months=("2013-01",), valid_month="2013-02"),
                         FLIGHT_FEATURES).text  # fmt: skip
    april = train_model(feature_months, TrainingConfig(train_months=("2013-02",), valid_month="2013-03"),
                        FLIGHT_FEATURES).text  # fmt: skip
    releases = [Release(datetime(2013, 3, 1, tzinfo=UTC), "rel-static", "s")]
    asked = []

    def naive(month: str) -> str | None:
        asked.append(month)
        return {"2013-04": april}.get(month)  # May: no refit — the static model scores it

    report = month_report("2013-05", april_may, releases, lambda _: static, static, naive, FLIGHT_FEATURES)
    assert sorted(asked) == ["2013-04", "2013-05"]
    in_april = april_may.filter(pl.col("sched_date").dt.month() == 4)
    in_may = april_may.filter(pl.col("sched_date").dt.month() == 5)
    s = np.concatenate([scores(april, in_april), scores(static, in_may)])
    y = np.concatenate([in_april["label_late15"].to_numpy(), in_may["label_late15"].to_numpy()])
    assert report.naive.log_loss == pytest.approx(log_loss_of(s, y), abs=1e-6)
    assert report.naive.log_loss != pytest.approx(report.static.log_loss, abs=1e-4)  # April's model did score April


@pytest.mark.parametrize("concept_shift", [False, True])
def test_the_estimate_of_what_served_stands_beside_its_realized_value_and_a_miss_is_a_warning(
    home, feature_months, concept_shift
):
    """v1 registered with its estimator (its calibration, fitted on its validation month): May's report shows what
    the estimate said from the scores alone beside the realized AUC on the same flights, within 0.01 on real May.
    With May's labels shuffled among its flights (the labels no longer follow the features: a concept shift the
    scores cannot show) the estimate misses, and the WARN check says so."""
    from keel.loop.estimate import estimator_record

    with ModelRegistry(home.registry) as reg:
        static_sha = Ledger(home.ledger).log()[0].manifest["model"]["parts"]["sha256"]
        february = month_of(feature_months, "2013-02", FLIGHT_FEATURES)
        text = reg.load(static_sha)
        reg.register("flight-delay", text, estimator_record(text, february, FLIGHT_FEATURES, "2013-02"))
    may = labelled(pl.read_parquet(home.asset_file("flights/flight_features", "2013-05")))
    if concept_shift:
        may = may.with_columns(pl.col("label_late15").shuffle(seed=62))
    with dg.instance_for_test() as instance:
        context = dg.build_asset_context(
            partition_key="2013-05", resources=keel_resources(home.root), instance=instance
        )
        out, check = loop_report(context, features=may)
    [row] = [r.data for r in out.metadata["estimates"].value.records]  # v2 has no estimator: left out
    first_half = may.filter(pl.col("sched_date").dt.day() < 15)
    realized = auc_of(scores(model_text_of(home, static_sha), first_half), first_half["label_late15"].to_numpy())
    assert row["version"] == 1 and row["metric"] == "auc" and row["rows"] == first_half.height
    assert row["realized"] == pytest.approx(realized, abs=1e-4)
    if concept_shift:
        assert row["estimated"] - row["realized"] > 0.1 and not row["held"]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN and "v1: auc" in check.description
        # and the labels say why: the calibration's slope fell to about 0 (keel/loop/concept.py) — concept drift
        slope = float(row["concept"].split("slope ")[1].split(" ")[0])
        assert row["concept_drift"] and row["concept"].startswith("concept drift") and abs(slope) < 0.2
        assert "the estimate missed — concept drift: the labels moved where the scores did not" in check.description
    else:
        assert abs(row["estimated"] - row["realized"]) <= 0.01 and row["held"] and check.passed


def model_text_of(home, sha: str) -> str:
    return ModelRegistry(home.registry).load(sha)


def test_each_decision_says_how_many_days_after_its_labels_it_came():
    """The actions table's ``days_after_labels``: from the end of the gate month (the labels a decision rests on) to
    the decision, simulated — what "decide in days" is measured by."""
    from keel.loop.report import days_after

    assert days_after("2013-06", "2013-07-11T12:00:00+00:00") == 10.5
    assert days_after("2013-12", "2014-01-01T00:00:00+00:00") == 0.0
    assert days_after(None, "2013-07-11T12:00:00+00:00") is None and days_after("2013-06", "") is None
