"""The registry: content-addressed text models, verified loads, recorded promotions and rollbacks."""

from __future__ import annotations

import pytest

from keel.errors import InvalidNameError
from keel.registry import ModelRegistry, RegistryError


@pytest.fixture
def registry(tmp_path, location):
    """A registry on each backend: metadata in ``registry.sqlite`` or a Postgres schema; the model files on disk."""
    r = ModelRegistry(tmp_path / "registry", metadata=location)
    yield r
    r.close()


def test_register_is_content_addressed_and_idempotent(registry):
    a = registry.register("flight-delay", "tree\nversion=v4\n", {"seed": 1})
    b = registry.register("flight-delay", "tree\nversion=v4\n", {"seed": 1})
    assert a.sha256 == b.sha256 and registry.load(a.sha256) == "tree\nversion=v4\n"
    assert registry.path_of(a.sha256).suffix == ".txt"
    assert registry.get("flight-delay", a.sha256).metadata == {"seed": 1}


def test_retraining_to_the_same_model_keeps_its_evaluation(registry):
    """A retraining that reproduces the same bytes is the same model: its new run id is recorded, and the metrics and
    gate verdict annotated since are not lost (the champion keeps its evaluation)."""
    first = registry.register("flight-delay", "tree\nsame\n", {"run_id": "r1", "data_versions": {"2013-01": "a"}})
    registry.annotate("flight-delay", first.sha256, {"metrics": {"auc": 0.71}, "gate": "passed"})
    again = registry.register("flight-delay", "tree\nsame\n", {"run_id": "r2", "data_versions": {"2013-01": "a"}})
    meta = registry.get("flight-delay", first.sha256).metadata
    assert (
        meta
        == again.metadata
        == {
            "run_id": "r2",
            "data_versions": {"2013-01": "a"},
            "metrics": {"auc": 0.71},
            "gate": "passed",
        }
    )
    assert again.registered_at == first.registered_at  # first registration time kept


def test_a_tampered_or_missing_file_is_a_clear_error(registry):
    m = registry.register("flight-delay", "tree\nA\n", {})
    registry.path_of(m.sha256).write_text("tree\nB\n")
    with pytest.raises(RegistryError, match="corrupt or was modified"):
        registry.load(m.sha256)
    registry.path_of(m.sha256).unlink()
    with pytest.raises(RegistryError, match="not in the registry"):
        registry.load(m.sha256)
    with pytest.raises(RegistryError, match="not a sha256"):
        registry.load("../../etc/passwd")


def test_promote_and_rollback_are_recorded(registry):
    first = registry.register("flight-delay", "model one", {}).sha256
    second = registry.register("flight-delay", "model two", {}).sha256
    registry.promote("flight-delay", first, "gate passed")
    registry.promote("flight-delay", second, "gate passed")
    assert (
        registry.alias("flight-delay", "champion") == second and registry.alias("flight-delay", "archived") == first
    )
    assert registry.rollback("flight-delay", "canary breach") == first
    assert (
        registry.alias("flight-delay", "champion") == first and registry.alias("flight-delay", "archived") == second
    )
    events = registry.events("flight-delay")
    assert [e["alias"] for e in events] == ["champion", "archived", "champion", "champion", "archived"]
    assert events[-2]["reason"] == "rollback: canary breach"


def test_bad_names_and_aliases(registry):
    with pytest.raises(InvalidNameError):
        registry.register("../models", "x", {})
    sha = registry.register("flight-delay", "x", {}).sha256
    with pytest.raises(RegistryError, match="unknown alias"):
        registry.set_alias("flight-delay", "production", sha, "why")
    with pytest.raises(RegistryError, match="no archived champion"):
        registry.rollback("flight-delay", "nothing to go back to")


def test_registry_versions_never_change_under_concurrent_registrations(tmp_path, location):
    """Two writers (threads with their own connections) register 25 models each: the versions are 1…50, each model
    keeps the version it had when its registration returned (Triton serves registry version N as model version N)."""
    import threading

    ModelRegistry(tmp_path / "registry", metadata=location).close()  # the tables, once
    seen: dict[str, int] = {}

    def writer(who: str) -> None:
        with ModelRegistry(tmp_path / "registry", metadata=location) as reg:
            for i in range(25):
                m = reg.register("flight-delay", f"tree\n{who}-{i}\n", {"who": who})
                seen[m.sha256] = reg.version("flight-delay", m.sha256)

    threads = [threading.Thread(target=writer, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    with ModelRegistry(tmp_path / "registry", metadata=location) as reg:
        assert reg.versions("flight-delay") == list(range(1, 51))
        assert {sha: reg.version("flight-delay", sha) for sha in seen} == seen
        assert sorted(seen.values()) == list(range(1, 51))
        assert all(reg.sha_of_version("flight-delay", v) == sha for sha, v in seen.items())
