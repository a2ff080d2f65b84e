"""The release manifest names the price table in force (issue 18: "what did it cost at time T, and why" is answered
from the release live at T): against ``FakeDeployer``, a named fake of the model runtime (no Triton)."""

from __future__ import annotations

from keel.deploy.fake import FakeDeployer
from keel.deploy.plan import plan_deployment, release
from keel.ledger import Ledger
from keel.policies import PolicyStore
from keel.registry import ModelRegistry

MODEL = "flight-delay"
PRICES = {"currency": "USD", "per_1000_requests": 0.4, "per_cpu_second": 0.01, "per_gpu_second": 0.5}
PROMOTION = {"data": {"parts": {}}, "model": {"parts": {}}}


def released(tmp_path, store, registry, ledger):
    plan = plan_deployment(store.state(), store.version(), registry, MODEL, PROMOTION)
    deployer = FakeDeployer(tmp_path / "serving" / "routing.json", n_features=3)
    return release(plan, deployer, ledger, infra={}, gateway_policy={"version": "builtin-1"})


def test_a_price_change_is_a_new_release_whose_manifest_names_the_prices(tmp_path):
    registry, ledger = ModelRegistry(tmp_path / "registry"), Ledger(tmp_path / "ledger.sqlite")
    registry.promote(MODEL, registry.register(MODEL, "model one", {}).sha256, "test")
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        before = released(tmp_path, store, registry, ledger)
        assert before.manifest["policy"]["parts"]["prices"] is None
        store.apply({"prices": ("cost", PRICES)}, author="finance", reason="prices")
        priced = released(tmp_path, store, registry, ledger)
        store.apply({"prices": ("cost", PRICES | {"per_1000_requests": 0.5})}, author="finance", reason="rise")
        risen = released(tmp_path, store, registry, ledger)
    part = priced.manifest["policy"]["parts"]["prices"]
    assert (part["name"], part["version"], part["currency"]) == ("prices", 1, "USD") and len(part["sha256"]) == 64
    assert risen.manifest["policy"]["parts"]["prices"]["version"] == 2
    assert risen.manifest["policy"]["parts"]["prices"]["sha256"] != part["sha256"]
    assert len({before.entry.release_id, priced.entry.release_id, risen.entry.release_id}) == 3
    registry.close()
    ledger.close()
