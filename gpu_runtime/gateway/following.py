"""How a gateway follows what it serves and under which policy: the routing table file (a deployment writes it) and
the versioned policy store (``keel.policies``) — a new routing generation is in force within ``routing_poll_s``, a
committed policy within ``POLICY_POLL_S`` (polled). A store on Postgres is also *listened to*: each commit notifies
its version when it commits and the watcher applies it at once (``keel_gateway_policy_notifications_total``); while
the listening connection is up the poll slows to ``SAFETY_POLL_S``, and when it drops the gateway polls every
``POLICY_POLL_S`` again and tries to listen anew every ``LISTEN_RETRY_S`` (gauge ``keel_gateway_policy_listening``,
counter ``keel_gateway_policy_listen_drops_total``).

``Follower`` does it for one served model (model.py): it holds the routing table and the policy in force and tells
its owner of a new one (``on_routing``, ``on_policy``), which re-parameterizes breakers, buckets and budgets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.deploy.routing import RoutingTable
from keel.policies import PolicyReader
from keel.policies.gateway import GatewayPolicy, PolicyError, Split, effective_policy, live_experiments
from keel.sqldb import PgLocation
from keel.tenants import Tenant, TenantError

POLICY_POLL_S = 0.5  # a committed policy is in force within this (plus one request) — under the 1 s promise
SAFETY_POLL_S = 5.0  # the poll while notifications arrive (they carry the pickup; the poll catches a lost one)
LISTEN_RETRY_S = 2.0  # how often a gateway whose listening connection dropped tries again


class Follower:
    def __init__(
        self, routing_path: Path, policy_store: Path | PgLocation | None, base_policy: GatewayPolicy, metrics: Any,
        on_routing: Callable[[RoutingTable], None] = lambda table: None,
        on_policy: Callable[[GatewayPolicy, dict[str, Any]], None] = lambda policy, state: None,
    ):  # fmt: skip
        self.routing_path = routing_path
        self.metrics = metrics
        self.on_routing, self.on_policy = on_routing, on_policy
        self.base_policy = base_policy  # the file's (or built-in) settings; the store overrides them
        self.policy = base_policy
        self.policy_version = 0  # the store version in force (0: none)
        self.split: Split | None = None  # the store's ab_test split in force: weights by model version, salt
        # The store's live experiments on the model, by id: (variant, version, weight) arms (x-experiment-id routing)
        self.experiments: dict[str, tuple[tuple[str, int, float], ...]] = {}
        self.policy_applied_at: float | None = None
        self.policy_error: str | None = None  # why the newest store version was refused
        self.policy_regressed_to: int | None = None  # the store's version when it went below the applied one
        self.policy_notes: list[str] = []  # what of the policy in force is not applied (a split to undeployed ones)
        # The tenants in force (their tiers and risk levels), by name; None while no store is followed (a gateway with
        # no store has no tenant in force: the edge's check is the only one)
        self.tenants: dict[str, Tenant] | None = {} if policy_store else None
        self.routing: RoutingTable | None = None
        self._routing_mtime = 0
        self._routing_checked = 0.0
        self._policy_seen = 0  # the newest store version looked at, good or not
        self._policy_checked = 0.0
        self._policy_reader = PolicyReader(policy_store) if policy_store else None
        self._policy_wake = asyncio.Event()  # set when the store announces a commit
        self._listen_retry_at = 0.0

    @property
    def reader(self) -> PolicyReader | None:
        return self._policy_reader

    def close(self) -> None:
        if self._policy_reader is not None:
            self._policy_reader.close()

    def fresh_table(self) -> RoutingTable | None:
        """The routing table as the file has it now (after a failure: a swap may have retired a version)."""
        self.reload_routing(force=True)
        return self.routing

    def reload_routing(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._routing_checked < self.policy.routing_poll_s:
            return
        self._routing_checked = now
        try:
            mtime = self.routing_path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if force or mtime != self._routing_mtime:
            table = RoutingTable.read(self.routing_path)
            if table is not None and (self.routing is None or table.generation >= self.routing.generation):
                if (
                    self.routing is None
                    or table.versions() != self.routing.versions()
                    or table.model != self.routing.model
                ):
                    self._policy_seen, self._policy_checked = (
                        0,
                        0.0,
                    )  # a split may apply (or not) to what is served now
                self.routing = table
                self.metrics.set_gauge("keel_gateway_routing_generation", {}, table.generation)
                self.on_routing(table)  # e.g. its coarse model read now, not when the first request needs it
            self._routing_mtime = mtime

    def reload_policies(self, force: bool = False) -> None:
        """Follow the policy store: a newer version is validated again and applied; an invalid one is refused and
        the last good policy stays (counted in keel_gateway_policy_rejected_total)."""
        now = time.monotonic()
        reader = self._policy_reader
        interval = SAFETY_POLL_S if reader is not None and reader.listening else POLICY_POLL_S
        if reader is None or (not force and now - self._policy_checked < interval):
            return
        self._policy_checked = now
        latest = self._policy_reader.version()
        if latest < self.policy_version:
            # The store lost versions this gateway already applied (newest entries removed, or an older copy put
            # back): keep the last good policy and say so, never follow the store backwards.
            if self.policy_regressed_to != latest:
                self.metrics.inc("keel_gateway_policy_store_regressions_total", {})
                self.policy_regressed_to = latest
            self.metrics.set_gauge("keel_gateway_policy_store_version", {}, latest)
            self.policy_error = (
                f"the policy store went back from version {self.policy_version} to {latest} (newest versions "
                f"removed?): refused, version {self.policy_version} stays in force; run `keel policy verify`"
            )
            return
        self.policy_regressed_to = None
        if latest <= self._policy_seen:
            return
        self._policy_seen = latest
        table = self.routing
        try:
            state = self._policy_reader.state(latest)
            policy, split, notes = effective_policy(
                self.base_policy,
                state,
                table.model if table else None,
                set(table.versions()) if table else set(),
                latest,
            )
            tenants = {p.name: Tenant.from_body(p.name, p.body) for p in state.values() if p.type == "tenant"}
        except (PolicyError, TenantError, KeyError, TypeError, ValueError) as exc:
            self.metrics.inc("keel_gateway_policy_rejected_total", {"version": str(latest)})
            self.policy_error = f"policy version {latest} refused: {exc}"
            return
        self.policy, self.split, self.policy_version = policy, split, latest
        self.experiments = live_experiments(state, table.model if table else None)
        self.tenants = tenants
        self.policy_applied_at = time.time()  # when this version came into force here (/healthz)
        self.policy_error, self.policy_notes = None, notes
        self.on_policy(policy, state)  # breakers, buckets, retries, prices and budgets
        self.metrics.set_gauge("keel_gateway_policy_version", {}, latest)

    # -- notifications (a policy store on Postgres) --

    def listen_for_policies(self) -> None:
        """From the watcher: start listening when the store can notify and no connection listens (at most every
        LISTEN_RETRY_S); the event loop then wakes the watcher on each commit."""
        reader = self._policy_reader
        if reader is None or not reader.postgres or reader.listening:
            return
        now = time.monotonic()
        if now < self._listen_retry_at:
            return
        fd = reader.listen()
        if fd is None:
            self._listen_retry_at = now + LISTEN_RETRY_S
            self.metrics.set_gauge("keel_gateway_policy_listening", {}, 0)
            return
        asyncio.get_running_loop().add_reader(fd, self._on_policy_notification, fd)
        self.metrics.set_gauge("keel_gateway_policy_listening", {}, 1)
        self._policy_wake.set()  # look once now: a commit may have landed before LISTEN

    def _on_policy_notification(self, fd: int) -> None:
        reader = self._policy_reader
        if reader.notified():
            self.metrics.inc("keel_gateway_policy_notifications_total", {})
            self._policy_wake.set()
        if not reader.listening:  # the connection dropped: poll every POLICY_POLL_S, listen again later
            asyncio.get_running_loop().remove_reader(fd)
            self.metrics.set_gauge("keel_gateway_policy_listening", {}, 0)
            self.metrics.inc("keel_gateway_policy_listen_drops_total", {})
            self._listen_retry_at = time.monotonic() + LISTEN_RETRY_S

    async def wait_for_policy_change(self, timeout: float) -> None:
        """Sleep ``timeout``, or less when a commit is announced — then apply it at once."""
        try:
            await asyncio.wait_for(self._policy_wake.wait(), timeout)
        except TimeoutError:
            return
        self._policy_wake.clear()
        self.reload_policies(force=True)
