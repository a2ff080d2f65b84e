"""How a gateway follows what it serves and under which policy: the routing table file (a deployment writes it) and
the versioned policy store (``keel.policies``), both polled — a new routing generation is in force within
``routing_poll_s``, a committed policy within ``POLICY_POLL_S``.

A mixin of ``Gateway`` (gpu_runtime/gateway/app.py), which owns the state it reads and sets: ``config``,
``routing``, ``policy``/``base_policy``/``split``/``policy_version``, the breakers, buckets and retry budget that a
new policy re-parameterizes, and ``metrics``.
"""

from __future__ import annotations

import time

from keel.deploy.routing import RoutingTable
from keel.policies.gateway import PolicyError, effective_policy

POLICY_POLL_S = 0.5  # a committed policy is in force within this (plus one request) — under the 1 s promise


class FollowsRoutingAndPolicies:
    def reload_routing(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._routing_checked < self.policy.routing_poll_s:
            return
        self._routing_checked = now
        try:
            mtime = self.config.routing_path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if force or mtime != self._routing_mtime:
            table = RoutingTable.read(self.config.routing_path)
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
            self._routing_mtime = mtime

    def reload_policies(self, force: bool = False) -> None:
        """Follow the policy store: a newer version is validated again and applied; an invalid one is refused and
        the last good policy stays (counted in keel_gateway_policy_rejected_total)."""
        now = time.monotonic()
        if self._policy_reader is None or (not force and now - self._policy_checked < POLICY_POLL_S):
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
        except (PolicyError, KeyError, TypeError, ValueError) as exc:
            self.metrics.inc("keel_gateway_policy_rejected_total", {"version": str(latest)})
            self.policy_error = f"policy version {latest} refused: {exc}"
            return
        self.policy, self.split, self.policy_version = policy, split, latest
        self.policy_error, self.policy_notes = None, notes
        self._apply_metering_policies(state)  # prices and budgets (metering.py)
        for b in self.breakers.values():
            b.policy = policy.breaker
        self.buckets.clear()  # new limits apply from the next request
        self.other_buckets.clear()
        self.retry_budget.policy = policy.retry
        self.metrics.set_gauge("keel_gateway_policy_version", {}, latest)
