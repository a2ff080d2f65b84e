"""docs/usecases.md's walkthrough ("Start here: `keel new`") runs as written (issue 49): its ``bash`` blocks with the
environment's ``keel`` and ``python`` first on PATH, then each ``python`` block as a script — in a throwaway folder
with a throwaway KEEL_HOME, so the walkthrough's use case is built there and nowhere else. (``text`` blocks are the
commands for a reader's repository: not run.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import REPO

SECTION = "## Start here: `keel new`"


def walkthrough_blocks() -> list[tuple[str, str]]:
    doc = (REPO / "docs" / "usecases.md").read_text()
    section = doc.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(bash|python)\n(.*?)```", section, re.S)


def test_the_walkthrough_is_found_with_its_commands_and_code():
    kinds = [k for k, _ in walkthrough_blocks()]
    assert kinds[0] == "bash" and kinds.count("python") >= 2
    assert "keel new airport_temps" in walkthrough_blocks()[0][1]


def test_the_walkthrough_runs_as_written(tmp_path):
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "KEEL_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
    }
    for i, (kind, code) in enumerate(walkthrough_blocks()):
        script = tmp_path / f"block{i}.{'sh' if kind == 'bash' else 'py'}"
        script.write_text(code)
        cmd = ["bash", "-euo", "pipefail", str(script)] if kind == "bash" else [sys.executable, str(script)]
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (
            f"block {i} ({kind}) of docs/usecases.md failed:\n{code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    contract = (tmp_path / "usecases" / "airport_temps" / "contracts" / "airport_temps.yaml").read_text()
    assert "wind_speed_range" in contract and "1048" in contract  # the real defect the walkthrough names
