"""What pip actually resolved: one matched Dagster release set and numpy 2 — in the one environment that also runs the
model runtime (the Triton binary extracted from its pinned wheel, no numpy<2 environment beside it)."""

from __future__ import annotations

import tomllib
from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement

from tests import REPO

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


def test_the_model_runtime_is_the_pinned_triton_build_and_needs_no_environment_of_its_own():
    """scripts/setup extracted the pinned wheel's tritonserver (its stamp is the pin's hash) and a server started
    from this environment, with no KEEL_RUNTIME_PYTHON, gets no Python of its own: only the build's libraries."""
    from gpu_runtime.triton import TritonServer, runtime_info
    from gpu_runtime.triton_dist import pin_stamp, triton_home

    home = triton_home()
    assert (home / ".keel-stamp").read_text().strip() == pin_stamp(), "scripts/setup extracts the pinned build"
    binary = home / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    assert binary.stat().st_mode & 0o111 and not binary.stat().st_mode & 0o002  # executable, not world-writable
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("KEEL_RUNTIME_PYTHON", raising=False)
        info = runtime_info()
        env = TritonServer(home / "unused-repo", home / "unused-work").env(info)
    assert info.python is None and info.triton_version == "nvidia-pytriton 0.7.0"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(home / "nvidia_pytriton.libs") and "PYTHONPATH" not in env
