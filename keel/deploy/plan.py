"""What a deployment serves, and the release it records — decided here, as values; done by any ``ModelDeployer``.

``plan_deployment`` reads the policy store's state and the registry: the champion at full weight, a running canary's
challenger at its step's share (else the registry's challenger at weight 0, reachable through experiments — only
one a gate passed: ``keel.registry.passed_a_gate``), every
arm of a live experiment, and the archived champion as the circuit breaker's fallback. ``release`` turns a plan into
the release manifest (data, model, infra, policy parts), deploys it and appends it to the ledger unless it is the
live release already. The ``model_deployment`` asset and the tests (against ``FakeDeployer``, no Triton) call them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from keel.canary_plan import FINISHED
from keel.deploy.routing import DeployReport, ModelDeployer, Route, Target
from keel.intervals import Interval
from keel.ledger import Ledger, LedgerEntry, model_line
from keel.metering.cost import cost_policy
from keel.registry import ModelRegistry, RegisteredModel, coarse_name, passed_a_gate
from keel.release import release_manifest

CHALLENGER_WEIGHT = 0.0  # a challenger is loaded and reachable through experiments; canaries set real weights


@dataclass(frozen=True)
class RunningCanary:
    """A canary rollout of the model that is not finished: its challenger stays deployed at its step's share."""

    name: str
    version: int  # the store version that last set the canary policy
    status: str  # not started | running | paused
    challenger_version: int
    challenger_share: float  # from the canary's split policy (0 before the first step)


def running_canary(state: dict, model: str) -> RunningCanary | None:
    """The newest unfinished canary policy of ``model`` in a policy-store state (name → Policy), or None."""
    found = None
    for name, p in state.items():
        if p.type != "canary" or p.body.get("model") != model:
            continue
        status = (p.body.get("state") or {}).get("status", "not started")
        if status in FINISHED or (found and found.version > p.version):
            continue
        split = state.get(f"{name}.split")
        share = 0.0
        if split is not None and split.type == "ab_test":
            share = sum(
                float(v["weight"])
                for v in split.body["variants"]
                if int(v["version"]) == int(p.body["challenger_version"])
            )
        found = RunningCanary(name, p.version, status, int(p.body["challenger_version"]), share)
    return found


def live_experiment_versions(state: dict, model: str) -> list[int]:
    """Model versions of the running or paused experiments of ``model`` (ab_test policies with an experiment)."""
    out: set[int] = set()
    for p in state.values():
        meta = p.body.get("experiment") if p.type == "ab_test" else None
        if meta and meta.get("status") in ("running", "paused") and p.body.get("model") == model:
            out |= {int(v["version"]) for v in p.body["variants"]}
    return sorted(out)


@dataclass(frozen=True)
class DeploymentPlan:
    model: str
    targets: tuple[Target, ...]
    fallback: Target | None
    data_parts: dict[str, Any]
    model_parts: dict[str, Any]
    canary: RunningCanary | None
    store_version: int
    # The price table in force (the cost policy: name, the version that set it, its body's sha256), so that "what
    # did serving cost at time T, and why" is answered from the release live at T. None: no price table yet.
    prices: dict[str, Any] | None = None
    coarse: Target | None = None  # the champion's coarse model (keel/training/coarse.py), when it has one

    def routes(self) -> list[dict[str, Any]]:
        return [{"name": t.route.name, "version": t.route.version, "weight": t.route.weight} for t in self.targets]


def served_interval(registry: ModelRegistry, model: str, sha256: str) -> tuple[float, float, float | None] | None:
    """(coverage, half-width, the label's spread) of the prediction interval in a version's registry record, which its
    route carries to the gateway (a regression's answers; keel/intervals.py); None for a binary model."""
    interval = Interval.from_metadata(registry.get(model, sha256).metadata)
    return (interval.coverage, interval.half_width, interval.label_spread) if interval else None


def coarse_target(registry: ModelRegistry, model: str, sha256: str, release_id: str | None = None) -> Target | None:
    """The coarse model linked from the registry record of ``model``'s version ``sha256`` (``coarse_sha256``, set
    when it passed its gate), as a deployment target of release ``release_id``; None when it has none."""
    coarse_sha = registry.get(model, sha256).metadata.get("coarse_sha256")
    if not coarse_sha:
        return None
    name = coarse_name(model)
    version = registry.version(name, coarse_sha)
    route = Route("coarse", version, coarse_sha, 0.0, release_id, served_interval(registry, name, coarse_sha))
    return Target(route, registry.load(coarse_sha),
                  {"registry_version": version, "coarse_of": sha256})  # fmt: skip


class NoChampionError(LookupError):
    """The registry has no champion of the model: nothing to deploy."""


