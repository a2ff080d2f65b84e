"""Issue 46 item 1: only a model a gate passed (or a champion) is ever served. ``plan_deployment`` against the
registry and ``FakeDeployer`` (a named fake of the model runtime: no Triton); the gateway's side — a failing
champion's requests never go to a version at weight 0 — is tests/serving/test_gateway.py."""

from __future__ import annotations

from keel.deploy.plan import plan_deployment
from keel.policies import PolicyStore
from keel.registry import CHALLENGER_GATE_KEY, QUALITY_GATE_KEY, ModelRegistry, passed_a_gate

MODEL = "flight-delay"
PROMOTION = {"data": {"parts": {}}, "model": {"parts": {}}}


def served_versions(tmp_path, registry) -> dict[str, int]:
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        plan = plan_deployment(store.state(), store.version(), registry, MODEL, PROMOTION)
    return {t.route.name: t.route.version for t in plan.targets}


def test_a_candidate_its_gate_refused_is_not_deployed_even_when_named_challenger(tmp_path):
    with ModelRegistry(tmp_path / "registry") as registry:
        registry.promote(MODEL, registry.register(MODEL, "model one", {}).sha256, "test")
        refused = registry.register(MODEL, "model two", {}).sha256
        registry.annotate(MODEL, refused, {CHALLENGER_GATE_KEY: {"candidate": "rolling", "chosen": False}})
        registry.set_alias(MODEL, "challenger", refused, "an alias set the way the gate used to set it")
        assert served_versions(tmp_path, registry) == {"champion": 1}
        registry.annotate(MODEL, refused, {CHALLENGER_GATE_KEY: {"candidate": "rolling", "chosen": True}})
        assert served_versions(tmp_path, registry) == {"champion": 1, "challenger": 2}


def test_a_model_is_vetted_only_by_a_gate_that_passed_it():
    assert not passed_a_gate({})  # never judged
    assert not passed_a_gate({QUALITY_GATE_KEY: {"passed": False, "reasons": ["auc below the floor"]}})
    assert not passed_a_gate({CHALLENGER_GATE_KEY: {"chosen": False, "surely_better": True}})
    assert not passed_a_gate({QUALITY_GATE_KEY: {"passed": "yes"}})  # only a recorded True counts
    assert passed_a_gate({QUALITY_GATE_KEY: {"passed": True}})
    assert passed_a_gate({CHALLENGER_GATE_KEY: {"chosen": True}})
