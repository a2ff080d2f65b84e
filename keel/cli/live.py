"""``keel live``: the live replay's clock and deliveries — 2013 replayed as a live year.

``keel live run`` starts the simulated clock (or resumes it where it stopped) and plays the upstream systems: each
local day of each landed source of the use case lands in ``$KEEL_HOME/landing`` when it is due on the simulated
clock (January to March at once, as history). Dagster's landing sensor picks each delivery up. Ctrl-C pauses the clock; running it
again resumes. ``keel live status`` says where the clock and the landing zone are.
"""

from __future__ import annotations

import argparse
import signal
import time
from datetime import UTC, datetime

from keel.cli.common import EXIT_OK, home_layout


def register(sub) -> None:
    live = sub.add_parser("live", help="replay 2013 as a live year: the simulated clock and the landing zone")
    cmds = live.add_subparsers(dest="live_command", required=True)
    run = cmds.add_parser("run", help="start (or resume) the clock and deliver each day as it comes due")
    run.add_argument("--from", dest="start", default="2013-04-01", help="simulated start (default 2013-04-01)")
    run.add_argument("--to", dest="end", default="2014-01-01", help="simulated end (default 2014-01-01)")
    run.add_argument(
        "--speed", type=float, default=None, help="simulated seconds per wall second (default: Apr–Dec in 20 min)"
    )
    run.add_argument("--poll", type=float, default=1.0, help="wall seconds between deliveries (default 1)")
    run.set_defaults(func=_run)
    status = cmds.add_parser("status", help="the clock and what has landed")
    status.set_defaults(func=_status)


def _day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _run(args: argparse.Namespace) -> int:
    from keel.clock import DEFAULT_SPEED, SimClock
    from keel.data.landing import LandingZone
    from keel.usecase import only

    home = home_layout()
    clock, zone = SimClock(home.clock), LandingZone(home.landing, only())
    state = clock.state()
    if state is None:
        state = clock.start(_day(args.start), speed=args.speed or DEFAULT_SPEED, sim_end=_day(args.end))
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
            now = clock.state().now(wall)
            for table, days in zone.deliver(now).items():
                if days:
                    span = days[0].isoformat() + (f"…{days[-1].isoformat()}" if len(days) > 1 else "")
                    print(f"  {now:%Y-%m-%d %H:%M} landed {table} {span}", flush=True)
            if clock.state().finished(wall):  # everything due by the end has landed (delivered above)
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
    from keel.data.landing import LandingZone
    from keel.usecase import only

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
    for month, landed in sorted(LandingZone(home.landing, only()).landed_by_month().items()):
        zone = LandingZone(home.landing, only())
        days = ", ".join(f"{n} of {t}" for t, n in zip(zone.tables, landed.days, strict=True))
        print(f"  {month}: days landed: {days}")
    return EXIT_OK
