"""Materialize a use case's pipeline through a running Dagster webserver, job by job, with progress output.

scripts/up starts ``dagster dev`` (webserver + daemon) first, then runs this. Every run is launched by Dagster
itself from the defined jobs of assets/jobs.py (the use case's ``build_order``), through the webserver's GraphQL API, exactly as
the UI's "Materialize" button does: runs show under their job in the Runs list and on the Overview timeline, can be
re-executed from the UI, and the monthly jobs fill the assets' partition bars. Partitioned jobs run month by month,
in calendar order, one run at a time (each month's delay rates are built from the months before it, and the drift
sensor acts on the reports in the order they arrive); a failed month is reported and the rest go on, and the
script exits non-zero at the end.

Usage: python scripts/materialize.py --port 3000 [--usecases flights,hotels] [--partitions 2013-01,2013-02]
       python scripts/materialize.py --port 3000 --live [--speed S] [--rps R]
       python scripts/materialize.py --port 3000 --live --stepped [--per-day N]

``--usecases``: the installed use cases to build, one after the other (default: ``$KEEL_USECASES``, else every
installed one). ``--partitions`` limits each to those months of its period.

``--live`` plays the use case's period as a live year instead (docs/live.md): its history (the first model's
months and any before them; flights: January–March 2013) lands at once and the set-up's history stages build it and
the first model (the simulated clock paused when the history's last day has landed; flights: 2013-04-01 12:00); then
the clock runs — the rest of the period lands day by day, the sensors build, judge drift, train challengers, run canaries —
while replayed traffic (``gpu_runtime.replay --live``) goes through the gateway. Progress: every run the sensors
launch, every release and canary decision, a status line twice a minute. When the clock reaches its end and the
sensors' runs are done, the stages for the whole year run (the causal analyses) and a summary is printed. Run it
again after a stop: the clock resumes where it stopped; what was built is not built again.

``--stepped`` plays it on a stepped clock instead (scripts/live_steps.py): a simulated day at a time, each once the
work due at it is done and its traffic (``--per-day`` requests of the day per use case) is answered — the same
decisions on any machine. A stepped step that was stopped in its traffic sends that traffic again on resume.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules (live_follow, live_steps)

import dagster as dg  # noqa: E402

# The asset modules are imported for the job names only: their Dagster preview/beta notices are not news here.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
from dagster_graphql import DagsterGraphQLClient  # noqa: E402
from live_follow import TERMINAL, Follower, pipeline_hold, summary, why_requests_failed  # noqa: E402

from assets.jobs import AFTER, HISTORY  # noqa: E402
from keel.clock import instant_arg  # noqa: E402
from keel.faults import FaultError, active_faults  # noqa: E402
from keel.signals import restore_default_signals  # noqa: E402
from keel.usecase import UseCase, UseCaseError, get, installed  # noqa: E402
from sensors.drift import IN_PROGRESS  # noqa: E402

LOCATION = "keel"  # workspace.yaml's location_name
TAGS = {"keel/source": "scripts/up"}
RUN_TIMEOUT_S = 3600  # a bound on one run, far above any month (seconds on this data)


def wait_for_run(client: DagsterGraphQLClient, run_id: str) -> dg.DagsterRunStatus:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    delay = 0.2
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id)
        if status in TERMINAL:
            return status
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise TimeoutError(f"run {run_id} did not finish in {RUN_TIMEOUT_S} s")


def run_stage(client, instance, uc: UseCase, stage, months: list[str | None], extra_tags=None) -> int:
    """Launch ``stage``'s job once per month (or once), one run at a time, with a progress line each; failures."""
    failures = 0
    for i, month in enumerate(months, 1):
        t = time.perf_counter()
        tags = TAGS | ({"dagster/partition": month} if month else {}) | ((extra_tags or {}).get(month) or {})
        run_id = client.submit_job_execution(stage.job.name, repository_location_name=LOCATION, tags=tags)
        status = wait_for_run(client, run_id)
        ok = status == dg.DagsterRunStatus.SUCCESS
        failures += not ok
        made, failed_checks = summary(instance, run_id, uc)
        label = f"[{i:>2}/{len(months)}] {month}" if month else "       all"
        state = "ok" if ok else status.value
        print(f"  {label} {state} in {time.perf_counter() - t:4.1f}s  {made}", flush=True)
        if failed_checks:
            print(f"        checks not passed: {', '.join(failed_checks)}", flush=True)
        if not ok:
            print(f"        run {run_id}: see its logs in the UI (Runs)", flush=True)
    return failures


