"""Experiment analysis on real flights with simulated business outcomes whose true effects are known: estimates
contain the truth, SRM withholds conclusions, a harmful treatment breaches its guardrail, the drill-down recovers
a planted segment — and `keel experiment analyze` does it on any Parquet/CSV file, exit 0/1/2."""

from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from keel.experiments.analysis import ExperimentDataError, aggregate, analyze
from keel.experiments.drilldown import drilldown
from keel.experiments.simulator import simulate_offers, synthetic_exposures
from keel.experiments.spec import ExperimentSpecError, parse_spec
from tests import REPO
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from usecases.flights.experiments import flight_units

SPEC = {
    "id": "rebooking-offer",
    "model": "flight-delay",
    "control": {"version": 1},
    "treatment": {"version": 2},
    "traffic_ratio": 0.5,
    "unit": "unit_id",
    "metrics": [
        {"name": "accepted", "kind": "proportion", "column": "offer_accepted", "direction": "increase",
         "covariate": "pre_accepted"},
        {"name": "revenue_per_offer", "kind": "ratio", "numerator": "revenue", "denominator": "offers",
         "direction": "increase"},
        {"name": "late", "kind": "proportion", "column": "late", "direction": "decrease"},
    ],
    "guardrails": [{"metric": "accepted", "threshold": 0.05, "action": "rollback"}],
    "min_sample": 1000,
    "dimensions": ["carrier", "origin", "hour_band"],
}  # fmt: skip


@pytest.fixture(scope="module")
def units(validated):  # noqa: F811
    return flight_units(validated["flights"])


def test_estimates_contain_the_truth_and_cuped_narrows_them(units):
    spec = parse_spec(SPEC)
    frame, truth = simulate_offers(units, seed=1, lift=0.10)
    report = analyze(frame, spec)
    accepted = next(m for m in report["metrics"] if m["name"] == "accepted")
    assert accepted["ci"][0] <= truth.ate <= accepted["ci"][1], (accepted["ci"], truth.ate)
    assert accepted["cuped"]["variance_reduction"] > 0.01 and accepted["se"] < accepted["raw"]["se"]
    assert accepted["verdict"] == "better" and not report["conclusions_withheld"]
    late = next(m for m in report["metrics"] if m["name"] == "late")
    assert late["verdict"] == "no detectable change"  # the real outcome: randomization leaves it alone
    assert not report["srm"]["flagged"] and not report["guardrail_breached"]


def test_a_sample_ratio_mismatch_withholds_conclusions(units):
    frame, _ = simulate_offers(units, seed=2, lift=0.10, drop_treatment=0.05)
    report = analyze(frame, parse_spec(SPEC))
    assert report["srm"]["flagged"] and report["conclusions_withheld"]
    assert all(m["verdict"] == "withheld" for m in report["metrics"])


def test_a_harmful_treatment_breaches_its_guardrail(units):
    frame, truth = simulate_offers(units, seed=3, lift=-0.30)
    [g] = analyze(frame, parse_spec(SPEC))["guardrails"]
    assert g["breached"] and g["action"] == "rollback" and g["harm"] > 0.05 and g["msprt_p"] < 0.05
    frame, _ = simulate_offers(units, seed=4, lift=0.0)
    [g] = analyze(frame, parse_spec(SPEC))["guardrails"]
    assert not g["breached"]


def test_the_drilldown_recovers_a_planted_segment(units):
    planted = {"carrier": "EV", "origin": "EWR"}
    frame, truth = simulate_offers(units, seed=5, lift=0.0, planted=planted, planted_lift=-0.6)
    report = analyze(frame, parse_spec(SPEC))
    d = report["drilldown"]["accepted"]
    assert d["path"] == planted, d
    last = d["steps"][-1]
    true_contribution = truth.ate * truth.planted_share  # per unit of the whole population
    assert last["contribution_ci"][0] <= true_contribution <= last["contribution_ci"][1]
    assert last["share_ci"][0] > 0.5  # most of the observed drop
    assert "carrier=EV" in d["explanation"] and "origin=EWR" in d["explanation"] and "drop" in d["explanation"]
    # A planted segment three levels deep: origin=EWR × hour_band=afternoon × carrier=UA (2,706 flights).
    deep = {"origin": "EWR", "hour_band": "afternoon", "carrier": "UA"}
    frame, truth = simulate_offers(units, seed=6, lift=0.0, planted=deep, planted_lift=1.0, base_rate=0.15)
    spec = parse_spec(SPEC)
    cube = aggregate(frame, spec)
    d = drilldown(cube, "variant", "control", "treatment", spec.dimensions, "accepted", min_support=100)
    assert d.path == deep and "rise" in d.explanation
    # No planted effect: no significant concentration, nothing claimed.
    frame, _ = simulate_offers(units, seed=7, lift=0.0)
    d = drilldown(aggregate(frame, spec), "variant", "control", "treatment", spec.dimensions, "accepted")
    assert d.steps == () and ("not concentrated" in d.explanation or "not significant" in d.explanation)


