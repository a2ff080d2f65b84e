"""``keel live``: the live replay's clock and deliveries — a use case's period replayed as a live year.

``keel live run`` starts the simulated clock (or resumes it where it stopped) and plays the upstream systems: each
local day of each landed source of each installed use case (or of ``--usecase``) lands in
``$KEEL_HOME/landing/<use case>`` when it is due on the simulated clock (its history at once: the first model's
months, for flights January to March 2013). Dagster's landing sensor picks each delivery up. Ctrl-C pauses the clock; running it
again resumes. ``keel live status`` says where the clock and the landing zone are.
"""

from __future__ import annotations

import argparse
import signal
import time
from datetime import UTC, datetime

from keel.cli.common import EXIT_OK, add_usecase_option, home_layout
from keel.clock import instant_arg


def register(sub) -> None:
    live = sub.add_parser("live", help="replay a use case's period as a live year: the simulated clock and landing")
    cmds = live.add_subparsers(dest="live_command", required=True)
    run = cmds.add_parser("run", help="start (or resume) the clock and deliver each day as it comes due")
    run.add_argument("--from", dest="start", type=instant_arg,
                     help="simulated start, a date or an ISO date-time, UTC when it names no zone (default: when the "
                     "history's last day has landed)")  # fmt: skip
    run.add_argument("--to", dest="end", type=instant_arg,
                     help="simulated end, as --from (default: when the period's last day has landed)")  # fmt: skip
    run.add_argument(
        "--speed", type=float, default=None, help="simulated seconds per wall second (default: Apr–Dec in 20 min)"
    )
    run.add_argument("--poll", type=float, default=1.0, help="wall seconds between deliveries (default 1)")
    add_usecase_option(run, required=False, every="every installed use case with landed sources")
    run.set_defaults(func=_run)
    status = cmds.add_parser("status", help="the clock and what has landed")
    add_usecase_option(status, required=False, every="every installed use case with landed sources")
    status.set_defaults(func=_status)


def _zones(home, args: argparse.Namespace) -> list:
    """The landing zones the command plays: ``--usecase``'s, else every installed use case's that lands data."""
    from keel.data.landing import LandingZone
    from keel.usecase import get, installed

    ucs = [get(args.usecase)] if args.usecase else [uc for uc in installed().values() if uc.period and uc.landed]
    return [LandingZone(home.landing, uc) for uc in ucs]


def _run(args: argparse.Namespace) -> int:
    from keel.clock import DEFAULT_SPEED, SimClock, shared_spans

    home = home_layout()
    clock, zones = SimClock(home.clock), _zones(home, args)
    if not zones:
        print("keel live: no installed use case lands data (a period and landed sources): nothing to replay")
        return EXIT_OK
    state = clock.state()
    if state is None:
        # each use case on its own time span of the one clock (keel/clock.py): all start when their history is in
        start, end, spans = shared_spans(
            {z.usecase.name: z.history_landed() for z in zones},
            {z.usecase.name: z.landed_by(z.last_day) for z in zones},
        )
        start = args.start or start
        end = args.end or end
        state = clock.start(start, speed=args.speed or DEFAULT_SPEED, sim_end=end, spans=spans)
        print(f"keel live: clock started at {state.sim_anchor:%Y-%m-%d %H:%M} (×{state.speed:,.0f})", flush=True)
    else:
        if args.speed:
            clock.set_speed(args.speed)
        was = clock.state()
        state = clock.resume()
        at = was.sim_anchor if not was.running else clock.now()
        print(f"keel live: clock resumed at {at:%Y-%m-%d %H:%M} (×{state.speed:,.0f})", flush=True)
    # Ctrl-C (or SIGTERM) asks the loop to stop between deliveries: a day being written is finished (each file is
    # atomic anyway), then the clock pauses. A flag, not KeyboardInterrupt, so the stop never lands half-way.
    stop: list[int] = []

    def request_stop(signum, frame):  # noqa: ARG001
        stop.append(signum)

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop:
            wall = datetime.now(UTC)
            state = clock.state()
            now = state.now(wall)
            for zone in zones:
                for table, days in zone.deliver(state.of(zone.usecase.name).now(wall)).items():
                    if days:
                        span = days[0].isoformat() + (f"…{days[-1].isoformat()}" if len(days) > 1 else "")
                        print(f"  {now:%Y-%m-%d %H:%M} landed {zone.usecase.name}/{table} {span}", flush=True)
            if state.finished(wall):  # everything due by the end has landed (delivered above)
                print(f"keel live: the clock reached {now:%Y-%m-%d %H:%M}: the replay is over", flush=True)
                return EXIT_OK
            time.sleep(args.poll)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    paused = clock.pause()
    print(f"\nkeel live: paused at {paused.sim_anchor:%Y-%m-%d %H:%M}; `keel live run` resumes", flush=True)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from keel.clock import SimClock

    home = home_layout()
    state = SimClock(home.clock).state()
    if state is None:
        print("no live replay: no simulated clock under KEEL_HOME")
        return EXIT_OK
    now = state.now(datetime.now(UTC))
    print(
        f"clock: {now:%Y-%m-%d %H:%M} UTC, {'running' if state.running else 'paused'}, ×{state.speed:,.0f}"
        + (f", ends {state.sim_end:%Y-%m-%d}" if state.sim_end else "")
    )
    for zone in _zones(home, args):
        mine = state.of(zone.usecase.name)  # its own time span on the shared clock (keel/clock.py)
        print(f"  {zone.usecase.name}: {mine.now(datetime.now(UTC)):%Y-%m-%d %H:%M} in its time"
              + (f", ends {mine.sim_end:%Y-%m-%d}" if mine.sim_end else ""))  # fmt: skip
        for month, landed in sorted(zone.landed_by_month().items()):
            days = ", ".join(f"{n} of {t}" for t, n in zip(zone.tables, landed.days, strict=True))
            print(f"    {month}: days landed: {days}")
    return EXIT_OK
