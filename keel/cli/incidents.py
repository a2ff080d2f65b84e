"""``keel incidents``: the faults the platform detected, each with its timeline."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, home_layout


def register(sub) -> None:
    inc = sub.add_parser("incidents", help="the faults the platform detected: detected, located, acted, recovered")
    inc.add_argument("--json", action="store_true", help="one JSON object per incident")
    inc.set_defaults(func=_list)
    actions = inc.add_subparsers(dest="incident_action")
    res = actions.add_parser("resolve", help="close an open incident by hand (a fault waived or fixed elsewhere: a "
                                             "held-back delivery that will not be sent again), saying why")  # fmt: skip
    res.add_argument("key", help="the incident's key (delivery:<use case>:<table>:<day>, …) or #id")
    res.add_argument("--reason", required=True)
    res.add_argument("--author", help="default: $USER")
    res.set_defaults(func=_resolve)


def _resolve(args: argparse.Namespace) -> int:
    from keel.cli.common import author_of
    from keel.clock import SimClock
    from keel.incidents import IncidentLog

    home = home_layout()
    if not home.incidents.exists():
        print("keel: no incidents recorded", file=sys.stderr)
        return EXIT_BAD_INPUT
    now = SimClock(home.clock).now().isoformat(timespec="seconds")  # the replay's time, as the sensors record
    with IncidentLog(home.incidents) as log:
        key = args.key
        if key.startswith("#"):
            found = [i.key for i in log.list() if f"#{i.id}" == key]
            key = found[0] if found else key
        try:
            incident = log.resolve(key, args.reason, author_of(args), now)
        except (KeyError, ValueError) as exc:
            print(f"keel: {exc.args[0]}", file=sys.stderr)
            return EXIT_BAD_INPUT
    print(f"#{incident.id} {incident.key}: resolved at {incident.recovered_at} ({incident.action})")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    from keel.incidents import IncidentLog

    home = home_layout()
    if not home.incidents.exists():
        print("no incidents recorded")
        return EXIT_OK
    with IncidentLog(home.incidents) as log:
        incidents = log.list()
    for i in incidents:
        if args.json:
            print(json.dumps(asdict(i), default=str))
            continue
        state = "open" if i.open else "recovered"
        print(f"#{i.id} [{i.severity}] {i.kind}: {i.summary} ({state})")
        for label, value in (
            ("injected", i.injected_at),
            ("detected", i.detected_at),
            ("located", i.located),
            ("acted", f"{i.acted_at}: {i.action}" if i.acted_at else None),
            ("recovered", i.recovered_at),
            ("requests", f"{i.requests_failed} failed, {i.requests_degraded} degraded"
             if i.requests_failed is not None else None),
        ):  # fmt: skip
            if value:
                print(f"    {label:<10} {value}")
    if not incidents:
        print("no incidents recorded")
    return EXIT_OK
