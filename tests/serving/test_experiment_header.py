"""Issue 46 item 3: experiments a request names (``x-experiment-id``), several on one model at once — started with
`keel experiment start` from a shell and routed by the real gateway (real Triton, real February flights), each
sticky per unit by its own salt, each analysed on its own exposures (keel.experiments.lake.wide_rows)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import polars as pl
import pytest

from keel.experiments import control
from keel.experiments.lake import wide_rows
from keel.exposure_log import read_exposures
from keel.policies import PolicyStore
from tests import REPO
from tests.serving.conftest import MODEL, request_body, serving_version_1

SPEC = """\
id: {id}
model: flight-delay
control: {{version: 1}}
treatment: {{version: {treatment}}}
traffic_ratio: 0.5
traffic: {traffic}
metrics:
  - {{name: late_logloss, kind: mean, column: log_loss, direction: decrease}}
"""


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    with serving_version_1(runtime_home, serving_models[0]) as rt:
        yield rt


def keel_experiment(home, tmp_path, *args: str, **spec: str) -> subprocess.CompletedProcess:
    if spec:
        path = tmp_path / f"{spec['id']}.yaml"
        path.write_text(SPEC.format(**spec))
        args = (*args, "--spec", str(path))
    env = os.environ | {"KEEL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "keel.cli", "experiment", *args], capture_output=True, text=True,
                          cwd=REPO, env=env)  # fmt: skip


def test_two_experiments_named_by_header_run_on_one_model_at_once(runtime, serving_models, tmp_path):
    _, feb = serving_models
    home = runtime.home
    runtime.deployer().deploy(MODEL, [runtime.target(1), runtime.target(2, "experiment-v2", 0.0),
                                      runtime.target(3, "experiment-v3", 0.0)])  # fmt: skip
    runtime.wait_ready()
    for exp_id, treatment in (("seat-offer", 2), ("meal-offer", 3)):
        started = keel_experiment(home, tmp_path, "start", id=exp_id, treatment=str(treatment), traffic="header")
        assert started.returncode == 0, started.stderr
    rows = list(feb.head(80).iter_rows(named=True))

    def answered(exp_id: str | None) -> list[dict]:
        headers = {"x-experiment-id": exp_id} if exp_id else {}
        out = []
        for row in rows:
            r = runtime.post(request_body(row), headers)
            assert r.status_code == 200, r.text
            out.append(r.json() | {"unit": row["flight_id"], "request_id": r.headers["x-request-id"]})
        return out

    deadline = time.monotonic() + 60  # the gateway follows the store within a poll: wait for the event
    while "unknown_experiment" in answered("seat-offer")[0]["degraded"]:
        assert time.monotonic() < deadline, "the gateway never routed the started experiment"
        time.sleep(0.5)
    seat, meal, plain, seat_again = (
        answered("seat-offer"),
        answered("meal-offer"),
        answered(None),
        answered("seat-offer"),
    )
    assert {a["model_version"] for a in seat} == {1, 2} and {a["model_version"] for a in meal} == {1, 3}
    assert {a["variant"] for a in seat} == {"control", "treatment"}
    assert not [
        a["degraded"] for a in seat + meal if {"unknown_experiment", "experiment_not_deployed"} & set(a["degraded"])
    ]
    assert {a["model_version"] for a in plain} == {1}  # no header: the champion; no experiment takes it
    assert [a["model_version"] for a in seat] == [a["model_version"] for a in seat_again]  # sticky per unit
    # each its own salt: the two experiments put different units into treatment
    treated = {e: {a["unit"] for a in answers if a["variant"] == "treatment"} for e, answers in
               (("seat", seat), ("meal", meal))}  # fmt: skip
    assert treated["seat"] != treated["meal"]

    # each analysed on its own exposures: the wide table of one holds exactly the requests that named it
    exposures = pl.DataFrame(read_exposures(home / "serving" / "exposures"), infer_schema_length=None)
    with PolicyStore(home / "policies.sqlite") as store:
        live = control.experiments(store)
    for exp_id, answers in (("seat-offer", seat + seat_again), ("meal-offer", meal)):
        wide = wide_rows(exposures, control.stored_spec(home, exp_id), live[exp_id])
        assert set(wide["request_id"]) >= {a["request_id"] for a in answers}
        assert set(wide["experiment_id"]) == {exp_id}
        named = exposures.filter(pl.col("experiment_id") == exp_id)
        assert wide.height == named.height  # none of the other's, none untagged

    # a second experiment of the model's whole traffic is refused while one runs; stopping one leaves the other
    assert keel_experiment(home, tmp_path, "start", id="fare-a", treatment="2", traffic="all").returncode == 0
    refused = keel_experiment(home, tmp_path, "start", id="fare-b", treatment="3", traffic="all")
    assert refused.returncode != 0 and "already splits all of flight-delay's traffic" in refused.stderr
    for exp_id in ("fare-a", "seat-offer"):
        assert keel_experiment(home, tmp_path, "stop", exp_id, "--reason", "test").returncode == 0
    deadline = time.monotonic() + 60
    while "unknown_experiment" not in answered("seat-offer")[0]["degraded"]:
        assert time.monotonic() < deadline, "a stopped experiment kept routing"
        time.sleep(0.5)
    assert {a["model_version"] for a in answered("meal-offer")} == {1, 3}
    runtime.deployer().deploy(MODEL, [runtime.target(1)])
