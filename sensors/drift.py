"""The drift sensor: new drift reports → freeze drifted features and/or ask for retraining, by policy.

Each tick reads drift_report materializations after its cursor (an event-log storage id; it only moves forward),
computes a ``DriftDecision`` (keel.drift.policy) per report, then acts: freezes and unfreezes in the online store
(recorded with what, why and when in its freeze log, and observed on the ``feature_freezes`` asset) and a run
request for the models downstream of the flight features, found through the asset graph. Run keys are derived from the report's event id, so a restarted daemon or
a replayed cursor never launches the same retraining twice, and a freeze that is already in place is not repeated.
"""

import json

import dagster as dg

from assets.drift import DRIFT_REPORT
from assets.features import FLIGHT_FEATURES
from assets.freezes import freeze_observation
from keel.drift.policy import DriftPolicy, decide
from keel.features.definitions import FEATURE_NAMES
from resources.online_store import OnlineStoreResource
from sensors.problems import automation_problems

DRIFT_POLICY = DriftPolicy()
MODEL_KIND = "model"  # assets with this kind, downstream of the features, are retrained on drift


def models_downstream(asset_graph, key: dg.AssetKey) -> list[dg.AssetKey]:
    """Every asset of kind 'model' reachable downstream of ``key`` in the asset graph."""
    seen, stack, models = set(), [key], []
    while stack:
        for child in asset_graph.get(stack.pop()).child_keys:
            if child in seen:
                continue
            seen.add(child)
            stack.append(child)
            if MODEL_KIND in asset_graph.get(child).kinds:
                models.append(child)
    return sorted(models, key=lambda k: k.to_user_string())


@dg.sensor(
    name="drift_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    # What its run requests may launch: the assets of kind 'model' (each request names the ones downstream of the
    # features). A sensor without a target cannot launch asset runs from the daemon.
    target=dg.AssetSelection.kind(MODEL_KIND),
    description="Freezes drifted features and requests retraining of downstream models when a drift report drifts.",
)
def drift_sensor(context: dg.SensorEvaluationContext, online_store: OnlineStoreResource):
    after = int(context.cursor) if context.cursor else 0
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=DRIFT_REPORT, after_storage_id=after), limit=50, ascending=True
    ).records
    if not records:
        return dg.SkipReason(f"no drift report after event {after}")
    models = models_downstream(context.repository_def.asset_graph, FLIGHT_FEATURES)
    requests, problems = [], []
    with online_store.open() as store:
        frozen_before = store.frozen()
        for record in records:
            window = record.asset_materialization.partition or "unpartitioned"
            try:
                request = act_on_report(context, store, record, window, models)
            except Exception as exc:  # noqa: BLE001 - one bad report or freeze must not stop every later tick
                problems.append(
                    f"drift report {window} (event {record.storage_id}) skipped: {type(exc).__name__}: {exc}"
                )
                continue
            if request is not None:
                requests.append(request)
        # What is served frozen now, on the feature_freezes asset (first tick, and whenever it changed).
        changed = store.frozen() != frozen_before or after == 0
        observations = [freeze_observation(store, "drift_sensor")] if changed else []
    for p in problems:
        context.log.error(p)
    return dg.SensorResult(
        run_requests=requests,
        cursor=str(max(after, records[-1].storage_id)),
        asset_events=observations + automation_problems(DRIFT_REPORT, "drift_sensor", problems),
    )


def report_features(value: dg.MetadataValue) -> dict[str, dict]:
    """A drift report's per-feature summary, {feature: {drifted, severity, value, threshold, metric,
    reference_mean, ...}}: from its table (assets/drift.py), or from the JSON that reports before the table carried."""
    if isinstance(value, dg.TableMetadataValue):
        return {r.data["feature"]: dict(r.data) for r in value.records}
    return json.loads(json.dumps(value.value))


def act_on_report(context, store, record, window: str, models: list[dg.AssetKey]) -> dg.RunRequest | None:
    """The decision for one drift report, carried out: freezes and unfreezes in the online store (each freeze on
    its own — a freeze the store refuses is reported, the others happen), and the retraining request."""
    features = report_features(record.asset_materialization.metadata["features"])
    decision = decide(window, features, DRIFT_POLICY, set(store.frozen()), freezable=set(FEATURE_NAMES))
    context.log.info(f"drift decision for {window}: {decision}")
    for name in decision.not_frozen:
        context.log.info(f"{name} drifted in {window} but is not a served feature: retraining only, no freeze")
    for f in decision.freeze:
        store.freeze(f.feature, f"{f.reason} (drift_report {window}, event {record.storage_id})", f.value)
    for name in decision.unfreeze:
        store.unfreeze(name, f"no drift in {window}")
    if not (decision.retrain and models):
        return None
    return dg.RunRequest(
        run_key=f"retrain:{window}:{record.storage_id}",
        asset_selection=models,
        tags={"keel/trigger": "drift", "keel/drift_window": window, "keel/reason": decision.retrain_reason[:200]},
    )
