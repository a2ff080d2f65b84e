"""``keel explain --method lime`` on real flights and a real model, as an operator runs it (the CLI in a subprocess):
LIME's weights beside TreeSHAP's exact contributions, their agreement and their cost stated in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np
import polars as pl

from keel.explanations import feature_matrix
from usecases.flights.features import FLIGHT_FEATURES

KEEL = str(Path(sys.executable).with_name("keel"))


def keel(home, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"KEEL_HOME": str(home)}
    return subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=600, env=env)


def test_lime_next_to_treeshap_reports_agreement_and_cost(explained_home, tmp_path):
    home, text = explained_home
    out = tmp_path / "lime.json"
    done = keel(home, "explain", "--model", "flight-delay", "--method", "lime", "--month", "2013-02", "--rows", "12", "--samples", "2000",
                "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rank agreement" in done.stdout and "Cost per row" in done.stdout and "LIME" in done.stdout
    report = json.loads(out.read_text())
    assert report["rows"] == 12 and report["samples"] == 2000 and report["model_version"] == 1
    assert -1 <= report["median_spearman"] <= 1 and 0 <= report["median_top_k_overlap"] <= 1
    assert report["lime_cost_x"] > 0 and report["tree_shap_cost_x"] > 0
    # On this model the two methods agree on what matters: the largest attributions rank alike.
    assert report["median_spearman"] > 0.3, report["summary"]
    # TreeSHAP's numbers in the report are the model's exact contributions for those flights.
    feb = pl.read_parquet(home / "storage" / "flights" / "flight_features" / "2013-02.parquet")
    first = report["per_row"][0]
    row = feb.filter(pl.col("flight_id") == first["row_id"])
    contrib = lgb.Booster(model_str=text).predict(feature_matrix(row, FLIGHT_FEATURES), pred_contrib=True)[0]
    from usecases.flights.features import FEATURE_NAMES

    for name, value in first["shap_top"]:
        assert value == contrib[FEATURE_NAMES.index(name)]
    assert abs(first["shap_top"][0][1]) == np.abs(contrib[:-1]).max()


def test_chosen_flights_and_bad_input(explained_home):
    home, _ = explained_home
    feb = pl.read_parquet(home / "storage" / "flights" / "flight_features" / "2013-02.parquet")
    ids = feb["flight_id"].sort().to_list()[:2]
    done = keel(home, "explain", "--model", "flight-delay", "--method", "lime", "--month", "2013-02", "--samples", "500", "--json",
                *[a for i in ids for a in ("--id", i)])  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [f["row_id"] for f in json.loads(done.stdout)["per_row"]] == ids
    missing = keel(home, "explain", "--model", "flight-delay", "--method", "lime", "--month", "2013-07")
    assert missing.returncode == 2 and "no flight_features for 2013-07" in missing.stderr
    unknown = keel(
        home, "explain", "--model", "flight-delay", "--method", "lime", "--month", "2013-02", "--id", "nope"
    )
    assert unknown.returncode == 2 and "flight nope is not among" in unknown.stderr
    newest = keel(
        home, "explain", "--model", "flight-delay", "--method", "lime", "--rows", "2", "--samples", "500", "--json"
    )
    months = sorted(p.stem for p in (home / "storage" / "flights" / "flight_features").glob("*.parquet"))
    assert newest.returncode == 0 and json.loads(newest.stdout)["month"] == months[-1], newest.stderr
    no_method = keel(home, "explain", "--model", "flight-delay")
    assert no_method.returncode == 2 and "--method" in no_method.stderr
