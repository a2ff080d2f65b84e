"""The reproducible live replay's driver: a stepped clock (keel/clock.py) moved one simulated day at a time, each step
only when the work due at it is done (keel/steps.py) and its traffic is answered. scripts/materialize.py --live
--stepped runs it; docs/live.md explains what the clock waits for.

Per step: the deliveries due at the step's instant land; the clock stands at that instant, settling — the deciding
sensors tick, the runs they ask for finish, until every one of them has looked again after the last run and found
nothing to do; then the traffic phase — each use case's replayer sends its requests of the step's day and says so
in its summary (``step``); then the next step. How long a step takes depends on the machine; what happens in it
does not.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta

import dagster as dg

from keel.clock import DEFAULT_SPEED, TRAFFIC, SimClock, shared_spans
from keel.steps import deciding_sensors, read_ticks, settled
from sensors.drift import IN_PROGRESS

STEP = timedelta(days=1)
BATCH_DAYS = 7  # a month's new days are built together once a week (and when the month is complete)
POLL_S = 0.25
STATUS_EVERY_S = 30.0


# What the stepped replay commits to the policy store before its first step: answers wait for the model instead of
# timing out (a timeout, a breaker opened by timeouts and the fallback that answers instead depend on how busy the
# machine is), and the canaries' latency guard does not judge the machine's speed (the SLA targets are far above
# any answer). Latency is the one thing a replay on a shared machine cannot reproduce; everything else it does.
REPLAY_SLA = {
    "tiers": {tier: {"p99_ms": 60_000.0, "availability": 0.99, "timeout_ms": 60_000.0} for tier in ("L1", "L2", "L3")}
}
REPLAY_SLA_NAME = "replay.sla"


def commit_replay_sla(home, say) -> None:
    """Commit REPLAY_SLA once (a resumed replay finds it there)."""
    from keel.policies import PolicyStore

    with PolicyStore(home.policies) as store:
        if REPLAY_SLA_NAME in store.state():
            return
        store.apply({REPLAY_SLA_NAME: ("sla_tier", REPLAY_SLA)}, author="scripts/up",
                    reason="the reproducible replay: answers wait for the model, latency is not judged")  # fmt: skip
    say(f"keel: stepped replay: committed {REPLAY_SLA_NAME} (timeouts and SLA targets of 60 s: the machine's speed "
        "decides nothing)")  # fmt: skip


class StepError(RuntimeError):
    """A stepped replay cannot go on (a traffic generator died)."""


def last_run_end(instance: dg.DagsterInstance, since: datetime) -> float | None:
    """Wall epoch seconds when the newest run that finished after ``since`` ended (None: none did)."""
    records = instance.get_run_records(filters=dg.RunsFilter(updated_after=since), limit=200)
    ends = [r.end_time for r in records if r.end_time is not None]
    return max(ends) if ends else None


def wait_settled(clock: SimClock, instance, sensors: list[str], ticks_dir, follow, say) -> float:
    """Block until the clock's current step has settled; the wall seconds it took."""
    t0 = last_say = time.monotonic()
    while True:
        state = clock.state()
        busy = instance.get_runs_count(filters=dg.RunsFilter(statuses=IN_PROGRESS))
        since = state.phase_wall or datetime.now(UTC)
        done, why = settled(state, read_ticks(ticks_dir, sensors), sensors, last_run_end(instance, since), busy)
        follow.print_new()
        if done:
            return time.monotonic() - t0
        if time.monotonic() - last_say > STATUS_EVERY_S:
            last_say = time.monotonic()
            say(f"  … step {state.step} ({state.sim_anchor:%Y-%m-%d}) settling for {time.monotonic() - t0:.0f} s: "
                f"{why}")  # fmt: skip
        time.sleep(POLL_S)


def traffic_behind(step: int, summaries: dict) -> list[str]:
    """The use cases whose replayer has not yet answered step ``step`` — a replayer whose span is over (its summary
    says ``finished``) is never behind: it exits 0 at its span's end while the others go on."""
    out = []
    for name, path in summaries.items():
        summary = _summary(path)
        if not summary.get("finished") and (summary.get("step") is None or summary["step"] < step):
            out.append(name)
    return out


def wait_traffic(clock: SimClock, step: int, summaries: dict, traffic: list, say) -> float:
    """Block until every replayer has answered step ``step``'s requests; the wall seconds it took. A replayer that
    failed (non-zero exit), or one that exited while its use case is still behind, stops the replay."""
    t0 = last_say = time.monotonic()
    while True:
        for proc in traffic:
            if proc.poll() not in (None, 0):
                raise StepError(f"a traffic generator exited ({proc.returncode}): see live_traffic.log")
        behind = traffic_behind(step, summaries)
        if not behind:
            return time.monotonic() - t0
        if all(proc.poll() is not None for proc in traffic):
            raise StepError(f"every traffic generator exited, but {', '.join(behind)} did not finish step {step}: "
                            "see live_traffic.log")  # fmt: skip
        if time.monotonic() - last_say > STATUS_EVERY_S:
            last_say = time.monotonic()
            say(f"  … step {step}: waiting for the traffic of {', '.join(behind)}")
        time.sleep(POLL_S / 2)


