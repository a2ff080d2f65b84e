"""Rollback as a decision over the ledger and the registry, against ``FakeDeployer`` (a named fake of the model
runtime: no Triton). The same function against the real Triton is tests/serving/test_deployment_asset.py."""

from __future__ import annotations

import pytest

from keel.deploy.fake import FakeDeployer
from keel.deploy.routing import Route, RoutingTable, Target
from keel.ledger import Ledger
from keel.registry import ModelRegistry, RegistryError
from keel.rollback import RollbackError, rollback

MODEL = "flight-delay"


def manifest(sha: str) -> dict:
    return {"model": {"parts": {"sha256": sha}}}


@pytest.fixture
def released(tmp_path):
    """Two releases in the ledger (model one, then model two live) and the fake runtime serving model two."""
    registry, ledger = ModelRegistry(tmp_path / "registry"), Ledger(tmp_path / "ledger.sqlite")
    one = registry.register(MODEL, "model one", {}).sha256
    two = registry.register(MODEL, "model two", {}).sha256
    ledger.append("rel-1", manifest(one))
    ledger.append("rel-2", manifest(two))
    registry.promote(MODEL, two, "test")
    deployer = FakeDeployer(tmp_path / "serving" / "routing.json", n_features=3)

    deployer.deploy(MODEL, [Target(Route("champion", registry.version(MODEL, two), two, 1.0, "rel-2"), "model two")])
    yield registry, ledger, deployer, one, two
    registry.close()
    ledger.close()


def test_rollback_serves_the_previous_release_with_the_replaced_one_as_fallback(released):
    registry, ledger, deployer, one, two = released
    result = rollback(registry, ledger, deployer, MODEL, "challenger looks wrong")
    table = RoutingTable.read(deployer.routing_path)
    assert [(r.name, r.sha256, r.release_id) for r in table.routes] == [("champion", one, "rel-1")]
    assert table.fallback.sha256 == two and table.generation == 2
    assert deployer.loaded == {(MODEL, 1): one, (MODEL, 2): two}
    assert registry.alias(MODEL, "champion") == one
    log = ledger.log()
    assert [e.release_id for e in log] == ["rel-1", "rel-2", "rel-1"] and log[-1].reverts == log[0].seq
    assert result.replaced.release_id == "rel-2" and result.restored.seq == 3
    assert ledger.verify().ok


def test_a_tampered_model_stops_the_rollback_before_anything_changes(released):
    registry, ledger, deployer, one, _ = released
    registry.path_of(one).write_text("model one, edited")
    with pytest.raises(RegistryError, match="corrupt or was modified"):
        rollback(registry, ledger, deployer, MODEL, "undo")
    assert RoutingTable.read(deployer.routing_path).generation == 1 and len(ledger.log()) == 2


def test_nothing_to_roll_back_to_is_a_clear_error(tmp_path):
    registry, ledger = ModelRegistry(tmp_path / "registry"), Ledger(tmp_path / "ledger.sqlite")
    deployer = FakeDeployer(tmp_path / "routing.json", n_features=3)
    with pytest.raises(RollbackError, match="ledger is empty"):
        rollback(registry, ledger, deployer, MODEL, "undo")
    only = registry.register(MODEL, "model one", {}).sha256
    ledger.append("rel-1", manifest(only))
    with pytest.raises(RollbackError, match="only release"):
        rollback(registry, ledger, deployer, MODEL, "undo")


def test_with_two_models_in_the_ledger_a_rollback_restores_its_own_models_previous_release(released):
    """Another model released after this one's latest: rolling this model back restores this model's previous
    release (not the other model's), and the other model's release stays what served it."""
    registry, ledger, deployer, one, two = released
    rate = registry.register("room-rate", "rate model", {}).sha256
    ledger.append("rel-rate-1", manifest(rate))
    result = rollback(registry, ledger, deployer, MODEL, "undo the flights release")
    assert (result.replaced.release_id, result.restored.release_id) == ("rel-2", "rel-1")
    assert RoutingTable.read(deployer.routing_path).routes[0].sha256 == one
    assert registry.alias("room-rate", "champion") != one  # untouched
    assert [e.release_id for e in ledger.log()] == ["rel-1", "rel-2", "rel-rate-1", "rel-1"]


def test_a_rollback_serves_the_restored_versions_coarse_model(released):
    """Each version's coarse model goes with it: rolled back to model one, the gateway's coarse answer is model one's
    (its text beside the routing table, named by its sha256), not the coarse model of the release rolled back."""
    from keel.deploy.routing import coarse_path
    from keel.registry import coarse_name

    registry, ledger, deployer, one, two = released
    for sha, text in ((one, "coarse of one"), (two, "coarse of two")):
        coarse = registry.register(coarse_name(MODEL), text, {"coarse_of": sha}).sha256
        registry.annotate(MODEL, sha, {"coarse_sha256": coarse})
    rollback(registry, ledger, deployer, MODEL, "undo")
    table = RoutingTable.read(deployer.routing_path)
    assert table.coarse.name == "coarse" and table.coarse.release_id == "rel-1"
    assert coarse_path(deployer.routing_path, table.coarse.sha256).read_text() == "coarse of one"
    assert table.coarse.version == registry.version(coarse_name(MODEL), table.coarse.sha256) == 1
    assert table.coarse.sha256 not in deployer.loaded.values()  # not a Triton model: the gateway scores it


def test_a_coarse_text_that_does_not_match_its_sha256_is_not_published(tmp_path):
    deployer = FakeDeployer(tmp_path / "routing" / "m.json", n_features=3)
    wrong = Target(Route("coarse", 1, "0" * 64, 0.0), "some text")
    with pytest.raises(ValueError, match="does not match its sha256"):
        deployer.deploy(MODEL, [Target(Route("champion", 1, _sha("m"), 1.0), "m")], coarse=wrong)
    assert RoutingTable.read(deployer.routing_path) is None  # nothing was switched


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
