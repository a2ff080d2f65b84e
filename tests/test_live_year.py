"""The loop on a live span with a known outcome, for real: the model runtime (Triton + gateway), `dagster dev`
(webserver + daemon) and `scripts/materialize.py --live` as scripts/up runs them, into a throwaway KEEL_HOME —
January–March built as history, April on the wall clock while tests/test_live_drills.py runs the chaos drills on the
same platform, then, as an operator would (Ctrl-C, and the replay again with ``--stepped``), on the reproducible
clock: a simulated day at a time, each once its work is done, so every decision below falls on the same day on any
machine, however busy.

What lands carries a data drill planted on known days (tests/live_platform.py ``KNOWN_OUTCOME``, keel/data/plants.py).
The test is the operator: it waits (on events, bounded generously) until the clock has passed the known days, then
presses Ctrl-C (the clock pauses, the traffic stops) and lets the sensors settle. What the loop must have done,
*through* drift, gate, shadow and canary and nothing planted in the policy store:

- April 13–30 half of the flights land on time whatever happened. April's drift report (May 1) asks for a
  challenger, and the gate refuses every candidate — each was fitted on April 1–10, before the change, and none is
  surely better on April 11–30 than the champion — so no canary starts and the first model stays.
- From May 1 a third of the flights land an hour late, for good. May's drift report (June 1) finds the label's shift;
  its candidates, fitted or recalibrated on May 1–10, pass the gate; the chosen one is judged better in shadow on
  June's flights, widened and promoted, live on ``PROMOTED_ON`` within the bounds ``promotion_bounds`` derives
  from the plant and the canary plan.

The failing controls (keel/faults.py; docs/live.md "The data drill"): with ``KEEL_FAULT_PROMOTION=off`` the canary
never promotes and the promotion tests fail; with ``KEEL_FAULT_GATE=always-pass`` April's worse challenger gets a canary
and the gate test fails. Besides: the challengers came from drift on the right months, the release's chain prints from
its drift report to the ledger, no stale freeze outlives the promotion, no replayed request failed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from tests.dagster_support import home_env
from tests.live_platform import instance_of, no_run_in_progress, wait_until
from usecases.flights.features import FLIGHT_FEATURES

# The span runs in the first test's set-up, on the session's live platform (tests/conftest.py year_platform), after
# tests/test_live_drills.py has run the chaos drills on its April.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

LOOP_CANARY = "flight-delay.loop-v"
REFUSED_GATE = "2013-04"  # the known outcome: the gate of April's drift refuses every candidate
PROMOTED_GATE = "2013-05"  # the known outcome: the challenger of May's drift is promoted …
PROMOTED_ON = date(2013, 6, 10)  # … live that day (as a stepped run promoted it), within the bounds below
SETTLED_PAST = datetime(2013, 6, 13, 12, tzinfo=UTC)  # past the promotion's last allowed day: the clock stops here
WAIT_FOR_SPAN_S = 45 * 60  # the stepped span April → June: ~12 minutes on 2 cores, each step its work done


def promotion_bounds() -> tuple[date, date]:
    """The days the promotion may go live, from the plant and the loop's canary plan (keel/loop/promote.py), not
    from a run. The plant changes the label from May 1, so May's drift report (June 1's delivery completes May)
    starts the canary in the step of June 1 — a challenger, its gate and its canary settle in the step whose delivery
    caused them. Its shadow needs ``min_clusters`` days of paired labels, and a day's labels land with the next day's
    delivery: June 1–5 are labelled at the step of June 1 + min_clusters, its first chance to be judged. Each later
    step is sized in requests (``min_samples``: 30 of the replay's 175 a day, 44 at 25 %): one day each on any machine,
    len(steps) − 1 of them. So June 8 at the earliest (PROMOTED_ON − 2). Later: the shadow's verdict is a one-sided
    t-test over the days, and each day more it needs is a day later. On the stepped clock the days' data are the same
    on every machine; the challenger's last float digits are not (LightGBM sums over its threads), so a p-value near
    α may need a day or two more than the run that set PROMOTED_ON: two allowed, and the clock stops the day after
    (SETTLED_PAST)."""
    from datetime import timedelta

    from keel.loop.promote import LOOP_CANARY

    first_chance = date(2013, 6, 1) + timedelta(days=LOOP_CANARY["shadow"]["min_clusters"])
    earliest = first_chance + timedelta(days=len(LOOP_CANARY["steps"]) - 1)
    return earliest, PROMOTED_ON + timedelta(days=2)


def loop_canaries(home: Path) -> dict[str, dict]:
    from keel.policies import PolicyStore

    if not (home / "policies.sqlite").exists():
        return {}
    with PolicyStore(home / "policies.sqlite") as store:
        return {n: dict(p.body) for n, p in store.state().items() if p.type == "canary" and n.startswith(LOOP_CANARY)}


@pytest.fixture(scope="module")
def live(year_platform):
    platform = year_platform
    assert platform.phase in ("start", "drills"), "the live span has already been played on this platform"
    platform.phase = "year"
    home = platform.home
    from keel.clock import SimClock

    traffic = home / "serving" / "live_traffic" / "flights.json"
    wait_until("the history is built and the traffic flows", traffic.exists, 1800, 3, on_timeout=platform.log)
    platform.go_on_stepped()  # from here on the reproducible clock; its traffic counts from here (a new replayer)
    clock = SimClock(home / "clock.json")

    def past_the_known_days() -> bool:
        assert platform.year.poll() is None, platform.log()
        state = clock.state()
        return state.stepped and state.sim_anchor >= SETTLED_PAST

    wait_until(
        "the stepped span has passed the known days", past_the_known_days, WAIT_FOR_SPAN_S, 5, on_timeout=platform.log
    )
    platform.year.send_signal(signal.SIGINT)  # Ctrl-C: the clock pauses, the traffic stops
    assert platform.year.wait(timeout=120) == 130, platform.log(tail=3000)
    wait_until("the sensors' runs have finished", lambda: no_run_in_progress(home), 600, 3)
    yield home
    platform.stop()  # the last user of the session's live platform: the tests after this one run without its load


def canary_decisions(home: Path, name: str) -> list[dict]:
    from keel.policies import PolicyStore

    with PolicyStore(home / "policies.sqlite") as store:
        return [
            json.loads(store.commit(v).reason)
            for v in range(1, store.version() + 1)
            if name in store.commit(v).changes and store.commit(v).author == "canary-controller"
        ]


def registry_of(home: Path):
    from keel.registry import ModelRegistry

    return ModelRegistry(home / "registry")


def gate_verdicts(home: Path) -> dict[str, dict]:
    """Each gate month's newest challenger_evaluation, as its metadata."""
    import dagster as dg

    with instance_of(home) as instance:
        records = instance.fetch_materializations(dg.AssetKey(["flights", "challenger_evaluation"]), limit=50).records
    out: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: r.storage_id):
        meta = {k: v.value for k, v in r.asset_materialization.metadata.items()}
        out[meta["gate_month"]] = meta
    return out


