"""The guardrail sensor: every tick, each running experiment's guardrails on the freshest exposures; a breach pauses
or rolls the experiment back through the policy store — the same path the canary controller takes.

Per running experiment (an ``ab_test`` policy with an ``experiment`` field, status running): its spec
($KEEL_HOME/experiments/<id>/spec.yaml), the exposure log since its start joined into wide rows (real outcomes from
the validated flights in storage, simulated ones where the spec asks), then ``keel.experiments.analysis.analyze``.
A guardrail is breached when the sequential test (mSPRT, always-valid: looking every tick keeps the false-alarm rate
at α) says the treatment is worse than its tolerance. The sensor then commits the guardrail's action — pause, or
rollback (data partitions marked, ledger entry) when any breached guardrail asks for it — with the evidence as the
commit's reason, and requests a run of the day's exposures and wide table (run key = the policy version: a replayed
tick cannot act twice). Nothing acts before both arms have ``min_sample`` units, nor while the split is flagged by
the SRM check (the comparison is not trustworthy; the analysis asset reports it). The always-valid p-values are
carried in the cursor, so they only go down between ticks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg

from assets.experiments import EXPERIMENT_EXPOSURES, EXPERIMENT_WIDE
from keel.errors import KeelError
from keel.experiments.analysis import analyze
from keel.experiments.control import RUNNING, experiments, pause, rollback, stored_spec
from keel.experiments.lake import wide_rows
from keel.exposures import read_exposure_frame, realized_labels
from keel.storage import keel_home
from resources.ledger import LedgerResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource

AUTHOR = "guardrail-sensor"


def tick(store, home: Path, *, registry=None, ledger=None, cursor: dict | None = None) -> tuple[list[dict], dict]:
    """One pass over the running experiments. Returns what was done and the new cursor (metric → always-valid p)."""
    cursor = dict(cursor or {})
    acted: list[dict] = []
    running = {i: m for i, m in experiments(store).items() if m["status"] == RUNNING}
    if not running:
        return acted, cursor
    since = min(float(m.get("started_at") or 0.0) for m in running.values())
    frame = read_exposure_frame(home / "serving" / "exposures", since=since or None)
    labels = realized_labels(frame["flight_key"], home / "storage")
    for exp_id, meta in sorted(running.items()):
        spec = stored_spec(home, exp_id)
        wide = wide_rows(frame, spec, meta, labels=labels)
        if wide.is_empty():
            continue
        try:
            report = analyze(wide, spec, where=f"exposures of {exp_id}", previous_p=cursor.get(exp_id))
        except KeelError:
            continue  # one arm has no data yet
        cursor[exp_id] = {g["metric"]: g["msprt_p"] for g in report["guardrails"]}
        arms = report["arms"]
        if min(arms.values()) < spec.min_sample or report["srm"]["flagged"]:
            continue
        breached = [g for g in report["guardrails"] if g["breached"]]
        if not breached:
            continue
        action = "rollback" if any(g["action"] == "rollback" for g in breached) else "pause"
        reason = json.dumps(
            {"action": action, "guardrails": breached, "arms": arms, "srm_p": report["srm"]["p_value"]}, default=str
        )
        if action == "rollback":
            days = sorted(set(wide["day"].to_list()))
            commit, _ = rollback(
                store,
                home,
                exp_id,
                author=AUTHOR,
                reason=reason,
                ledger=ledger,
                registry=registry,
                exposure_days=days,
            )
        else:
            commit = pause(store, home, exp_id, author=AUTHOR, reason=reason)
        acted.append({"experiment": exp_id, "action": action, "version": commit.version, "breached": breached})
    return acted, cursor


@dg.sensor(
    name="guardrail_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    target=dg.AssetSelection.assets(EXPERIMENT_EXPOSURES, EXPERIMENT_WIDE),
    description="Evaluates every running experiment's guardrails on the exposure log each tick (sequential test); a "
    "breach pauses or rolls back the experiment through the policy store, with its evidence.",
)
def guardrail_sensor(
    context: dg.SensorEvaluationContext,
    policies: PolicyStoreResource,
    registry: ModelRegistryResource,
    ledger: LedgerResource,
):
    cursor = json.loads(context.cursor) if context.cursor else {}
    store, reg, led = policies.open(), registry.open(), ledger.open()
    try:
        acted, cursor = tick(store, keel_home(), registry=reg, ledger=led, cursor=cursor)
    finally:
        store.close()
        reg.close()
        led.close()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    requests = [
        dg.RunRequest(
            run_key=f"guardrail:{a['experiment']}:{a['version']}",
            partition_key=today,
            asset_selection=[EXPERIMENT_EXPOSURES, EXPERIMENT_WIDE],
            tags={
                "keel/experiment": a["experiment"],
                "keel/guardrail_action": a["action"],
                "keel/policy_version": str(a["version"]),
            },
        )
        for a in acted
    ]
    return dg.SensorResult(
        run_requests=requests,
        cursor=json.dumps(cursor),
        skip_reason=None if requests else dg.SkipReason("no guardrail breached (or no running experiment)"),
    )
