"""The release ledger: point-in-time queries on boundaries, tamper detection, and crash safety with real kill -9."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest

from keel.ledger import Ledger, LedgerError
from keel.sqldb import location_exists
from tests.control_plane import Raw, env_for, url_of

T0 = datetime(2013, 6, 1, 12, tzinfo=UTC)


@pytest.fixture
def ledger(location):
    """A ledger on each backend (tests/control_plane.py): a SQLite file, a Postgres schema."""
    led = Ledger(location)
    yield led
    led.close()


def test_point_in_time_exactly_on_boundaries(ledger):
    ledger.append("rel-a", {"model": "a"}, T0)
    ledger.append("rel-b", {"model": "b"}, T0 + timedelta(hours=1))
    assert ledger.at(T0 - timedelta(microseconds=1)) is None
    assert ledger.at(T0).release_id == "rel-a"  # live from its first instant
    assert ledger.at(T0 + timedelta(hours=1) - timedelta(microseconds=1)).release_id == "rel-a"
    assert ledger.at(T0 + timedelta(hours=1)).release_id == "rel-b"
    assert ledger.at("2013-06-01T13:30:00Z").manifest == {"model": "b"}


def test_revert_is_a_new_entry_and_time_only_moves_forward(ledger):
    ledger.append("rel-a", {"model": "a"}, T0)
    ledger.append("rel-b", {"model": "b"}, T0 + timedelta(hours=1))
    back = ledger.revert(1, "canary breach", T0 + timedelta(hours=2))
    assert back.seq == 3 and back.release_id == "rel-a" and back.reverts == 1
    assert [e.release_id for e in ledger.log()] == ["rel-a", "rel-b", "rel-a"]
    with pytest.raises(LedgerError, match="only move forward"):
        ledger.append("rel-c", {}, T0)
    assert ledger.verify().ok


def test_sql_updates_and_deletes_are_refused(ledger):
    ledger.append("rel-a", {}, T0)
    raw = Raw(ledger.location)
    statements = ["UPDATE entries SET release_id = 'x'", "DELETE FROM entries"]
    if raw.postgres:
        statements.append("TRUNCATE entries")  # row triggers do not see it: a statement trigger does
    for stmt in statements:
        with pytest.raises(raw.refused, match="append-only"):
            raw.execute(stmt)
    assert raw.execute("SELECT release_id FROM entries") == [("rel-a",)]
    raw.close()


def tamper(location, *statements):
    raw = Raw(location).without_triggers("entries")
    for statement in statements:
        raw.execute(statement)
    raw.close()


@pytest.mark.parametrize(
    "statements, symptom",
    [
        (['UPDATE entries SET manifest = \'{"model":"evil"}\' WHERE seq = 2'], "edited"),
        (["DELETE FROM entries WHERE seq = 2"], "removed"),
        (["UPDATE entries SET live_from = '2014-01-01T00:00:00+00:00' WHERE seq = 1"], "edited"),
        (
            [
                "UPDATE entries SET seq = 99 WHERE seq = 2",
                "UPDATE entries SET seq = 2 WHERE seq = 3",
                "UPDATE entries SET seq = 3 WHERE seq = 99",
            ],
            "reordered",
        ),
    ],
)
def test_verify_detects_tampering_and_the_cli_exits_1(location, statements, symptom):
    path = location
    led = Ledger(path)
    for i in range(3):
        led.append(f"rel-{i}", {"model": str(i)}, T0 + timedelta(hours=i))
    led.close()
    tamper(path, *statements)
    result = Ledger(path).verify()
    assert not result.ok and any(symptom in p for p in result.problems), result.problems
    keel = subprocess.run(
        [sys.executable, "-m", "keel.cli", "ledger", "--ledger", url_of(path), "verify"],
        capture_output=True,
        text=True,
        env=os.environ | env_for(path),
    )
    assert keel.returncode == 1 and "TAMPERED" in keel.stdout


def test_cli_at_and_log(tmp_path):
    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    led.append("rel-a", {"data": "d1", "model": "m1", "infra": "i1", "policy": "p1"}, T0)
    led.close()
    at = subprocess.run(
        [sys.executable, "-m", "keel.cli", "ledger", "--ledger", str(path), "at", "2013-06-01T12:00:00Z"],
        capture_output=True,
        text=True,
    )
    assert at.returncode == 0 and "rel-a" in at.stdout and 'model: "m1"' in at.stdout
    before = subprocess.run(
        [sys.executable, "-m", "keel.cli", "ledger", "--ledger", str(path), "at", "2013-06-01T11:59:59Z"],
        capture_output=True,
        text=True,
    )
    assert before.returncode == 1
    bad = subprocess.run(
        [sys.executable, "-m", "keel.cli", "ledger", "--ledger", str(path), "at", "yesterday"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2


WRITER = textwrap.dedent(
    """
    import sys
    from datetime import datetime, timedelta, UTC
    from keel.ledger import Ledger
    led = Ledger(sys.argv[1])
    start = int(sys.argv[2])
    for i in range(start, 200):
        led.append(f"rel-{i}", {"i": i, "pad": "x" * 2000}, datetime(2013, 1, 1, tzinfo=UTC) + timedelta(minutes=i))
        print(f"ACK {i}", flush=True)  # acknowledged: the append returned
    """
)


@pytest.mark.slow
def test_kill_9_during_200_appends_loses_no_acknowledged_entry(location):
    path = location
    rng = random.Random(42)
    acked: set[int] = set()
    kills = 0
    while True:
        start = len(Ledger(path).log()) if location_exists(path, "entries") else 0
        if start >= 200:
            break
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, url_of(path), str(start)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | env_for(path),
        )
        kill_after = rng.randint(1, 40)  # a random point: after this many acknowledged appends, mid-append
        seen = 0
        for line in proc.stdout:
            acked.add(int(line.split()[1]))
            seen += 1
            if seen == kill_after:
                proc.send_signal(signal.SIGKILL)
                kills += 1
                break
        rest, _ = proc.communicate()
        acked |= {int(line.split()[1]) for line in rest.splitlines() if line.startswith("ACK ")}
    led = Ledger(path)
    entries = led.log()
    assert kills >= 3, "the writer was never killed mid-run: the test proved nothing"
    assert {int(e.release_id.split("-")[1]) for e in entries} >= acked
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    result = led.verify()
    assert result.ok and result.entries == 200, result.problems


def release(asset: str, sha: str) -> dict:
    return {
        "data": "d",
        "model": {"hash": sha, "parts": {"asset": asset, "sha256": sha}},
        "infra": "i",
        "policy": "p",
    }


def test_at_names_what_served_every_model_and_a_release_of_one_leaves_the_other(tmp_path):
    """Two models released in turn: at any instant, each model's own latest release; flights' second release
    leaves what served hotels unchanged, and a revert belongs to its model's line."""
    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    led.append("rel-f1", release("flights/delay_model", "f1"), T0)
    led.append("rel-h1", release("hotels/rate_model", "h1"), T0 + timedelta(hours=1))
    led.append("rel-f2", release("flights/delay_model", "f2"), T0 + timedelta(hours=2))
    led.revert(1, "f2 was worse", T0 + timedelta(hours=3))  # flights back to f1
    assert [e.release_id for e in led.at_each(T0 + timedelta(minutes=30))] == ["rel-f1"]
    assert [e.release_id for e in led.at_each(T0 + timedelta(hours=2, minutes=1))] == ["rel-h1", "rel-f2"]
    after = led.at_each(T0 + timedelta(hours=4))
    assert [(e.release_id, e.reverts) for e in after] == [("rel-h1", None), ("rel-f1", 1)]
    assert led.at(T0 + timedelta(hours=4)).release_id == "rel-f1"  # the newest entry of any model, as before
    assert led.at_each(T0 - timedelta(seconds=1)) == []
    led.close()
    at = subprocess.run(
        [sys.executable, "-m", "keel.cli", "ledger", "--ledger", str(path), "at", "2013-06-01T14:30:00Z"],
        capture_output=True,
        text=True,
    )
    assert at.returncode == 0, at.stderr
    assert at.stdout.index("rel-h1") < at.stdout.index("rel-f2") and "rel-f1" not in at.stdout


