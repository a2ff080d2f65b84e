"""The edge following the policy store (``EdgeFollower``): the tenants in force and the served models' tiers become
the edge filter's configuration and Envoy's routes (gpu_runtime/edge.py runs Envoy), a store it cannot read is an
incident after a bound (keel/edge/outage.py), and a flood of the lower tiers holds them to one request in flight
(keel/edge/flood.py). The serving process calls ``tend`` from its loop (gpu_runtime/workers.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from gpu_runtime.edge import EnvoyEdge, edge_filter_module
from keel.alerts import Alert, AlertConfigError, AlertSender
from keel.edge.envoy import EdgeSpec
from keel.edge.flood import REFUSED_COUNTERS, FloodCut, flood_cut_enabled
from keel.edge.outage import RevokedKeys, StoreOutage, outage_bound_s
from keel.home import KeelHome
from keel.incidents import IncidentLog

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

    def __init__(
        self,
        directory: Path,
        port: int,
        workers: list[int],
        models: list[str],
        store,
        token: str,
        limits,
        host: str = "127.0.0.1",
        admin_port: int | None = None,
        base=None,
        peers: tuple[tuple[str, int], ...] = (),
        priority_port: int | None = None,
    ):
        self.dir, self.port, self.workers, self.models = Path(directory), port, tuple(workers), models
        self.store_path, self.token, self.limits, self.host = store, token, limits, host
        self.admin_port, self.base = admin_port, base  # base: the runtime's policy file, under the store's
        self.peers = peers  # other replicas' edges, behind this one's workers
        self.priority_port = priority_port  # L1's own door (keel/edge/door.py)
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
        spec = EdgeSpec(
            port=self.port,
            workers=self.workers,
            models=tiers,
            policy=policy,
            limits=self.limits,
            host=self.host,
            wasm=edge_filter_module(),
            filter_config=edge_filter_config(self.token, tenants, tiers, self.models[0], version),
            tenant_limits=edge_limits(tenants, policy),
            peers=self.peers,
            priority_port=self.priority_port,
        )
        return spec, version, len(tenants)

    def start(self, log) -> EdgeFollower:
        spec, self.version, tenants = self.spec()
        self.edge = EnvoyEdge(self.dir, spec, admin_port=self.admin_port, token=self.token).start()
        log(
            f"keel serve: the edge (Envoy) on {self.edge.url}"
            + (f", L1's own door on {self.edge.priority_url}" if self.edge.priority_url else "")
            + f" in front of workers {list(self.workers)}; admin "
            f"{self.edge.admin_url} (loopback); {tenants} tenant(s) in force at policy version {self.version}"
            + ("" if tenants else " — every request is refused 401 until `keel tenant add`")
        )
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
