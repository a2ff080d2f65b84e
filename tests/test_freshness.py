"""Freshness on the wall clock only where the data arrives on the wall clock: a home replaying a past period
(``KEEL_REPLAY=1``, which scripts/up sets) has no freshness policy to turn red weeks after an afternoon's replay;
a deployment fed live keeps the monthly cadence on the raw tables, the online store, drift reports and explanations.
(The definitions are built in a fresh interpreter each time, as a code server builds them from its environment.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import REPO

CADENCED = ("flights/raw_flights", "flights/online_features", "flights/drift_report", "flights/explanations")
SHOW = """
import json, warnings
warnings.simplefilter("ignore")
from definitions import defs
out = {}
for a in defs.assets:
    for spec in getattr(a, "specs", []):
        out[spec.key.to_user_string()] = None if spec.freshness_policy is None else str(spec.freshness_policy)
print(json.dumps(out))
"""


def cadences(replay: str | None) -> dict[str, str | None]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_REPLAY"} | ({"KEEL_REPLAY": replay} if replay else {})
    out = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("replay", [None, "0"])
def test_a_live_fed_deployment_keeps_the_monthly_cadence(replay):
    fresh = cadences(replay)
    for key in CADENCED:
        assert fresh[key] and "days=35" in fresh[key], (key, fresh[key])


def test_a_replayed_home_has_no_wall_clock_freshness():
    fresh = cadences("1")
    assert set(CADENCED) <= set(fresh) and not any(fresh.values()), {k: v for k, v in fresh.items() if v}


def test_the_main_command_says_its_data_is_replayed():
    assert "export KEEL_REPLAY=1" in (REPO / "scripts" / "up").read_text()
