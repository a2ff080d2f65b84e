"""A use case's deployment: the registry's champion (and challenger) served by Triton behind the gateway, and the
release appended to the ledger — the moment a release goes live."""

import json
from functools import cache

import dagster as dg

from assets.usecase import wiring
from keel.clock import SimClock
from keel.deploy.plan import NoChampionError, RunningCanary, plan_deployment, release
from keel.faults import fault_metadata
from keel.policies import PolicyError
from keel.release import infra_snapshot
from keel.usecase import UseCase, by_model, installed
from resources import simulated
from resources.home import KeelHomeResource
from resources.ledger import LedgerResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from resources.triton import TritonResource


@cache
def build_deployment_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """``<use case>/model_deployment``: the use case's model put live (after its model_promotion)."""
    w = wiring(uc)
    model_name, n_features = uc.model.name, len(uc.features.names)
    deployment_key, promotion_key = w.key("model_deployment"), w.key("model_promotion")

    @dg.asset(
        key=deployment_key,
        group_name=w.group("deployments"),
        kinds={"triton", "deployment"},
        deps=[promotion_key],
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
        keel_home: KeelHomeResource,
    ) -> dg.MaterializeResult:
        with policies.open() as store:
            state, store_version = store.state(), store.version()
            decision = canary_decision(store, context.run.tags.get("keel/policy_version"))
        if decision is not None:  # a run the canary sensor launched: its log says what was decided, and why
            canary = context.run.tags.get("keel/canary", "the canary")
            context.log.info(f"{canary}: {decision.get('action')} at {decision.get('percent')} % — "
                             + "; ".join(decision.get("reasons") or ["no reason recorded"]))  # fmt: skip
        with registry.open() as reg:
            try:
                plan = plan_deployment(
                    state, store_version, reg, model_name, _latest_manifest(context, promotion_key)
                )
            except NoChampionError as exc:
                raise dg.Failure(str(exc)) from None
        endpoints = triton.endpoints()
        control = triton.control()
        infra = infra_snapshot() | {
            "triton": control.server_version(),
            "triton_dist": endpoints.get("triton_version"),
        }
        with ledger.open() as led:
            done = release(
                plan,
                triton.deployer(model_name, n_features, control=control),
                led,
                infra,
                endpoints.get("policy") or {},
                live_from=SimClock(keel_home.layout().clock, uc.name).now(),  # the simulated now in a live replay
            )
        report = done.report
        context.log.info(
            f"deployed {model_name}: routing generation {report.generation}, loaded {list(report.loaded)}, "
            f"unloaded {list(report.unloaded)}, cold starts {report.cold_start_s}"
        )
        return dg.MaterializeResult(
            metadata={
                **simulated.of_run(context),
                "release_id": done.manifest["release_id"],
                "ledger_seq": done.entry.seq,
                "routing_generation": report.generation,
                "routes": dg.MetadataValue.table(
                    records=[
                        dg.TableRecord(
                            r
                            | {
                                "loaded_now": r["version"] in report.loaded,
                                "cold_start_ms": round(report.cold_start_s[r["version"]] * 1000, 1)
                                if r["version"] in report.cold_start_s
                                else None,
                            }
                        )
                        for r in plan.routes()
                    ],
                    schema=dg.TableSchema(
                        columns=[
                            dg.TableColumn("name", "string"),
                            dg.TableColumn("version", "int"),
                            dg.TableColumn("weight", "float", description="share of traffic"),
                            dg.TableColumn("loaded_now", "bool", description="loaded into Triton by this deployment"),
                            dg.TableColumn("cold_start_ms", "float", description="load until ready"),
                        ]
                    ),
                ),
                "fallback_version": plan.fallback.route.version if plan.fallback else dg.MetadataValue.null(),
                "loaded_versions": ", ".join(str(v) for v in report.loaded) or "none",
                "unloaded_versions": ", ".join(str(v) for v in report.unloaded) or "none",
                "gateway": f"http://{endpoints['gateway']}",
                "manifest": dg.MetadataValue.json(done.manifest),
                "policy_store_version": store_version,
                **_canary_metadata(plan.canary, decision),
                **fault_metadata(),  # a failing control's switch that holds its canaries (keel/faults.py)
            }
        )

    return [model_deployment]


def canary_decision(store, version: str | None) -> dict | None:
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


def _latest_manifest(context: dg.AssetExecutionContext, promotion: dg.AssetKey) -> dict:
    records = context.instance.fetch_materializations(promotion, limit=1).records
    if not records:
        raise dg.Failure("model_promotion has never been materialized: nothing to deploy")
    metadata = records[0].asset_materialization.metadata
    # "manifest": how promotions recorded it before it was named a candidate (an instance from an older keel)
    return (metadata.get("candidate_manifest") or metadata["manifest"]).value


def _model_field() -> dg.Field:
    """The rollback job's ``model``: the installed use case's when there is one, else the operator names it."""
    found = installed()
    if len(found) == 1:
        return dg.Field(str, default_value=next(iter(found.values())).model.name)
    return dg.Field(
        str, description=f"the served model to roll back ({', '.join(uc.model.name for uc in found.values())})"
    )


@dg.op(
    description="Restores the previous release from the ledger: its model back in Triton as champion (hot swap), "
    "the registry's champion alias, and a revert entry in the ledger.",
    config_schema={
        "reason": dg.Field(str, default_value="rollback requested"),
        "model": _model_field(),
    },
)
def rollback_op(
    context: dg.OpExecutionContext,
    registry: ModelRegistryResource,
    triton: TritonResource,
    ledger: LedgerResource,
    keel_home: KeelHomeResource,
) -> None:
    from keel.rollback import rollback

    model = context.op_config["model"]
    uc = by_model(model)
    when = SimClock(keel_home.layout().clock, uc.name).now()  # a live replay's simulated now in the model's span
    with registry.open() as reg, ledger.open() as led:
        result = rollback(
            reg, led, triton.deployer(model, len(uc.features.names)), model, context.op_config["reason"], when
        )
    context.log.info(f"rolled back {result.replaced.release_id} → {result.restored.release_id}")
    context.log_event(
        dg.AssetMaterialization(
            wiring(uc).key("model_deployment"),
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