def test_spec_errors_name_the_field():
    with pytest.raises(ExperimentSpecError, match=r"spec\.metrics\[1\]\.kind"):
        parse_spec(SPEC | {"metrics": [SPEC["metrics"][0], {"name": "x", "kind": "median", "direction": "increase"}]})
    with pytest.raises(ExperimentSpecError, match=r"spec\.guardrails\[0\]\.metric: names no metric"):
        parse_spec(SPEC | {"guardrails": [{"metric": "nope", "threshold": 0.1, "action": "pause"}]})
    with pytest.raises(ExperimentSpecError, match=r"spec\.id"):
        parse_spec(SPEC | {"id": "../etc"})
    with pytest.raises(ExperimentSpecError, match=r"spec\.traffic_ratio"):
        parse_spec(SPEC | {"traffic_ratio": 0})
    with pytest.raises(ExperimentDataError, match="revenue"):
        analyze(pl.DataFrame({"variant": ["control"], "offer_accepted": [1]}), parse_spec(SPEC))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "keel.cli", "experiment", "analyze", *args], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip


def test_the_cli_analyzes_any_parquet_or_csv(tmp_path):
    """Not keel's own logs: a generic file with a variant column, an outcome and a covariate."""
    data = synthetic_exposures(50_000, seed=9, lift=0.05).rename({"variant": "arm"})
    data = data.with_columns(pl.col("arm").replace({"control": "A", "treatment": "B"}))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "id: generic\nmodel: flight-delay\nvariant_column: arm\ncontrol_label: A\ntreatment_label: B\nmetrics:\n"
        "  - {name: value, kind: mean, column: value, covariate: pre_value, direction: increase}\n"
        "  - {name: converted, kind: proportion, column: converted, direction: increase}\n"
        "guardrails: [{metric: converted, threshold: 0.02, action: pause}]\ndimensions: [segment]\n"
    )
    for fmt in ("parquet", "csv"):
        path = tmp_path / f"data.{fmt}"
        data.write_parquet(path) if fmt == "parquet" else data.write_csv(path)
        out = tmp_path / f"report-{fmt}.json"
        r = cli("--spec", str(spec), "--data", str(path), "--out", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        report = json.loads(out.read_text())
        assert report["arms"]["A"] + report["arms"]["B"] == 50_000
        value = next(m for m in report["metrics"] if m["name"] == "value")
        assert value["method"] == "cuped" and value["verdict"] == "better" and "value:" in r.stdout
    # a sample-ratio mismatch: exit 1
    skewed = tmp_path / "skewed.parquet"
    data.filter(~((pl.col("arm") == "B") & (pl.int_range(pl.len()) % 10 == 0))).write_parquet(skewed)
    r = cli("--spec", str(spec), "--data", str(skewed), "--out", str(tmp_path / "r.json"))
    assert r.returncode == 1 and "sample-ratio mismatch" in r.stdout
    # bad input: exit 2, naming what and where
    r = cli("--spec", str(spec), "--data", str(tmp_path / "data.csv").replace("data", "nodata"), "--out", "x.json")
    assert r.returncode == 2 and "no such data file" in r.stderr
    data.drop("pre_value").write_parquet(tmp_path / "nocov.parquet")
    r = cli("--spec", str(spec), "--data", str(tmp_path / "nocov.parquet"), "--out", str(tmp_path / "r.json"))
    assert r.returncode == 2 and "pre_value" in r.stderr and "nocov.parquet" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\nmetrics: [{name: v, column: value, direction: up}]\n")
    r = cli("--spec", str(bad), "--data", str(tmp_path / "data.parquet"), "--out", str(tmp_path / "r.json"))
    assert r.returncode == 2 and "spec.metrics[0].direction" in r.stderr
