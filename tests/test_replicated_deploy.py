"""One deployment to several runtime replicas (keel.deploy.routing.ReplicatedDeployer), against the named fake of
the model runtime (keel.deploy.fake: real routing files, no Triton). The real replicas are deployed to in
tests/serving/test_two_gateways.py."""

from __future__ import annotations

import hashlib

import pytest

from keel.deploy.fake import FakeDeployer
from keel.deploy.routing import ReplicaDeployError, ReplicatedDeployer, Route, RoutingTable, Target

MODEL = "flight-delay"


def target(version: int, text: str) -> Target:
    return Target(Route("champion", version, hashlib.sha256(text.encode()).hexdigest(), 1.0, f"rel-{version}"), text)


class RefusingDeployer(FakeDeployer):
    """The fake runtime, made to fail its loads while ``refuse`` is set (a replica out of GPU memory)."""

    refuse = False

    def deploy(self, model, targets, **kw):
        if self.refuse:
            raise RuntimeError("out of GPU memory")
        return super().deploy(model, targets, **kw)


def test_every_replica_gets_the_same_routing_and_a_failure_names_the_replica(tmp_path):
    fakes = {name: RefusingDeployer(tmp_path / name / "routing.json", 3) for name in ("a", "b", "c")}
    replicated = ReplicatedDeployer(fakes)
    report = replicated.deploy(MODEL, [target(1, "model one")])
    assert report.loaded == (1,) and set(replicated.reports) == {"a", "b", "c"}
    tables = [RoutingTable.read(f.routing_path) for f in fakes.values()]
    assert [t.versions() for t in tables] == [[1]] * 3 and replicated.current().versions() == [1]

    # replica b cannot load the next release: the roll-out stops there and says which replicas have it
    fakes["b"].refuse = True
    with pytest.raises(
        ReplicaDeployError, match=r"stopped at replica 'b': .*out of GPU memory.*already deployed: a\)"
    ):
        replicated.deploy(MODEL, [target(2, "model two")])
    assert [RoutingTable.read(f.routing_path).versions() for f in fakes.values()] == [[2], [1], [1]]
    fakes["b"].refuse = False  # run it again: every replica level
    replicated.deploy(MODEL, [target(2, "model two")])
    assert [RoutingTable.read(f.routing_path).versions() for f in fakes.values()] == [[2]] * 3


def test_a_replicated_deployment_needs_a_replica():
    with pytest.raises(ValueError, match="at least one replica"):
        ReplicatedDeployer({})
