"""Rollback: put the previous release back in service and say so in the ledger.

``rollback`` reads the ledger: the live release is the last entry, the previous release the newest earlier entry
with another release id. It deploys that release's model (its registry version, hash-verified on load) as the
champion with a hot swap — the release being replaced stays loaded as the breaker's fallback — makes it the
registry's champion again, and appends a revert entry pointing at the earlier one. Nothing is rewritten.
Used by the `keel rollback` command and the Dagster `rollback` job, with any ``ModelDeployer`` (Triton's, or the
named fake in unit tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from keel.deploy.plan import coarse_target, served_interval
from keel.deploy.routing import DeployReport, ModelDeployer, Route, Target
from keel.errors import KeelError
from keel.ledger import Ledger, LedgerEntry
from keel.registry import ModelRegistry


class RollbackError(KeelError):
    """There is nothing to roll back to, or the release to restore is not in the registry."""


@dataclass(frozen=True)
class RollbackResult:
    replaced: LedgerEntry
    restored: LedgerEntry  # the new (revert) entry
    report: DeployReport


def previous_release(ledger: Ledger, of_model=None) -> tuple[LedgerEntry, LedgerEntry]:
    """(live entry, the entry to restore) among the entries ``of_model(entry)`` keeps — one model's releases when
    several models share the ledger (every entry when None)."""
    log = [e for e in ledger.log() if of_model is None or of_model(e)]
    if not log:
        raise RollbackError("the ledger is empty: nothing is live, nothing to roll back to")
    live = log[-1]
    for entry in reversed(log[:-1]):
        if entry.release_id != live.release_id:
            return live, entry
    raise RollbackError(f"release {live.release_id} is the only release in the ledger: nothing to roll back to")


def _model_sha(entry: LedgerEntry) -> str | None:
    model = entry.manifest.get("model")
    return model.get("parts", {}).get("sha256") if isinstance(model, dict) else None


def rollback(
    registry: ModelRegistry, ledger: Ledger, deployer: ModelDeployer, model: str, reason: str, live_from=None
) -> RollbackResult:
    shas = {registry.sha_of_version(model, v) for v in registry.versions(model)}
    live, target = previous_release(ledger, lambda e: _model_sha(e) in shas)  # this model's releases only
    sha, live_sha = _model_sha(target), _model_sha(live)
    if not sha:
        raise RollbackError(f"ledger entry {target.seq} ({target.release_id}) names no model sha256")
    version = registry.version(model, sha)
    text = registry.load(sha)  # verifies the hash: a corrupt file stops the rollback before anything changes
    interval = served_interval(registry, model, sha)
    champion = Target(Route("champion", version, sha, 1.0, target.release_id, interval), text,
                      {"registry_version": version})  # fmt: skip
    fallback = None
    if live_sha and live_sha != sha:
        live_version = registry.version(model, live_sha)
        fallback = Target(
            Route(
                "fallback", live_version, live_sha, 0.0, live.release_id, served_interval(registry, model, live_sha)
            ),
            registry.load(live_sha),
            {"registry_version": live_version},
        )
    coarse = coarse_target(registry, model, sha, target.release_id)
    report = deployer.deploy(model, [champion], fallback=fallback, coarse=coarse)
    registry.promote(model, sha, f"rollback from {live.release_id}: {reason}")
    restored = ledger.revert(target.seq, reason, live_from)  # the model's use case's now in a live replay
    return RollbackResult(live, restored, report)