def promoted_canary(home: Path) -> tuple[str, dict]:
    """The loop's one canary of the span: May's drift decision's."""
    canaries = loop_canaries(home)
    assert len(canaries) == 1, {n: (b["origin"], b.get("state")) for n, b in canaries.items()}
    [(name, body)] = canaries.items()
    return name, body


def test_the_history_was_built_and_the_replay_went_on_stepped_where_the_operator_stopped_it(live):
    home = live
    from keel.clock import SimClock

    state = SimClock(home / "clock.json").state()
    assert state is not None and state.stepped and not state.running and state.sim_anchor >= SETTLED_PAST
    text = (home / "live.log").read_text()
    assert "history job 3/3: flights_models" in text and "goes on stepped from 2013-04-" in text
    assert "paused at 2013-06-" in text


def test_challengers_come_from_drift_on_the_three_months_before_their_gate_month(live):
    import dagster as dg

    home = live
    with instance_of(home) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="flights_challenger"))
    gates = set()
    for run in runs:
        assert run.tags["dagster/sensor_name"] == "flights_drift_sensor" and run.tags["keel/trigger"] in (
            "drift",
            "monthly",
        )
        config = run.run_config["ops"]["flights__challenger_model"]["config"]
        gate = config["gate_month"]
        gates.add(gate)
        year, month = (int(x) for x in gate.split("-"))
        assert config["train_months"] == [f"{year}-{m:02d}" for m in range(month - 3, month)]
        assert config["gate_from_day"] == 11  # flights' Loop: early-stopped on days 1–10, judged on 11–end
        assert (
            run.tags["dagster/run_key"]
            == f"challenger:{config['train_months'][0]}..{config['train_months'][-1]}|{gate}"
        )
        if gate == PROMOTED_GATE:  # a whole month of the planted change: the label's rate drifted
            assert config["label_drift"] is True
    assert gates == {REFUSED_GATE, PROMOTED_GATE}  # the two planted changes, one decision each; nothing before April
    keys = [r.tags["dagster/run_key"] for r in runs]
    assert len(keys) == len(set(keys))  # the same data never trained twice


