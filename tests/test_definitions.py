"""The Definitions snapshot: every asset, check, job, sensor and schedule, so the graph changes only on purpose.

After an intended change, regenerate with: KEEL_UPDATE_SNAPSHOT=1 .venv/bin/pytest tests/test_definitions.py
"""

from __future__ import annotations

import json
import os

import definitions
from tests import REPO

SNAPSHOT = REPO / "tests" / "snapshots" / "definitions.json"


def current() -> dict:
    defs = definitions.defs
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "partitioned": node.is_partitioned,
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "has_description": bool(node.description),
        }
    checks = sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in graph.asset_check_keys)
    return {
        "assets": assets,
        "checks": checks,
        "jobs": sorted(j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")),
        "sensors": sorted(s.name for s in defs.sensors or []),
        "schedules": sorted(s.name for s in defs.schedules or []),
    }


def test_definitions_match_snapshot():
    snap = current()
    if os.environ.get("KEEL_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(json.dumps(snap, indent=2) + "\n")
    old = json.loads(SNAPSHOT.read_text())
    changed = sorted(f"{part}: {name}" for part in snap for name in set(snap[part]) ^ set(old.get(part, ())))
    assert snap == old, (
        "the Definitions differ from tests/snapshots/definitions.json (added or removed: "
        f"{', '.join(changed[:20]) or 'none; an entry changed'}). If the change is intended — a new use case, asset "
        "or sensor — refresh the snapshot with KEEL_UPDATE_SNAPSHOT=1 .venv/bin/pytest tests/test_definitions.py "
        "and commit it with the change (docs/usecases.md)"
    )


def test_the_sensors_and_schedules_of_use_cases_the_platform_does_not_play_are_stopped(monkeypatch):
    """Issue 49: with KEEL_USECASES naming one use case the others' sensors still ticked. They stay defined (the UI
    shows them) but stopped; the one played runs."""
    import dagster as dg

    from keel.usecase import installed

    monkeypatch.setenv("KEEL_USECASES", "hotels")
    for name, uc in installed().items():
        _, defs = definitions.usecase_definitions(uc)
        running = dg.DefaultSensorStatus.RUNNING if name == "hotels" else dg.DefaultSensorStatus.STOPPED
        assert {s.default_status for s in defs.sensors} == {running}, name
        assert {s.default_status.value for s in defs.schedules} == {running.value}, name  # the nightly drift
    monkeypatch.delenv("KEEL_USECASES")
    _, defs = definitions.usecase_definitions(installed()["flights"])
    assert {s.default_status for s in defs.sensors} == {dg.DefaultSensorStatus.RUNNING}


def test_every_asset_tells_its_story():
    for key, node in current()["assets"].items():
        assert node["has_description"] and node["kinds"] and node["group"] != "default", key
