"""What a canary step is judged on besides its arms' errors and labels (keel/canary_control.py, keel/canary.py),
through the controller's tick against a real policy store, registry and exposure log: at the last step the
champion's own latency before the step (a busy host is not the challenger's fault), and before any label the
estimated quality of both arms (keel/loop/estimate.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from keel.canary_control import tick
from keel.canary_plan import CanaryState
from keel.exposure_log import ExposureLog
from keel.loop.estimate import Estimator
from keel.policies import PolicyStore
from keel.registry import ModelRegistry
from tests.policy.canary_world import CANARY, T0


@pytest.mark.parametrize(("champion_before_ms", "action"), [(5.0, "promote"), (2.0, "rollback")])
def test_at_the_last_step_the_hosts_latency_is_not_blamed_on_the_challenger(world, champion_before_ms, action):
    """At 100 % the champion answers nothing: the challenger's slow answers are compared with the champion's in the
    window before the step on the same host — as slow there (a busy host): promoted; fast there: rolled back."""
    store, registry, log, exposures, shas = world
    tiers = {"tiers": {"tight": {"p99_ms": 3.0, "availability": 0.999, "timeout_ms": 50.0}}}
    store.apply({"tiers": ("sla_tier", tiers | {"models": {"flight-delay": "tight"}})}, author="ops", reason="tight")
    step = T0 + 100  # the last step (100 %) began here, its quality judged at the step before
    last = CanaryState(step=1, started_at=T0, step_started_at=step, quality_judged=True, armed_at=T0)
    store.apply({"rollout": ("canary", CANARY | {"state": last.__dict__})}, author="ops", reason="at its last step")

    def answers(version: int, start: float, ms: float) -> None:
        for i in range(300):
            row = {"ts": start + i * 0.1, "model": "flight-delay", "status": 200, "latency_ms": ms}
            log.append(row | {"routed_version": version, "model_version": version})

    answers(1, step - 40, champion_before_ms)  # the champion, before the step
    answers(2, step + 1, 5.0)  # the challenger alone, above the 3 ms target
    [done] = tick(store, registry, exposures, step + 61)
    assert done["action"] == action, done["reasons"]
    if action == "promote":
        assert registry.alias("flight-delay", "champion") == shas[1]
        evidence = json.loads(store.commit(done["version"]).reason)["evidence"]
        assert "the host, not the challenger" in evidence["latency_note"]
    else:
        assert "the champion's before this step 0/300" in done["reasons"][0]


@pytest.mark.parametrize("trusted", [True, False])
def test_a_shadow_whose_estimate_is_surely_worse_is_rolled_back_before_any_label(tmp_path, trusted):
    """Both versions keep an estimator in their registry record (fitted on reference rows where their scores meant
    what they say). In shadow the challenger's scores crowd around the base rate — it knows less about these
    requests — while the champion's stay sharp: its expected log-loss is surely worse, and a canary that trusts the
    estimate rolls it back with no label in. One that does not trust it waits for the labels (holds)."""
    rng = np.random.default_rng(62)
    reference = rng.uniform(0.02, 0.98, 5000)
    labels = (rng.random(5000) < reference).astype(float)
    record = {"estimator": Estimator.fit("binary", reference, labels, fitted_on="2030-02").as_metadata()}
    registry = ModelRegistry(tmp_path / "registry")
    shas = [registry.register("flight-delay", f"model text {i}", record).sha256 for i in (1, 2)]
    registry.promote("flight-delay", shas[0], "initial")
    store = PolicyStore(tmp_path / "policies.sqlite", versions_of=lambda m: set(registry.versions(m)))
    estimate = {"metric": "log_loss", "margin": 0.02, "alpha": 0.01, "trust": "held 3 months"}
    shadow = {"steps": [0, 100], "shadow": {"margin": 0.0, "alpha": 0.05, "min_labelled": 200, "min_clusters": 5}}
    body = CANARY | shadow | ({"estimate": estimate} if trusted else {})
    store.apply({"rollout": ("canary", body)}, author="loop", reason="a challenger in shadow")
    log = ExposureLog(tmp_path / "exposures")
    try:
        tick(store, registry, tmp_path / "exposures", T0)  # started: the shadow step
        sharp = rng.uniform(0.02, 0.98, 400)
        for i, p in enumerate(sharp):
            row = {
                "ts": T0 + 1 + i * 0.01,
                "model": "flight-delay",
                "status": 200,
                "latency_ms": 4.0,
                "score": float(p),
            }
            log.append(row | {"routed_version": 1, "model_version": 1, "shadow_version": 2, "shadow_score": 0.5})
        decided = tick(store, registry, tmp_path / "exposures", T0 + 10)
        if trusted:
            [rollback] = decided
            assert rollback["action"] == "rollback", rollback
            assert rollback["reasons"][0].startswith("estimated log_loss surely worse before its labels")
            assert json.loads(store.commit(rollback["version"]).reason)["evidence"]["estimate"]["worse"] is True
        else:
            assert decided == []  # no labels: the shadow holds until they judge it
    finally:
        log.close()
        store.close()
        registry.close()
