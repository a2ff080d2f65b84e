"""What the UI says of each use case is in that use case's words (issue 47): no hotels asset, group, job, check,
sensor or schedule text speaks of flights, NYC, nycflights, 2013 or weather, and no flights text of bookings, hotels,
rooms, stays or quotes. The texts are read from the definitions the webserver serves (descriptions, the group
metadata every asset carries, check specs, jobs, sensors, schedules)."""

from __future__ import annotations

import re

import dagster as dg
import pytest

FLIGHTS_WORDS = re.compile(r"flight|NYC|nycflights|2013|weather", re.IGNORECASE)
HOTELS_WORDS = re.compile(r"hotel|booking|\broom|\bstays?\b|\bquote", re.IGNORECASE)


def texts_of(defs: dg.Definitions, prefix: str) -> list[tuple[str, str]]:
    repo = defs.get_repository_def()
    out = []
    for node in repo.asset_graph.asset_nodes:
        if node.key.path[0] != prefix:
            continue
        name = node.key.to_user_string()
        out.append((name, node.description or ""))
        out += [(f"{name} metadata {k}", v) for k, v in (node.metadata or {}).items() if isinstance(v, str)]
        out += [(f"{name} group", node.group_name or "")]
    for ad in repo.assets_defs_by_key.values():
        for spec in ad.check_specs:
            if spec.asset_key.path[0] == prefix:
                out.append((f"check {spec.asset_key.to_user_string()}:{spec.name}", spec.description or ""))
    out += [(f"job {j.name}", j.description or "") for j in repo.get_all_jobs() if j.name.startswith(f"{prefix}_")]
    out += [(f"sensor {s.name}", s.description or "") for s in repo.sensor_defs if s.name.startswith(f"{prefix}_")]
    out += [
        (f"schedule {s.name}", s.description or "") for s in repo.schedule_defs if s.name.startswith(f"{prefix}_")
    ]
    return out


@pytest.fixture(scope="module")
def defs():
    from keel.usecase import installed

    if not {"flights", "hotels"} <= set(installed()):
        pytest.fail("both use cases must be installed (pip install -e usecases/…; scripts/setup does)")
    from definitions import defs

    return defs


@pytest.mark.parametrize(("prefix", "foreign"), [("hotels", FLIGHTS_WORDS), ("flights", HOTELS_WORDS)])
def test_each_use_case_is_told_in_its_own_words(defs, prefix, foreign):
    texts = texts_of(defs, prefix)
    assert len(texts) > 50  # every asset, its group's texts, checks, jobs, sensors
    own = FLIGHTS_WORDS if prefix == "flights" else HOTELS_WORDS
    assert sum(bool(own.search(t)) for _, t in texts) > 5  # the sweep reads real texts: its own words are there
    found = [(where, foreign.findall(text), text[:120]) for where, text in texts if foreign.search(text)]
    assert not found, found[:10]