def test_each_model_moves_forward_in_its_own_time_span(ledger):
    """Two use cases replayed live on one clock: flights releases in 2013 beside hotel rates in 2017, interleaved in
    the ledger; each model's own releases only move forward, and `at_each` answers for each in its own time."""

    def manifest(asset: str, sha: str) -> dict:
        return {"model": {"parts": {"asset": asset, "sha256": sha}}}

    ledger.append("flights-1", manifest("flights/model", "f1"), datetime(2013, 4, 1, tzinfo=UTC))
    ledger.append("rooms-1", manifest("hotels/rate_model", "r1"), datetime(2016, 11, 16, tzinfo=UTC))
    ledger.append("flights-2", manifest("flights/model", "f2"), datetime(2013, 6, 20, tzinfo=UTC))  # after 2016: fine
    with pytest.raises(LedgerError, match="model's releases only move forward"):
        ledger.append("rooms-0", manifest("hotels/rate_model", "r0"), datetime(2016, 11, 1, tzinfo=UTC))
    ledger.append("rooms-2", manifest("hotels/rate_model", "r2"), datetime(2017, 2, 3, tzinfo=UTC))
    assert [e.release_id for e in ledger.at_each(datetime(2013, 7, 1, tzinfo=UTC))] == ["flights-2"]
    assert [e.release_id for e in ledger.at_each(datetime(2017, 1, 1, tzinfo=UTC))] == ["rooms-1", "flights-2"]
    assert ledger.verify().ok