def test_aprils_worse_challengers_are_refused_by_the_gate_and_no_canary_starts(live):
    """The known outcome: every candidate of April's decision was fitted on April 1–10, before the change, and none is
    surely better on April 11–30. The gate refuses, no canary starts for it. Fails with the gate switched to
    always-pass (KEEL_FAULT_GATE=always-pass)."""
    home = live
    verdict = gate_verdicts(home)[REFUSED_GATE]
    rows = {r.data["candidate"]: r.data for r in verdict["candidates"].records}
    assert verdict["passed"] is False, verdict["reason"]
    assert rows and not any(r["surely_better"] for r in rows.values()), rows
    assert [b for b in loop_canaries(home).values() if b["origin"]["gate_month"] == REFUSED_GATE] == []


def test_mays_label_shift_is_promoted_through_gate_shadow_and_canary_on_the_known_day(live):
    """The known outcome: May's drift → a challenger its gate chose → better in shadow → 25 % → 100 % → promoted,
    live on PROMOTED_ON within ``promotion_bounds`` (2013-06-10: the day a stepped run with this May promoted it; the
    bounds derived from the plant and the canary plan). Fails with the loop's
    promotion switched off (KEEL_FAULT_PROMOTION=off)."""
    from keel.ledger import Ledger

    home = live
    name, body = promoted_canary(home)
    assert body["origin"]["drift_window"] == PROMOTED_GATE and body["origin"]["gate_month"] == PROMOTED_GATE
    with registry_of(home) as reg:
        sha = reg.sha_of_version("flight-delay", body["challenger_version"])
        meta = reg.get("flight-delay", sha).metadata
        champion = reg.alias("flight-delay", "champion")
    assert meta["challenger_gate"]["chosen"] is True and meta["trigger"]["drift_window"] == PROMOTED_GATE
    assert gate_verdicts(home)[PROMOTED_GATE]["passed"] is True
    decisions = canary_decisions(home, name)
    actions = [(d["action"], d["percent"]) for d in decisions]
    assert actions == [("start", 0.0), ("advance", 25.0), ("advance", 100.0), ("promote", 100.0)], decisions[-1]
    assert "better in shadow" in decisions[1]["reasons"][0]
    assert body["state"]["status"] == "promoted" and champion == sha
    with Ledger(home / "ledger.sqlite") as ledger:
        [entry] = [e for e in ledger.log() if e.manifest["model"]["parts"]["sha256"] == sha]
    earliest, latest = promotion_bounds()
    assert earliest <= entry.live_from.date() <= latest, (entry.live_from, PROMOTED_ON, earliest, latest)


