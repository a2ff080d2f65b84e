"""The incidents asset: every fault the platform detected (and every chaos drill) with its timeline — injected,
detected, located, acted on, recovered — and what users felt. Refreshed by ``watchdog_sensor`` whenever the
incident log changes (job ``keel_incidents``); the log itself is ``$KEEL_HOME/incidents.sqlite`` (keel/incidents.py).
"""

from __future__ import annotations

from datetime import datetime

import dagster as dg

from keel.incidents import IncidentLog, usecase_of
from keel.usecase import installed
from resources import simulated
from resources.home import KeelHomeResource

INCIDENTS = dg.AssetKey("incidents")
COLUMNS = ("usecase", "key", "kind", "severity", "injected_at", "detected_at", "acted_at", "recovered_at", "requests_failed",
           "requests_degraded", "located")  # fmt: skip


def _seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def timeline_markdown(incidents) -> str:
    """One block per incident, newest first: each step of its timeline and the time from the previous one."""
    if not incidents:
        return "No incident recorded."
    out = []
    for i in reversed(incidents):
        state = "open" if i.open else "recovered"
        out.append(f"### {i.key} — {i.kind}, {i.severity}, {state}\n{i.summary}\n")
        prev = None
        for step in ("injected_at", "detected_at", "acted_at", "recovered_at"):
            at = getattr(i, step)
            if at is None:
                continue
            gap = _seconds(prev, at)
            after = f" (+{gap:,.0f} s)" if gap is not None else ""
            out.append(f"- **{step.split('_')[0]}** {at}{after}")
            prev = at
        if i.located:
            out.append(f"- **located**: {i.located}")
        if i.action:
            out.append(f"- **action**: {i.action}")
        if i.requests_failed is not None:
            out.append(f"- requests failed {i.requests_failed}, degraded {i.requests_degraded}")
        out.append("")
    return "\n".join(out)


@dg.asset(
    name="incidents",
    group_name="operations",
    kinds={"sqlite"},
    tags={"keel/backfill": "skip"},  # not a stage of the set-up: watchdog_sensor refreshes it
    description="Every incident: a fault the platform detected (a delivery held back, a canary rolled back, the "
    "model runtime restarted, the control plane tampered with) or a chaos drill — with its timeline (injected, "
    "detected, acted on, recovered, on the shared clock), the root cause as the platform located it, its action and "
    "the requests failed and degraded during it; the table by use case, each in its own simulated time. `keel "
    "incidents` lists the same.",
)
def incidents(context, keel_home: KeelHomeResource) -> dg.MaterializeResult:
    home = keel_home.layout()
    with IncidentLog(home.incidents) as log:
        rows = log.list()
    names = {n: uc.name for uc in installed().values() for n in (uc.name, uc.model.name)}
    owner = {i.key: usecase_of(i, names) for i in rows}
    # each use case's incidents together, in its own simulated time (the use cases of one replay live in other years)
    ordered = sorted(rows, key=lambda i: (owner[i.key], i.detected_at or i.injected_at or "", i.id))
    schema = dg.TableSchema(
        columns=[dg.TableColumn(c, "int" if c.startswith("requests") else "string") for c in COLUMNS]
    )
    table = dg.MetadataValue.table(
        records=[
            dg.TableRecord({"usecase": owner[i.key]} | {c: getattr(i, c) for c in COLUMNS[1:]}) for i in ordered
        ],
        schema=schema,
    )
    to_recover = [s for i in rows if (s := _seconds(i.detected_at, i.recovered_at)) is not None]
    return dg.MaterializeResult(
        metadata={
            **simulated.of_run(context),
            "incidents": len(rows),
            "open": sum(i.open for i in rows),
            "drills": sum(i.injected_at is not None for i in rows),
            "by_usecase": dg.MetadataValue.json(
                {u: sum(o == u for o in owner.values()) for u in sorted(set(owner.values()))}
            ),
            "by_kind": dg.MetadataValue.json(
                {k: sum(i.kind == k for i in rows) for k in sorted({i.kind for i in rows})}
            ),
            "table": table,
            "timeline": dg.MetadataValue.md(timeline_markdown(rows)),
            "median_detected_to_recovered_s": dg.MetadataValue.float(sorted(to_recover)[len(to_recover) // 2])
            if to_recover
            else dg.MetadataValue.null(),
        }
    )


incidents_job = dg.define_asset_job(
    "keel_incidents",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(INCIDENTS),
    description="Refresh the incidents asset from the incident log (launched by watchdog_sensor on every change).",
)
