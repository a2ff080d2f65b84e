"""Why a release is what it is: the chain from the drift that asked for its model to the commit that put it live.

``explain(entry, model, canary_commits)`` links what the platform recorded, each in its own store:

    drift report (partition, event id)        ← the model's registry metadata ``trigger``
    → training run (Dagster run id, window)   ← the model's ``run_id``, ``train_months``, ``valid_month``
    → gate result (verdict, numbers)          ← the model's ``challenger_gate``
    → canary policy versions                  ← the policy store's commits of the loop's canary for that version
    → promotion / rollback                    ← the last of those commits, and this ledger entry

A release whose model was not trained by the loop (the first model, one promoted by hand) says so instead. Pure:
the caller reads the ledger, registry and policy store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Link:
    step: str
    when: str  # simulated or wall time, as the store recorded it
    detail: str


def _reason(text: str) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except ValueError:
        return {"reasons": [text]}
    return d if isinstance(d, dict) else {"reasons": [text]}


def explain(
    release_id: str,
    live_from: str,
    model_version: int,
    model_metadata: dict[str, Any],
    canary_commits: list[tuple[int, str, str, str]],  # (store version, committed_at, author, reason), in order
) -> list[Link]:
    chain: list[Link] = []
    trigger = model_metadata.get("trigger") or {}
    if trigger.get("drift_window"):
        chain.append(
            Link("drift report", "", f"drift_report[{trigger['drift_window']}], event {trigger.get('drift_event')}")
        )
    window = list(model_metadata.get("train_months") or [])
    recal = model_metadata.get("recalibration")
    if model_metadata.get("run_id") and recal:  # the champion's trees, recalibrated (keel/loop/recalibrate.py)
        chain.append(
            Link(
                "training run",
                "",
                f"run {model_metadata['run_id']}: v{model_version} is v{recal.get('of_version')} recalibrated on "
                f"{recal.get('fitted_on')} ({recal.get('describe')})",
            )
        )
    elif model_metadata.get("run_id") and (members := model_metadata.get("committee")):  # keel/loop/committee.py
        chain.append(
            Link(
                "training run",
                "",
                f"run {model_metadata['run_id']}: v{model_version} is the mean of "
                + ", ".join(f"v{m.get('version')} ({m.get('role')})" for m in members)
                + " — candidate committee",
            )
        )
    elif model_metadata.get("run_id"):
        fitted = ", ".join(window) or "?"
        weights = (
            f" with recency weights (half-life {hl:g} days)" if (hl := model_metadata.get("half_life_days")) else ""
        )
        name = f" — candidate {model_metadata['candidate']}" if model_metadata.get("candidate") else ""
        chain.append(
            Link(
                "training run",
                "",
                f"run {model_metadata['run_id']}: v{model_version} fitted on {fitted}{weights}, early-stopped on "
                f"{model_metadata.get('valid_month')}{name}",
            )
        )
    gate = model_metadata.get("challenger_gate")
    if gate:
        if "chosen" in gate:  # one of several candidates (keel/loop/candidates.py)
            verdict = "chosen among the candidates" if gate["chosen"] else "not chosen"
        else:
            verdict = "passed" if gate.get("passed") else "failed"
        chain.append(
            Link(
                "gate",
                "",
                f"{verdict} on {gate.get('gate_month')} against v{gate.get('champion_version')}: {gate.get('reason')} "
                f"(run {gate.get('run_id')})",
            )
        )
    for version, at, author, reason in canary_commits:
        d = _reason(reason)
        if "action" in d:
            what = f"{d['action']} at {d.get('percent')} %: " + "; ".join(d.get("reasons", []))
        else:
            what = "; ".join(d.get("reasons", []))
        what += estimate_said((d.get("evidence") or {}).get("estimate"))
        chain.append(Link(f"policy v{version}", at, f"{author}: {what}"))
    chain.append(Link("ledger", live_from, f"release {release_id} live, serving v{model_version}"))
    return chain


def estimate_said(estimate: dict | None) -> str:
    """What a canary decision's estimate said (keel/loop/estimate.py: both arms' quality before the labels), for
    its line in the chain: the step it advanced or stopped names it."""
    if not estimate:
        return ""
    verdict = "surely worse" if estimate.get("worse") else "not worse" if estimate.get("not_worse") else "undecided"
    return (
        f" [estimate before the labels: {estimate.get('metric')} {estimate.get('challenger', float('nan')):.4f} vs "
        f"the champion's {estimate.get('champion', float('nan')):.4f}, {verdict}]"
    )


def from_loop(model_metadata: dict[str, Any]) -> bool:
    """Whether the loop trained this model (a challenger asked for by a drift report)."""
    return bool((model_metadata.get("trigger") or {}).get("drift_window"))