# -- the live year ------------------------------------------------------------------------------------------------

STATUS_EVERY_S = 30


def build_order(uc: UseCase):
    from definitions import JOBS  # the code location the webserver serves: the same job names

    return JOBS[uc.name].build_order


def run_live(args, ucs: list[UseCase], client: DagsterGraphQLClient) -> int:
    import json
    import signal
    import subprocess
    from datetime import UTC, datetime, timedelta

    from live_steps import StepError, commit_replay_sla, run_steps, set_clock

    from keel.clock import PipelineHold, SimClock
    from keel.data.landing import LandingZone
    from keel.home import KeelHome

    home = KeelHome.from_env()
    instance = dg.DagsterInstance.get()
    clock = SimClock(home.clock)
    for uc in ucs:
        if not uc.history_months:
            print(f"keel: {uc.name} declares no first-model months: there is no history to start a live replay from",
                  file=sys.stderr)  # fmt: skip
            return 2
    zones = {uc.name: LandingZone(home.landing, uc) for uc in ucs}
    refused = set_clock(clock, home, zones, args)
    if refused:
        return refused

    def deliver(wall: datetime) -> dict[str, dict]:
        state = clock.state()
        return {n: z.deliver(state.of(n).now(wall)) for n, z in zones.items()}

    deliver(datetime.now(UTC))
    if clock.state().stepped:
        commit_replay_sla(home, lambda line: print(line, flush=True))
    failures = 0
    for uc in ucs:
        failures += build_history(client, instance, home, uc, zones[uc.name])
    if failures:
        print(f"keel: {failures} history run(s) failed: not starting the live year", file=sys.stderr)
        return 1
    state = clock.resume()
    for uc in ucs:
        mine = state.of(uc.name)
        print(f"keel: live {uc.name} from {mine.now(datetime.now(UTC)):%Y-%m-%d %H:%M} to {mine.sim_end:%Y-%m-%d %H:%M}",
              flush=True)  # fmt: skip
    if state.stepped:
        print(f"keel: the clock is stepped: a simulated day at a time, each once its work is done (docs/live.md); "
              f"traffic {args.per_day} requests per simulated day per use case", flush=True)  # fmt: skip
    else:
        print(f"keel: the clock runs at ×{state.speed:,.0f} (a simulated day every {86400 / state.speed:.1f} s); "
              "traffic " + ", ".join(f"{uc.name} {uc.replay.rate(args.rps):g} req/s" for uc in ucs),
              flush=True)  # fmt: skip
    env = dict(os.environ)
    if os.environ.get("KEEL_EDGE") == "1":  # behind the edge: the replay authenticates with a key of its own
        from gpu_runtime.live_traffic import KEYS_ENV, wait_for_key
        from keel.policies import PolicyStore
        from keel.tenants import REPLAY_TENANT, issue_replay_key

        with PolicyStore(home.policies) as store:
            key = issue_replay_key(store, datetime.now(UTC).isoformat(timespec="seconds"))
        env[KEYS_ENV] = f"{REPLAY_TENANT}={key}"
        took = wait_for_key(args.gateway, key)  # the first request of the year must not meet a 401
        print(f"keel: the replay authenticates at the edge as tenant {REPLAY_TENANT} (a key issued for this run, "
              f"in force at the edge {took:.2f} s after its commit)", flush=True)  # fmt: skip
    log = open(home.serving.root / "live_traffic.log", "a")  # noqa: SIM115 - the children hold it
    traffic = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_runtime.replay",
                "--live",
                "--url",
                args.gateway,
                "--rps",
                str(uc.replay.rate(args.rps)),
                "--usecase",
                uc.name,
                *(["--per-day", str(args.per_day), "--max-in-flight", "8"] if state.stepped else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
        for uc in ucs
    ]

    def stop(signum, frame):  # noqa: ARG001 - Ctrl-C / SIGTERM: pause the clock, stop the traffic
        paused = clock.pause()
        for t in traffic:
            t.terminate()
        print(f"\nkeel: live replay paused at {paused.sim_anchor:%Y-%m-%d %H:%M}; run again to resume", flush=True)
        sys.exit(130)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    follow = Follower(instance, home, ucs)
    last_status, quiet_since = 0.0, None
    hold, held_at = PipelineHold(), None  # when the clock waits for queued runs (keel/clock.py PipelineHold)
    if state.stepped:

        def deliver_at(at: datetime) -> None:
            spans = clock.state().spans
            for name, zone in zones.items():
                zone.deliver(at + (spans[name].offset if name in spans else timedelta(0)))

        try:
            run_steps(clock, deliver_at, instance, home, ucs, traffic, follow, lambda line: print(line, flush=True))
        except StepError as exc:
            clock.pause()
            print(f"keel: {exc}; the replay is paused", file=sys.stderr)
            return 1
    while not state.stepped:
        wall = datetime.now(UTC)
        state = clock.state()
        for name, delivered in deliver(wall).items():
            for table, days in delivered.items():
                if days and table == zones[name].outcomes_table and days[-1].day == 1:
                    print(f"  {state.of(name).now(wall):%Y-%m-%d} {name}: the {table} of {days[-1]:%B %Y} begin "
                          "to land", flush=True)  # fmt: skip
        follow.print_new()
        if time.monotonic() - last_status > STATUS_EVERY_S:
            last_status = time.monotonic()
            for uc in ucs:
                print(f"  … {uc.name} simulated {state.of(uc.name).now(wall):%Y-%m-%d %H:%M}; "
                      f"{follow.traffic_line(uc)}", flush=True)  # fmt: skip
        queued = len(instance.get_run_ids(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])))
        if hold.holds(held_at is not None, queued) != (held_at is not None):  # the clock waits for the pipeline
            held_at = pipeline_hold(clock, held_at, queued, ucs)
        busy = instance.get_runs(filters=dg.RunsFilter(statuses=IN_PROGRESS), limit=1)
        if state.finished(wall) and not busy:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 90:  # three sensor intervals with nothing to do: the year is in
                break
        else:
            quiet_since = None
        time.sleep(1.0)
    for t in traffic:
        t.wait(timeout=60)
    follow.print_new()
    for uc in ucs:
        if len(zones[uc.name].complete_months()) == len(uc.months):
            print(f"keel: {uc.name}: its live span is in; the analyses of its whole period:", flush=True)
            for stage in [s for s in build_order(uc) if s.live == AFTER]:
                failures += run_stage(client, instance, uc, stage, [None], {None: sim_tag(home, uc)})
        else:
            print(f"keel: {uc.name}: the clock stopped before its period was in: its whole-period analyses are not run",
                  flush=True)  # fmt: skip
    failed_requests = 0
    for uc in ucs:
        print(follow.summary(uc), flush=True)
        traffic = json.loads(home.serving.live_traffic(uc.name).read_text())
        failed_requests += traffic["failed"]
        if traffic["failed"]:
            print(f"keel: {uc.name}: {why_requests_failed(traffic)}", flush=True)
    if failures or failed_requests:
        print(f"keel: the live year did not end cleanly: {failures} failed run(s), {failed_requests:,} failed "
              "request(s) (above); the UI stays up to look at it", flush=True)  # fmt: skip
    return 1 if failures or failed_requests else 0


