"""The guardrail sensor's tick, as code a test can call: each running experiment's guardrails on the freshest
exposures; a breach pauses or rolls the experiment back through the policy store — the path the canary controller
takes.

Per running experiment (an ``ab_test`` policy with an ``experiment`` field, status running): its spec
($KEEL_HOME/experiments/<id>/spec.yaml), the exposure log since its start joined into wide rows (real outcomes from
the use case's validated rows in storage, simulated ones where the spec asks), then ``keel.experiments.analysis.analyze``.
A guardrail is breached when the sequential test (mSPRT, always-valid: looking every tick keeps the false-alarm rate
at α) says the treatment is worse than its tolerance; ``tick`` then commits the guardrail's action — pause, or
rollback (data partitions marked, ledger entry) when any breached guardrail asks for it — with the evidence as the
commit's reason. Nothing acts before both arms have ``min_sample`` units, nor while the split is flagged by the SRM
check. The always-valid p-values are carried in the cursor, so they only go down between ticks.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from keel.experiments.analysis import ExperimentDataError, analyze
from keel.experiments.control import GUARDRAIL_AUTHOR, RUNNING, experiments, pause, rollback, stored_spec
from keel.experiments.lake import wide_rows
from keel.exposures import read_exposure_scan, realized_labels
from keel.home import KeelHome
from keel.usecase import by_model

log = logging.getLogger(__name__)

AUTHOR = GUARDRAIL_AUTHOR


def tick(
    store,
    home: Path,
    *,
    registry=None,
    ledger=None,
    cursor: dict | None = None,
    problems: list[str] | None = None,
    models: frozenset[str] | None = None,
) -> tuple[list[dict], dict]:
    """One pass over the running experiments (of ``models`` only, when given). Returns what was done and the new cursor (metric → always-valid p).
    An experiment that cannot be judged (a malformed policy, a missing or bad spec) is reported in ``problems`` and
    skipped; the others proceed. Exposure-log lines that are not whole records are skipped and reported too."""
    problems = problems if problems is not None else []
    cursor = dict(cursor or {})
    acted: list[dict] = []
    running = {}
    for exp_id, meta in experiments(store).items():
        try:
            if meta["status"] == RUNNING:
                running[exp_id] = meta | {"started_at": float(meta.get("started_at") or 0.0)}
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"experiment '{exp_id}' skipped: its policy is malformed ({type(exc).__name__}: {exc})")
    if not running:
        return acted, cursor
    since = min(m["started_at"] for m in running.values())
    layout = KeelHome(Path(home))
    frame, scan = read_exposure_scan(layout.exposure_dirs(), since=since or None)
    if scan.skipped:
        problems.append(f"exposure log: {scan.skipped} lines were not whole records, e.g. {scan.examples[0]}")
    labels_by_model: dict[str, dict] = {}  # each model's realized labels, read once per tick
    for exp_id, meta in sorted(running.items()):
        try:
            model = stored_spec(home, exp_id).model
            if models is not None and model not in models:
                continue  # another use case's experiment: its own sensor judges it
            if model not in labels_by_model:
                uc = by_model(model)  # its assets live under its name: storage/<use case>/<asset>
                labels_by_model[model] = realized_labels(uc.features, frame["entity_key"], layout.storage / uc.name)
            labels = labels_by_model[model]
            done = _tick_one(store, home, exp_id, meta, frame, labels, cursor, registry, ledger)
            done = done and done | {"model": model}
        except Exception as exc:  # noqa: BLE001 - one bad experiment must not stop every other guardrail
            log.exception("experiment %r skipped this tick: its guardrail decision failed", exp_id)
            problems.append(f"experiment '{exp_id}' skipped, no decision made: {type(exc).__name__}: {exc}")
            continue
        if done is not None:
            acted.append(done)
    return acted, cursor


def _tick_one(store, home, exp_id, meta, frame, labels, cursor, registry, ledger) -> dict | None:
    spec = stored_spec(home, exp_id)
    wide = wide_rows(frame, spec, meta, labels=labels)
    if wide.is_empty():
        return None
    try:
        report = analyze(wide, spec, where=f"exposures of {exp_id}", previous_p=cursor.get(exp_id))
    except ExperimentDataError:
        return None  # one arm has no data yet
    cursor[exp_id] = {g["metric"]: g["msprt_p"] for g in report["guardrails"]}
    arms = report["arms"]
    if min(arms.values()) < spec.min_sample or report["srm"]["flagged"]:
        return None
    breached = [g for g in report["guardrails"] if g["breached"]]
    if not breached:
        return None
    action = "rollback" if any(g["action"] == "rollback" for g in breached) else "pause"
    reason = json.dumps(
        {"action": action, "guardrails": breached, "arms": arms, "srm_p": report["srm"]["p_value"]}, default=str
    )
    if action == "rollback":
        days = sorted(set(wide["day"].to_list()))
        commit, _ = rollback(
            store, home, exp_id, author=AUTHOR, reason=reason, ledger=ledger, registry=registry, exposure_days=days
        )
    else:
        commit = pause(store, home, exp_id, author=AUTHOR, reason=reason)
    return {"experiment": exp_id, "action": action, "version": commit.version, "breached": breached}