def test_the_promotions_chain_prints_from_its_drift_report_to_the_ledger(live):
    from keel.ledger import Ledger

    home = live
    _, body = promoted_canary(home)
    with registry_of(home) as reg:
        sha = reg.sha_of_version("flight-delay", body["challenger_version"])
    with Ledger(home / "ledger.sqlite") as ledger:
        releases = [e for e in ledger.log() if e.manifest["model"]["parts"]["sha256"] == sha]
    assert releases, (
        f"the loop's challenger v{body['challenger_version']} was never released (its canary: {body['state']})"
    )
    entry = releases[0]
    keel = str(Path(sys.executable).with_name("keel"))
    out = subprocess.run(
        [keel, "ledger", "why", entry.release_id], env=home_env(home), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for step in ("policy v", "promote at 100.0 %", "ledger", "drift report", "training run", "gate"):
        assert step in text, text
    assert f"drift_report[{body['origin']['drift_window']}]" in text


def test_no_request_failed_and_the_challenger_met_the_traffic(live):
    """From where the span went on stepped — after the drills, whose faults (a killed runtime) are theirs to account
    for (tests/test_live_drills.py) — no replayed request failed; the loop's challenger scored live requests: in
    shadow (its scores in the exposure log beside the champion's answers), then answered once it left the shadow."""
    from keel.exposure_log import read_exposures

    home = live
    summary = json.loads((home / "serving" / "live_traffic" / "flights.json").read_text())
    assert summary["failed"] == 0 and summary["ok"] > 5000, summary  # ~70 steps of 175 requests
    _, body = promoted_canary(home)
    challenger = body["challenger_version"]
    shadowed = [r for r in read_exposures(home / "serving" / "exposures") if r.get("shadow_version") == challenger]
    assert shadowed and all(r["model_version"] != challenger for r in shadowed)  # scored, never served in shadow
    assert str(challenger) in summary["versions"], summary["versions"]


def test_no_freeze_outlives_a_model_that_learned_its_drift(live):
    from keel.features.sqlite_store import SQLiteOnlineStore
    from keel.loop.reference import trained_on

    home = live
    with registry_of(home) as reg:
        learned = set(trained_on(reg.get("flight-delay", reg.alias("flight-delay", "champion")).metadata))
    with SQLiteOnlineStore(home / "online" / "flights.sqlite", features=FLIGHT_FEATURES) as store:
        frozen = store.frozen()
        log = store.freeze_log()
    for feature in frozen:
        [last] = [e for e in log if e.feature == feature and e.action == "freeze"][-1:]
        window = last.reason.split("drift_report ")[1][:7]
        assert window not in learned, f"{feature} frozen for drift in {window}, which the champion learned from"


def test_loop_report_measures_each_complete_live_month(live):
    import dagster as dg

    home = live
    with instance_of(home) as instance:
        records = instance.fetch_materializations(dg.AssetKey(["flights", "loop_report"]), limit=50).records
    by_month = {r.asset_materialization.partition: r.asset_materialization.metadata for r in records}
    for month in ("2013-04", "2013-05"):
        meta = by_month[month]
        # better than chance, if not by much: a planted share of each month's flights is late whatever they are like
        assert 0.55 < meta["served_auc"].value < 0.9 and 0.55 < meta["static_auc"].value < 0.9
        assert meta["labelled_flights"].value > 20_000


def test_every_materialization_of_the_replay_says_when_in_the_year_it_happened(live):
    """Dagster stamps events with the wall clock; a replay's materializations carry the simulated time too
    (``simulated_at``, ``simulated_month``: resources/simulated.py), so the UI can tell the year as it happened.
    A run no replay launched — asked for before the replay's first run (the incidents refreshed as the platform came
    up, before the replay's clock existed) — carries no tag and says nothing; one with a tag must say 2013."""
    from dagster import RunsFilter

    from resources.simulated import SIM_TAG

    home = live
    missing, seen = [], 0
    with instance_of(home) as instance:
        runs = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter())}
        began = min(
            r.create_timestamp for r in runs.values() if r.dagster_run.tags.get(SIM_TAG, "").startswith("2013-")
        )
        for key in instance.get_asset_keys():
            for record in instance.fetch_materializations(key, limit=1000).records:
                run = runs.get(record.run_id)
                if run is not None and SIM_TAG not in run.dagster_run.tags and run.create_timestamp < began:
                    continue  # before the replay began
                seen += 1
                meta = record.asset_materialization.metadata
                if "simulated_at" not in meta or not meta["simulated_month"].value.startswith("2013-"):
                    missing.append((key.to_user_string(), run.dagster_run.job_name if run else None))
    assert seen > 100 and not missing, sorted(set(missing))