def sim_tag(home, uc: UseCase) -> dict[str, str]:
    """A live replay's run tag: the simulated instant in ``uc``'s time (every event of the run carries it:
    resources/simulated.py)."""
    from keel.clock import SimClock
    from resources.simulated import SIM_TAG

    return {SIM_TAG: SimClock(home.clock, uc.name).now().isoformat(timespec="seconds")}


def build_history(client, instance, home, uc: UseCase, zone) -> int:
    """The use case's history stages over its landed history months (once: not when a champion serves already)."""
    from keel.registry import ModelRegistry

    with ModelRegistry(home.registry) as reg:
        if reg.alias(uc.model.name, "champion") is not None:
            return 0
    landed = zone.landed_by_month()
    history = list(zone.complete_months())
    sim = sim_tag(home, uc)  # the simulated instant the history is built at (the clock stands there, paused)
    delivery = {m: {"keel/delivery": f"landing:{m}:{'-'.join(map(str, landed[m].days))}"} | sim for m in history}
    delivery[None] = sim
    print(f"keel: {uc.name}: history {history[0]}…{history[-1]} landed; building it and the first model", flush=True)
    stages = [s for s in build_order(uc) if s.live == HISTORY]
    failures = 0
    for n, stage in enumerate(stages, 1):
        print(f"history job {n}/{len(stages)}: {stage.job.name}", flush=True)
        failures += run_stage(client, instance, uc, stage, history if stage.partitioned else [None], delivery)
    return failures