def _summary(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def run_steps(clock: SimClock, deliver, instance, home, ucs, traffic, follow, say) -> None:
    """Step the clock from where it stands to its end (module docstring). ``deliver(at)``: land what is due at
    ``at`` (the clock's own time) in every use case's zone; returns what landed, for the progress lines."""
    sensors = deciding_sensors([uc.name for uc in ucs])
    summaries = {uc.name: home.serving.live_traffic(uc.name) for uc in ucs}
    clock.set_phase(clock.state().phase)  # resumed: the phase starts again now (its ticks must be newer)
    settle_s = traffic_s = 0.0
    started = time.monotonic()
    while True:
        state = clock.state()
        if state.phase != TRAFFIC:
            settle_s += wait_settled(clock, instance, sensors, home.clock_ticks, follow, say)
            state = clock.set_phase(TRAFFIC)
        traffic_s += wait_traffic(clock, state.step, summaries, traffic, say)
        if state.step % 10 == 0:
            days = max(state.step, 1)
            say(f"  … step {state.step} {state.sim_anchor:%Y-%m-%d %H:%M}: {time.monotonic() - started:.0f} s so "
                f"far, per day {settle_s / days:.1f} s settling + {traffic_s / days:.1f} s traffic; "
                + "; ".join(f"{uc.name} {follow.traffic_line(uc)}" for uc in ucs))  # fmt: skip
        if state.sim_end is not None and state.sim_anchor >= state.sim_end:
            return
        at = state.sim_anchor + STEP
        if state.sim_end is not None:
            at = min(at, state.sim_end)
        deliver(at)  # before the step begins: its first ticks already see what is due at it
        clock.step_to(at)


def set_clock(clock: SimClock, home, zones: dict, args) -> int:
    """The live replay's clock: started (paused) on a new home, else checked and, with ``args.stepped`` on a wall-clock
    replay, switched to stepped from the next day's step. A non-zero exit status when the replay cannot go on as
    asked (said on stderr); 0 when it can."""
    from keel.ledger import Ledger

    # Each use case on its own time span of the one clock (docs/live.md): its history is the first model's months
    # (and any before them), complete; its span starts when their last day has landed in every table (flights:
    # March 31's flights and weather land at noon on April 1) and ends when its period's last day has landed.
    start, end, spans = shared_spans(
        {n: z.history_landed() for n, z in zones.items()}, {n: z.landed_by(z.last_day) for n, z in zones.items()}
    )
    if clock.state() is None:
        if home.ledger.exists() and Ledger(home.ledger).log():
            print(
                f"keel: {home.root} already holds a backfill's releases (its ledger is on the wall clock): a live "
                "replay needs a KEEL_HOME of its own (KEEL_HOME=... scripts/up, or remove it)",
                file=sys.stderr,
            )
            return 2
        clock.start(start, speed=args.speed or DEFAULT_SPEED, sim_end=args.end or end, spans=spans,
                    stepped=args.stepped, batch_days=BATCH_DAYS if args.stepped else 1)  # fmt: skip
        clock.pause(wall=clock.state().wall_anchor)  # at its start: the sensors wait while the histories are built
        for name in zones:
            print(f"keel: live replay of {name}: its clock set to {clock.state().of(name).sim_anchor:%Y-%m-%d %H:%M} "
                  "(paused)", flush=True)  # fmt: skip
    else:
        missing = sorted(set(zones) - set(clock.state().spans)) if clock.state().spans else []
        if missing:
            print(f"keel: {home.root}'s live replay was started without {', '.join(missing)}: a use case cannot join "
                  "a replay under way (a KEEL_HOME of its own, or KEEL_USECASES as before)", file=sys.stderr)  # fmt: skip
            return 2
        if clock.state().stepped and not args.stepped:
            print(f"keel: {home.root}'s live replay is stepped (KEEL_LIVE_CLOCK=stepped): it goes on stepped (or a "
                  "KEEL_HOME of its own)", file=sys.stderr)  # fmt: skip
            return 2
        if args.stepped and not clock.state().stepped:  # from here on reproducible: on at the next day's step
            at = clock.pause().sim_anchor  # the steps fall where a replay stepped from the start has them
            print(f"keel: the live replay, on the wall clock until {at:%Y-%m-%d %H:%M}, goes on stepped from "
                  f"{clock.to_stepped(start, BATCH_DAYS).sim_anchor:%Y-%m-%d %H:%M}", flush=True)  # fmt: skip
        if args.speed:
            clock.set_speed(args.speed)
    return 0
