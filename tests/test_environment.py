"""What pip actually resolved: one matched Dagster release set, numpy 2 here and numpy<2 in the model runtime."""

from __future__ import annotations

import subprocess
import tomllib
from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

DAGSTER_RELEASE = "1.13.27"
DAGSTER_K8S_RELEASE = "0.29.27"


def test_dagster_is_one_matched_release_set():
    assert version("dagster") == DAGSTER_RELEASE
    assert version("dagster-webserver") == DAGSTER_RELEASE
    assert version("dagster-graphql") == DAGSTER_RELEASE
    assert version("dagster-pipes") == DAGSTER_RELEASE
    assert version("dagster-k8s") == DAGSTER_K8S_RELEASE
    assert version("dagster-postgres") == DAGSTER_K8S_RELEASE  # the integrations share their release number
    # and the integrations themselves were built for exactly this dagster
    for integration in ("dagster-k8s", "dagster-postgres"):
        dagster_req = next(Requirement(r) for r in requires(integration) if Requirement(r).name == "dagster")
        assert str(dagster_req.specifier) == f"=={DAGSTER_RELEASE}", integration


def test_installed_versions_match_the_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    for pin in pins:
        req = Requirement(pin)
        assert str(req.specifier).startswith("=="), f"{pin} is not pinned"
        assert req.specifier.contains(version(req.name)), (
            f"{req.name}: pinned {req.specifier}, installed {version(req.name)}"
        )


def test_redis_replies_are_parsed_in_c():
    """redis-py falls back to its pure-Python parser silently when hiredis is missing (2× slower reads)."""
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE


def test_analytics_environment_has_numpy_2():
    import numpy

    assert int(numpy.__version__.split(".")[0]) == 2


def test_model_runtime_environment_has_numpy_below_2():
    python = REPO / ".venv-runtime" / "bin" / "python"
    if not python.exists():
        pytest.fail(".venv-runtime is missing: scripts/setup creates it (the README's commands run it)")
    out = subprocess.run(
        [str(python), "-c", "import numpy, lightgbm; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout.strip().split(".")[0]) < 2