def main() -> int:
    restore_default_signals()  # stops on TERM whatever it inherited (keel/signals.py)
    try:
        active_faults()  # a fault switch outside a test home is refused before anything is built (keel/faults.py)
    except FaultError as e:
        print(f"scripts/materialize.py: {e}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="the Dagster webserver's port on 127.0.0.1")
    parser.add_argument(
        "--usecases",
        default=os.environ.get("KEEL_USECASES", ""),
        help="comma-separated installed use cases to build (default: $KEEL_USECASES, else every installed one)",
    )
    parser.add_argument("--partitions", help="comma-separated month keys (default: all of the use case's period)")
    parser.add_argument("--live", action="store_true", help="play the period after the history live (docs/live.md)")
    parser.add_argument("--speed", type=float, help="simulated seconds per wall second (default: Apr–Dec in 20 min)")
    parser.add_argument("--end", type=instant_arg, help="where the live clock stops: a date or an ISO date-time, UTC "
                        "when it names no zone (default: when the period's last day has landed)")  # fmt: skip
    parser.add_argument("--rps", type=float, default=None,
                        help="live traffic, requests per second of every use case (default: each use case's Replay.rps, "
                             "else 40)")  # fmt: skip
    parser.add_argument("--stepped", action="store_true", help="--live on a stepped clock: reproducible, a simulated "
                        "day at a time once its work is done (docs/live.md)")  # fmt: skip
    parser.add_argument("--per-day", type=int, default=175, help="--stepped: live requests per simulated day per "
                        "use case (default 175: 40 req/s at the default speed)")  # fmt: skip
    parser.add_argument("--gateway", default="http://127.0.0.1:8080", help="the gateway the live traffic goes to")
    args = parser.parse_args()
    names = [n.strip() for n in args.usecases.split(",") if n.strip()]
    try:
        ucs = [get(n) for n in names] if names else list(installed().values())
    except UseCaseError as exc:
        parser.error(str(exc))
    if not ucs:
        parser.error("no use case is installed (the keel.usecases entry points)")
    client = DagsterGraphQLClient("127.0.0.1", port_number=args.port, timeout=120)
    if args.live:
        return run_live(args, ucs, client)
    instance = dg.DagsterInstance.get()
    t0 = time.perf_counter()
    failures = 0
    for uc in ucs:
        months = args.partitions.split(",") if args.partitions else list(uc.months)
        unknown = sorted(set(months) - set(uc.months))
        if unknown:
            parser.error(f"--partitions: {', '.join(unknown)} not in {uc.name}'s {uc.months[0]}…{uc.months[-1]}")
        stages = build_order(uc)
        print(f"keel: materializing {uc.name}: {len(stages)} jobs over {len(months)} months", flush=True)
        for n, stage in enumerate(stages, 1):
            print(f"job {n}/{len(stages)}: {stage.job.name}", flush=True)
            failures += run_stage(client, instance, uc, stage, months if stage.partitioned else [None])
    print(f"keel: done in {time.perf_counter() - t0:.0f}s, {failures} failed run(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
