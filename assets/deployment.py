"""The deployment: the registry's champion (and challenger) served by Triton behind the gateway, and the release
appended to the ledger — the moment a release goes live."""

import hashlib
import json
from dataclasses import dataclass, replace

import dagster as dg

from assets.models import DELAY_MODEL, MODEL_NAME, MODEL_PROMOTION
from keel.deploy.routing import Route, Target
from keel.features.definitions import FEATURE_NAMES
from keel.policies import PolicyError
from keel.release import infra_snapshot, release_manifest
from resources.ledger import LedgerResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from resources.triton import TritonResource

DEPLOYMENTS_GROUP = "deployments"
MODEL_DEPLOYMENT = dg.AssetKey("model_deployment")
CHALLENGER_WEIGHT = 0.0  # a challenger is loaded and reachable through experiments; canaries set real weights


def _sha(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dg.asset(
    key=MODEL_DEPLOYMENT,
    group_name=DEPLOYMENTS_GROUP,
    kinds={"triton", "deployment"},
    deps=[MODEL_PROMOTION],
    description="Publishes the registry's champion — and the challenger and the previous champion (as the "
    "circuit breaker's fallback) when there are — to Triton with a hot swap (load, warm, switch the gateway's "
    "routing, unload the old), then appends the release (data, model, infra with the Triton version, policy) to "
    "the ledger. While a canary rollout runs (policy store), its challenger is deployed at the share of its current "
    "step, and a run launched by the canary sensor shows the decision and its evidence. Needs the model runtime "
    "running (`python -m gpu_runtime.serve`; scripts/up starts it).",
)
def model_deployment(
    context: dg.AssetExecutionContext,
    registry: ModelRegistryResource,
    triton: TritonResource,
    ledger: LedgerResource,
    policies: PolicyStoreResource,
) -> dg.MaterializeResult:
    store = policies.open()
    try:
        canary = running_canary(store.state(), MODEL_NAME)
        experiment_versions = live_experiment_versions(store.state(), MODEL_NAME)
        store_version = store.version()
        decision = _decision(store, context.run.tags.get("keel/policy_version"))
    finally:
        store.close()
    reg = registry.open()
    try:
        champion = reg.alias(MODEL_NAME, "champion")
        if champion is None:
            raise dg.Failure(f"no champion of {MODEL_NAME} in the registry: model_promotion has not promoted one")
        challenger = reg.alias(MODEL_NAME, "challenger")
        archived = reg.alias(MODEL_NAME, "archived")

        def target(sha: str, name: str, weight: float, release_id: str | None) -> Target:
            version = reg.version(MODEL_NAME, sha)
            return Target(Route(name, version, sha, weight, release_id), reg.load(sha), {"registry_version": version})

        promotion = _latest_manifest(context)
        data_parts, model_parts = promotion["data"]["parts"], promotion["model"]["parts"]
        if model_parts.get("sha256") != champion:  # a canary promoted another version: describe that one
            data_parts, model_parts = _parts_of(reg.get(MODEL_NAME, champion))
        share = canary.challenger_share if canary else 0.0
        targets = [target(champion, "champion", 1.0 - share, None)]
        canary_sha = reg.sha_of_version(MODEL_NAME, canary.challenger_version) if canary else None
        if canary_sha and canary_sha != champion:  # a rollout in progress: its challenger at its step's share
            targets.append(target(canary_sha, "challenger", share, None))
        elif challenger and challenger != champion:
            targets.append(target(challenger, "challenger", CHALLENGER_WEIGHT, None))
        for version in experiment_versions:  # a live experiment's arms must be served; its split sets the traffic
            if version not in {t.route.version for t in targets}:
                targets.append(target(reg.sha_of_version(MODEL_NAME, version), f"experiment-v{version}", 0.0, None))
        fallback = target(archived, "fallback", 0.0, None) if archived and archived != champion else None
    finally:
        reg.close()

    endpoints = triton.endpoints()
    control = triton.control()
    gateway_policy = endpoints.get("policy") or {}
    routes = [{"name": t.route.name, "version": t.route.version, "weight": t.route.weight} for t in targets]
    infra = infra_snapshot() | {"triton": control.server_version(), "triton_dist": endpoints.get("triton_version")}
    policy = {
        "routing": _sha({"routes": routes, "fallback": fallback.route.version if fallback else None}),
        "gateway": gateway_policy.get("version"),
        "circuit_breaker": _sha(gateway_policy.get("breaker")),
        "store_version": store_version,  # the policy store's version: canary state, split, breaker, limits
        "canary": {"name": canary.name, "version": canary.version, "status": canary.status} if canary else None,
    }
    manifest = release_manifest(data=data_parts, model=model_parts, infra=infra, policy=policy)
    release_id = manifest["release_id"]
    targets = [replace(t, route=replace(t.route, release_id=release_id)) for t in targets]
    report = triton.deployer(len(FEATURE_NAMES), control=control).deploy(MODEL_NAME, targets, fallback=fallback)
    context.log.info(
        f"deployed {MODEL_NAME}: routing generation {report.generation}, loaded {list(report.loaded)}, "
        f"unloaded {list(report.unloaded)}, cold starts {report.cold_start_s}"
    )
    led = ledger.open()
    try:
        log = led.log()
        current = log[-1] if log else None
        entry = current if current and current.release_id == release_id else led.append(release_id, manifest)
    finally:
        led.close()
    return dg.MaterializeResult(
        metadata={
            "release_id": release_id,
            "ledger_seq": entry.seq,
            "routing_generation": report.generation,
            "routes": dg.MetadataValue.json(routes),
            "fallback_version": fallback.route.version if fallback else -1,
            "loaded_versions": dg.MetadataValue.json(list(report.loaded)),
            "unloaded_versions": dg.MetadataValue.json(list(report.unloaded)),
            "cold_start_ms": dg.MetadataValue.json(
                {str(k): round(v * 1000, 1) for k, v in report.cold_start_s.items()}
            ),
            "gateway": f"http://{endpoints['gateway']}",
            "manifest": dg.MetadataValue.json(manifest),
            "policy_store_version": store_version,
            **_canary_metadata(canary, decision),
        }
    )


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
    from keel.canary import FINISHED

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


def _decision(store, version: str | None) -> dict | None:
    """The canary decision a run was launched for: the commit's reason is its evidence (JSON)."""
    if not version:
        return None
    try:
        return json.loads(store.commit(int(version)).reason)
    except (ValueError, KeyError, PolicyError):
        return None


def _canary_metadata(canary: RunningCanary | None, decision: dict | None) -> dict:
    out: dict = {}
    if canary:
        out |= {"canary": canary.name, "canary_status": canary.status, "challenger_share": canary.challenger_share}
    if decision:
        out |= {
            "canary_action": decision.get("action", ""),
            "canary_percent": float(decision.get("percent") or 0.0),
            "canary_reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in decision.get("reasons", []))),
            "canary_evidence": dg.MetadataValue.json(decision.get("evidence") or {}),
        }
    return out


def _parts_of(record) -> tuple[dict, dict]:
    """A release's data and model parts from a registered model's metadata (what model_promotion would write)."""
    meta = record.metadata
    data = {**(meta.get("data_versions") or {}), "contracts": meta.get("contracts")}
    model = {
        "sha256": record.sha256,
        "asset": DELAY_MODEL.to_user_string(),
        "training_code": meta.get("training_code_version"),
        "feature_code": meta.get("feature_code_version"),
        "params": meta.get("params"),
    }
    return data, model


def _latest_manifest(context: dg.AssetExecutionContext) -> dict:
    records = context.instance.fetch_materializations(MODEL_PROMOTION, limit=1).records
    if not records:
        raise dg.Failure("model_promotion has never been materialized: nothing to deploy")
    return records[0].asset_materialization.metadata["manifest"].value


deployment_assets = [model_deployment]


@dg.op(
    description="Restores the previous release from the ledger: its model back in Triton as champion (hot swap), "
    "the registry's champion alias, and a revert entry in the ledger.",
    config_schema={
        "reason": dg.Field(str, default_value="rollback requested"),
        "model": dg.Field(str, default_value=MODEL_NAME),
    },
)
def rollback_op(
    context: dg.OpExecutionContext, registry: ModelRegistryResource, triton: TritonResource, ledger: LedgerResource
) -> None:
    from keel.rollback import rollback

    reg, led = registry.open(), ledger.open()
    try:
        result = rollback(
            reg, led, triton.deployer(len(FEATURE_NAMES)), context.op_config["model"], context.op_config["reason"]
        )
    finally:
        reg.close()
        led.close()
    context.log.info(f"rolled back {result.replaced.release_id} → {result.restored.release_id}")
    context.log_event(
        dg.AssetMaterialization(
            MODEL_DEPLOYMENT,
            description=f"rollback: {context.op_config['reason']}",
            metadata={
                "release_id": result.restored.release_id,
                "ledger_seq": result.restored.seq,
                "reverts": result.restored.reverts or -1,
                "replaced_release": result.replaced.release_id,
                "routing_generation": result.report.generation,
            },
        )
    )


@dg.job(description="Roll back to the previous release (the ledger's), as `keel rollback` does from a shell.")
def rollback_job():
    rollback_op()
