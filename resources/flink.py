"""Apache Flink as a Dagster resource: launches keel's streaming job (keel/streaming/job.py) in the Flink
environment — the local mini-cluster by default, a remote cluster with ``jobmanager`` — streams its progress into the
run's log and returns its report (rows per sink, events/s, elapsed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parent.parent


class FlinkResource(dg.ConfigurableResource):
    python: str | None = None  # the Flink environment's interpreter; default .venv-flink/bin/python
    parallelism: int = 1
    jobmanager: str | None = None  # host:port of a remote cluster; None: Flink's local mini-cluster
    timeout_s: float = 1800.0

    def interpreter(self) -> Path:
        path = Path(self.python or os.environ.get("KEEL_FLINK_PYTHON") or REPO / ".venv-flink" / "bin" / "python")
        if not path.exists():
            raise dg.Failure(
                f"no Flink environment at {path}: create it with `KEEL_WITH_FLINK=1 scripts/setup` "
                "(apache-flink has its own environment: it pins pandas < 2.3)"
            )
        return path

    def run_job(self, context, args: list[str]) -> dict:
        cmd = [str(self.interpreter()), "-m", "keel.streaming.job", "--parallelism", str(self.parallelism), *args]
        if self.jobmanager:
            cmd += ["--jobmanager", self.jobmanager]
        env = os.environ | {"PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-40:]
            if line.startswith("keel stream:"):
                context.log.info(line.rstrip())
        if proc.wait(timeout=self.timeout_s) != 0:
            raise dg.Failure("the Flink job failed:\n" + "\n".join(tail[-25:]))
        return json.loads(tail[-1])
