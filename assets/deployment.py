"""The deployment: the registry's champion (and challenger) served by Triton behind the gateway, and the release
appended to the ledger — the moment a release goes live."""

import hashlib
import json
from dataclasses import replace

import dagster as dg

from assets.models import MODEL_NAME, MODEL_PROMOTION
from gpu_runtime.deploy import Route, Target
from keel.features.definitions import FEATURE_NAMES
from keel.release import infra_snapshot, release_manifest
from resources.ledger import LedgerResource
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
    "the ledger. Needs the model runtime running (`python -m gpu_runtime.serve`; scripts/up starts it).",
)
def model_deployment(
    context: dg.AssetExecutionContext,
    registry: ModelRegistryResource,
    triton: TritonResource,
    ledger: LedgerResource,
) -> dg.MaterializeResult:
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
        targets = [target(champion, "champion", 1.0, None)]
        if challenger and challenger != champion:
            targets.append(target(challenger, "challenger", CHALLENGER_WEIGHT, None))
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
        "canary": None,  # the control-plane work versions canary policies
    }
    manifest = release_manifest(
        data=promotion["data"]["parts"], model=promotion["model"]["parts"], infra=infra, policy=policy
    )
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
        }
    )


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
    from gpu_runtime.rollback import rollback

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
