"""Keeping Triton alive: notice it died, restart it on the same ports, load again what the routing table serves.

``TritonSupervisor`` watches one ``TritonServer`` from a thread of the serving process (``python -m
gpu_runtime.serve``). Every ``poll_s`` it looks at the process and its liveness endpoint; when Triton is gone it
marks the runtime down — the gateway then answers ``runtime_unavailable`` (503, or the policy's last-resort score
flagged as such; never a bare 500) and /healthz and /readyz say so — restarts it with a growing back-off, and loads
every version the routing table routes to (``restore_routed``) before marking it up again. The same restore runs
when the runtime starts on an existing KEEL_HOME, so a crash or a reboot does not leave deployed models unserved
until the next deployment.

Maintenance: while the file ``hold`` exists in Triton's work directory ($KEEL_HOME/serving/triton/hold), the
supervisor reports the runtime down but does not restart it — an operator can stop Triton without it coming back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_runtime.process import hold_priority
from gpu_runtime.repository import ModelRepository, triton_name
from gpu_runtime.triton import TritonControl, TritonError, TritonServer
from keel.deploy.routing import RoutingTable

UP, DOWN, RESTARTING = "up", "down", "restarting"


@dataclass
class RuntimeStatus:
    """What the gateway reads about the model runtime (written by the supervisor's thread)."""

    state: str = UP
    restarts: int = 0
    since: float = field(default_factory=time.time)
    last_failure: str | None = None
    restored_versions: list[int] = field(default_factory=list)
    admin_key_hidden: bool = True
    # Whether the tritonserver process is still there, asked by the gateway when a Triton call fails: a request that
    # meets the crash before the next poll is answered runtime_unavailable too, not backend_error.
    process_alive: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    @property
    def up(self) -> bool:
        return self.state == UP

    def died(self) -> bool:
        """Up by the last poll, but the process has exited since (the poll has not seen it yet)."""
        return self.process_alive is not None and not self.process_alive()

    def as_dict(self) -> dict:
        return {
            "state": self.state,
            "since": self.since,
            "restarts": self.restarts,
            "last_failure": self.last_failure,
            "restored_versions": self.restored_versions,
            "admin_key_hidden": self.admin_key_hidden,
        }


def restore_routed(control: TritonControl, repository: ModelRepository, routing: Path, timeout_s: float = 60):
    """Load every version a routing table routes to, with the configuration it was deployed with (kept in the
    model repository). ``routing``: one table, or the folder of every served model's tables (``routing/``).
    Returns the versions loaded; raises TritonError naming the one that would not load."""
    routing = Path(routing)
    if routing.is_dir():
        return [v for table in sorted(routing.glob("*.json")) for v in restore_routed(control, repository, table)]
    table = RoutingTable.read(routing)
    if table is None:
        return []
    loaded = []
    for version in table.versions():
        config = repository.loaded_config(table.model, version)
        if config is None:
            raise TritonError(
                f"{table.model} version {version} is routed but has no configuration in {repository.root}"
            )
        control.load(config["name"], config)
        deadline = time.monotonic() + timeout_s
        while not control.ready(triton_name(table.model, version), version):
            if time.monotonic() > deadline:
                raise TritonError(f"{table.model} version {version} not ready {timeout_s:.0f} s after its reload")
            time.sleep(0.05)
        loaded.append(version)
    return loaded


class TritonSupervisor:
    def __init__(
        self,
        server: TritonServer,
        routing_path: Path,
        *,
        poll_s: float = 0.5,
        max_backoff_s: float = 30.0,
        log=print,
        incidents: Path | None = None,
        clock: Path | None = None,
    ):
        self.server, self.routing_path = server, Path(routing_path)
        self.incidents, self.clock = incidents, clock  # where a crash is recorded, on which clock (KEEL_HOME's)
        self.poll_s, self.max_backoff_s, self.log = poll_s, max_backoff_s, log
        self.status = RuntimeStatus(admin_key_hidden=server.admin_key_hidden, process_alive=self._process_alive)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TritonSupervisor:
        self._thread = threading.Thread(target=self._run, name="triton-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _process_alive(self) -> bool:
        proc = self.server.proc
        return proc is not None and proc.poll() is None

    def _alive(self) -> bool:
        proc = self.server.proc
        return proc is not None and proc.poll() is None and self.server.live()

    def _run(self) -> None:
        misses = 0
        while not self._stop.wait(self.poll_s):
            if self._alive():
                misses = 0
                hold_priority(self.server.proc.pid)  # a model load starts instance threads at Triton's own nice
                continue
            misses += 1
            exited = self.server.proc is not None and self.server.proc.poll() is not None
            if not exited and misses < 3:  # a slow liveness answer under load is not a death: look again
                continue
            self._recover(exited)
            misses = 0

    def _recover(self, exited: bool) -> None:
        code = self.server.proc.returncode if exited and self.server.proc is not None else None
        why = f"tritonserver exited with {code}" if exited else "tritonserver stopped answering its liveness check"
        self.status.state, self.status.since, self.status.last_failure = DOWN, time.time(), why
        self.log(f"keel serve: {why}; restarting it")
        pid = self.server.proc.pid if self.server.proc is not None else None
        noticed = time.monotonic()
        self._incident(
            pid,
            detected_at=self._now(),
            located=f"the model runtime: {why} (pid {pid}); the gateway answers runtime_unavailable meanwhile",
        )
        backoff = 0.5
        hold = self.server.work_dir / "hold"
        while hold.exists():  # an operator's maintenance hold: stay down, say why
            self.status.last_failure = f"{why}; not restarted: maintenance hold ({hold})"
            if self._stop.wait(self.poll_s):
                return
        while not self._stop.is_set():
            self.status.state = RESTARTING
            try:
                self.server.stop(timeout=5)
                self.server.start()
                control = self.server.client()
                try:
                    restored = restore_routed(control, ModelRepository(self.server.repository), self.routing_path)
                finally:
                    control.close()
            except Exception as exc:  # noqa: BLE001 - keep trying: the gateway answers runtime_unavailable meanwhile
                self.status.state, self.status.last_failure = DOWN, f"{why}; restart failed: {exc}"
                self.log(f"keel serve: Triton restart failed ({exc}); next try in {backoff:.1f} s")
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            self.status.restarts += 1
            self.status.restored_versions = restored
            self.status.admin_key_hidden = self.server.admin_key_hidden
            self.status.state, self.status.since = UP, time.time()
            self.log(f"keel serve: Triton restarted (restart {self.status.restarts}); reloaded versions {restored}")
            now = self._now()
            self._incident(
                pid,
                acted_at=now,
                recovered_at=now,
                action=f"restarted tritonserver (restart {self.status.restarts}) and reloaded the routed versions "
                f"{restored}",
                details={
                    "restored_versions": restored,
                    "new_pid": self.server.proc.pid if self.server.proc else None,
                    "wall_s_to_recover": round(time.monotonic() - noticed, 2),  # noticed → routed versions ready
                },
            )
            return

    def _now(self) -> str:
        from keel.clock import SimClock

        if self.clock is None:
            from datetime import UTC, datetime

            return datetime.now(UTC).isoformat(timespec="seconds")
        return SimClock(self.clock).now().isoformat(timespec="seconds")

    def _incident(self, pid: int | None, **fields) -> None:
        """One incident per crash (keyed by the dead process), its timeline filled in as the restart proceeds. A log
        that cannot be written is said, never a reason not to restart."""
        if self.incidents is None:
            return
        from keel.incidents import IncidentLog

        try:
            with IncidentLog(self.incidents) as log:
                log.open_incident(
                    f"runtime:{pid}", "runtime_crash", "critical", "tritonserver died; restarted by the supervisor",
                    source="triton-supervisor", **fields,
                )  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            self.log(f"keel serve: could not record the incident in {self.incidents}: {exc}")