def plan_deployment(
    state: dict, store_version: int, registry: ModelRegistry, model: str, promotion: dict[str, Any]
) -> DeploymentPlan:
    """The targets to serve now. ``promotion`` is the latest release manifest model_promotion wrote: its data and
    model parts describe the champion unless a canary has since promoted another version."""
    champion = registry.alias(model, "champion")
    if champion is None:
        raise NoChampionError(f"no champion of {model} in the registry: model_promotion has not promoted one")
    challenger = registry.alias(model, "challenger")
    archived = registry.alias(model, "archived")
    canary = running_canary(state, model)

    def target(sha: str, name: str, weight: float) -> Target:
        version = registry.version(model, sha)
        route = Route(name, version, sha, weight, None, served_interval(registry, model, sha))
        return Target(route, registry.load(sha), {"registry_version": version})

    data_parts, model_parts = promotion["data"]["parts"], promotion["model"]["parts"]
    if model_parts.get("sha256") != champion:  # a canary promoted another version: describe that one
        data_parts, model_parts = parts_of(registry.get(model, champion))
    share = canary.challenger_share if canary else 0.0
    targets = [target(champion, "champion", 1.0 - share)]
    canary_sha = registry.sha_of_version(model, canary.challenger_version) if canary else None
    if canary_sha and canary_sha != champion:  # a rollout in progress: its challenger at its step's share
        targets.append(target(canary_sha, "challenger", share))
    elif challenger and challenger != champion and passed_a_gate(registry.get(model, challenger).metadata):
        targets.append(target(challenger, "challenger", CHALLENGER_WEIGHT))  # never one no gate passed
    for version in live_experiment_versions(state, model):  # a live experiment's arms must be served
        if version not in {t.route.version for t in targets}:
            targets.append(target(registry.sha_of_version(model, version), f"experiment-v{version}", 0.0))
    fallback = target(archived, "fallback", 0.0) if archived and archived != champion else None
    return DeploymentPlan(
        model,
        tuple(targets),
        fallback,
        data_parts,
        model_parts,
        canary,
        store_version,
        price_table(state),
        coarse_target(registry, model, champion),
    )


def price_table(state: dict) -> dict[str, Any] | None:
    """The release manifest's entry for the cost policy in force (the first by name, as gateways pick it)."""
    cost = cost_policy(state)
    if cost is None:
        return None
    return {
        "name": cost.name,
        "version": cost.version,
        "currency": cost.body.get("currency"),
        "sha256": _sha(cost.body),
    }


def training_asset(model: str) -> str:
    """The asset that trains ``model``: its use case's declaration (keel/usecase.py), under the use case's prefix."""
    from keel.usecase import by_model

    return by_model(model).training_asset


def parts_of(record: RegisteredModel) -> tuple[dict, dict]:
    """A release's data and model parts from a registered model's metadata (what model_promotion would write)."""
    meta = record.metadata
    data = {**(meta.get("data_versions") or {}), "contracts": meta.get("contracts")}
    model = {
        "sha256": record.sha256,
        "asset": training_asset(record.name),
        "training_code": meta.get("training_code_version"),
        "feature_code": meta.get("feature_code_version"),
        "params": meta.get("params"),
    }
    return data, model


def _sha(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Release:
    manifest: dict[str, Any]
    report: DeployReport
    entry: LedgerEntry  # the ledger entry of this release (an existing one when it was live already)


def release(
    plan: DeploymentPlan,
    deployer: ModelDeployer,
    ledger: Ledger,
    infra: dict[str, Any],
    gateway_policy: dict,
    live_from: datetime | None = None,
) -> Release:
    """Deploy ``plan`` and record it: the manifest's policy part covers the routes, the gateway's policy version
    and breaker, the store version and the canary; a release identical to the live one adds no ledger entry.
    ``live_from``: when it went live (default now; a live replay passes its simulated now)."""
    c = plan.canary
    policy = {
        "routing": _sha(
            {"routes": plan.routes(), "fallback": plan.fallback.route.version if plan.fallback else None}
            | ({"coarse": plan.coarse.route.sha256} if plan.coarse else {})  # (a release without one: as before)
        ),
        "gateway": gateway_policy.get("version"),
        "circuit_breaker": _sha(gateway_policy.get("breaker")),
        "store_version": plan.store_version,  # the policy store's version: canary state, split, breaker, limits
        "canary": {"name": c.name, "version": c.version, "status": c.status} if c else None,
        "prices": plan.prices,
    }
    manifest = release_manifest(data=plan.data_parts, model=plan.model_parts, infra=infra, policy=policy)
    release_id = manifest["release_id"]
    targets = [replace(t, route=replace(t.route, release_id=release_id)) for t in plan.targets]
    coarse = replace(plan.coarse, route=replace(plan.coarse.route, release_id=release_id)) if plan.coarse else None
    report = deployer.deploy(plan.model, targets, fallback=plan.fallback, coarse=coarse)
    log = ledger.of_line(model_line(manifest))  # this model's releases (the ledger holds every model's)
    live = log[-1] if log else None
    entry = live if live and live.release_id == release_id else ledger.append(release_id, manifest, live_from)
    return Release(manifest, report, entry)
