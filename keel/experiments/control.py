"""Driving an experiment through the policy store: start, status, pause, stop, roll back.

An experiment is live as an ``ab_test`` policy named ``experiment.<id>``: variants control and treatment (the
spec's model versions and traffic ratio) and an ``experiment`` field with its status (running, paused, stopped,
rolled_back), the spec's sha256, when it started and which traffic it takes (``traffic``: ``all`` — the model's
split, one such experiment per model at a time — or ``header``: only requests with ``x-experiment-id: <id>``; every
live experiment answers its header, so several run on one model at once, each sticky per unit by its own salt). Gateways follow the store, so each commit is the action; its
reason carries who and why (a guardrail's evidence, as JSON). The spec itself is kept next to the data:
``$KEEL_HOME/experiments/<id>/spec.yaml``, written once at the start.

Pause, stop and roll back all send every unit to the control; they differ in what follows. *Paused* can be resumed
(a guardrail's "pause"); *stopped* ends the experiment; *rolled back* ends it as a failure: its data partitions
are marked rolled back (``experiments/<id>/rolled_back.json`` lists them — kept, not deleted; the wide table carries
the mark) and the release ledger gets an entry for the control serving alone.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from keel.errors import KeelError
from keel.experiments.spec import ExperimentSpec, load_spec
from keel.home import KeelHome
from keel.names import validate_name
from keel.storage import write_json_atomic, write_text_atomic

RUNNING, PAUSED, STOPPED, ROLLED_BACK = "running", "paused", "stopped", "rolled_back"
LIVE = (RUNNING, PAUSED)
GUARDRAIL_AUTHOR = "guardrail-sensor"  # the author of every commit the guardrail sensor makes


class ExperimentStateError(KeelError):
    """An experiment cannot make this move (not started, already finished, …)."""


def split_name(exp_id: str) -> str:
    return f"experiment.{validate_name(exp_id, what='experiment id')}"


def experiment_dir(home: Path, exp_id: str) -> Path:
    return KeelHome(Path(home)).experiment(exp_id)


def stored_spec(home: Path, exp_id: str) -> ExperimentSpec:
    path = experiment_dir(home, exp_id) / "spec.yaml"
    if not path.exists():
        raise ExperimentStateError(f"experiment '{exp_id}' was never started here (no {path})")
    return load_spec(path)


def experiments(store) -> dict[str, dict[str, Any]]:
    """Every experiment the store knows: id → {status, started_at, ended_at, store_version, spec_sha256, body}."""
    out = {}
    for p in store.state().values():
        meta = p.body.get("experiment") if p.type == "ab_test" else None
        if meta:
            out[meta["id"]] = meta | {"store_version": p.version, "body": p.body}
    return out


def _body(spec: ExperimentSpec, treatment_share: float, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": spec.model,
        "salt": spec.id,
        "variants": [
            {"name": spec.control_label, "version": spec.control_version, "weight": round(1 - treatment_share, 12)},
            {"name": spec.treatment_label, "version": spec.treatment_version, "weight": round(treatment_share, 12)},
        ],
        "experiment": meta,
    }


def start(store, spec_path: str | Path, *, home: Path, author: str, reason: str | None = None):
    spec_path = Path(spec_path)
    spec = load_spec(spec_path)
    if spec.control_version is None or spec.treatment_version is None:
        raise ExperimentStateError(f"{spec_path}: starting needs control.version and treatment.version")
    live = experiments(store)
    current = live.get(spec.id)
    if current and current["status"] in LIVE:
        raise ExperimentStateError(f"experiment '{spec.id}' is already {current['status']}")
    splitting = [i for i, m in live.items() if m["status"] in LIVE and m["body"]["model"] == spec.model
                 and m.get("traffic", "all") == "all"]  # fmt: skip
    if spec.traffic == "all" and splitting:
        raise ExperimentStateError(
            f"experiment '{splitting[0]}' already splits all of {spec.model}'s traffic: stop it first, or start "
            f"'{spec.id}' with traffic: header (it then takes only requests with x-experiment-id: {spec.id})"
        )
    text = spec_path.read_text()
    directory = experiment_dir(home, spec.id)
    write_text_atomic(text, directory / "spec.yaml")
    meta = {
        "id": spec.id,
        "status": RUNNING,
        "spec_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "started_at": datetime.now(UTC).timestamp(),
        "traffic": spec.traffic,
    }
    commit = store.apply(
        {split_name(spec.id): ("ab_test", _body(spec, spec.traffic_ratio, meta))},
        author=author,
        reason=reason or f"start experiment {spec.id}: v{spec.treatment_version} vs v{spec.control_version}",
    )
    from keel.experiments.impact import predict_at_start

    predict_at_start(home, spec, meta["started_at"])  # the lift predicted now, compared with the realized one later
    return commit


def _move(store, home: Path, exp_id: str, to: str, *, author: str, reason: str, allowed: tuple[str, ...]):
    current = experiments(store).get(exp_id)
    if current is None:
        raise ExperimentStateError(f"experiment '{exp_id}' is not in the policy store")
    if current["status"] not in allowed:
        raise ExperimentStateError(f"experiment '{exp_id}' is {current['status']}; cannot become {to}")
    spec = stored_spec(home, exp_id)
    meta = {k: current[k] for k in ("id", "spec_sha256", "started_at", "traffic") if k in current} | {"status": to}
    if to != RUNNING:
        meta["ended_at" if to in (STOPPED, ROLLED_BACK) else "paused_at"] = datetime.now(UTC).timestamp()
    share = spec.traffic_ratio if to == RUNNING else 0.0
    return store.apply({split_name(exp_id): ("ab_test", _body(spec, share, meta))}, author=author, reason=reason)


def pause(store, home, exp_id, *, author, reason):
    return _move(store, home, exp_id, PAUSED, author=author, reason=reason, allowed=(RUNNING,))


def resume(store, home, exp_id, *, author, reason):
    return _move(store, home, exp_id, RUNNING, author=author, reason=reason, allowed=(PAUSED,))


def stop(store, home, exp_id, *, author, reason):
    return _move(store, home, exp_id, STOPPED, author=author, reason=reason, allowed=LIVE)


def rollback(store, home, exp_id, *, author, reason, ledger=None, registry=None, exposure_days=()):
    """Every unit back to the control, the experiment's data partitions marked rolled back (kept), and — with a
    ledger — a release entry for the control serving alone."""
    commit = _move(store, home, exp_id, ROLLED_BACK, author=author, reason=reason, allowed=LIVE)
    marker = experiment_dir(home, exp_id) / "rolled_back.json"
    write_json_atomic(
        {"at": commit.committed_at.isoformat(), "reason": reason, "store_version": commit.version,
         "days": sorted(set(exposure_days))},
        marker,
    )  # fmt: skip
    entry = None
    if ledger is not None:
        from keel.release import infra_snapshot, release_manifest

        spec = stored_spec(home, exp_id)
        sha = registry.sha_of_version(spec.model, spec.control_version) if registry is not None else None
        manifest = release_manifest(
            data={"experiment": exp_id, "rolled_back_days": sorted(set(exposure_days))},
            model={"name": spec.model, "version": spec.control_version, "sha256": sha},
            infra=infra_snapshot(),
            policy={"store_version": commit.version, "experiment": {"id": exp_id, "status": ROLLED_BACK}},
        )
        entry = ledger.append(manifest["release_id"], manifest)
    return commit, entry


def rolled_back_days(home: Path, exp_id: str) -> set[str]:
    marker = experiment_dir(home, exp_id) / "rolled_back.json"
    try:
        return set(json.loads(marker.read_text())["days"])
    except FileNotFoundError:
        return set()


def guardrail_decision(store, exp_id: str, meta: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The guardrail decision that acted on the experiment's current run (paused or rolled it back), as recorded in
    the policy store: {version, at, action, evidence}, the evidence being what the sensor saw when it acted (each
    breached guardrail with its always-valid p-value and interval, the arms). None when no guardrail acted.

    This record — not a later re-analysis on more data — is the verdict: the mSPRT p-value is a running minimum over
    the looks the sensor made, and a single look at the final data can land above α although the sequence crossed
    it. The analysis asset reports this decision, so that the decision and the analysis tell one story."""
    meta = meta if meta is not None else experiments(store).get(exp_id)
    if meta is None:
        return None
    started = float(meta.get("started_at") or 0.0)
    name = split_name(exp_id)
    found = None
    for c in store.log():
        if name not in c.changes or c.author != GUARDRAIL_AUTHOR or c.committed_at.timestamp() < started:
            continue
        try:
            evidence = json.loads(c.reason)
        except json.JSONDecodeError:
            evidence = {"reason": c.reason}
        found = {
            "version": c.version,
            "at": c.committed_at.isoformat(),
            "action": evidence.get("action"),
            "evidence": evidence,
        }
    return found


def describe(store, home: Path, exp_id: str) -> dict[str, Any]:
    current = experiments(store).get(exp_id)
    if current is None:
        raise ExperimentStateError(f"experiment '{exp_id}' is not in the policy store")
    spec = stored_spec(home, exp_id)
    history = [
        {"version": c.version, "at": c.committed_at.isoformat(), "author": c.author, "reason": c.reason}
        for c in store.log()
        if split_name(exp_id) in c.changes
    ]
    return {
        "id": exp_id,
        "status": current["status"],
        "model": spec.model,
        "control_version": spec.control_version,
        "treatment_version": spec.treatment_version,
        "weights": {v["name"]: v["weight"] for v in current["body"]["variants"]},
        "started_at": current.get("started_at"),
        "history": history,
        "rolled_back_days": sorted(rolled_back_days(home, exp_id)),
        "spec": yaml.safe_load((experiment_dir(home, exp_id) / "spec.yaml").read_text()),
    }
