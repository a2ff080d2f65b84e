"""``keel incidents``: the faults the platform detected, each with its timeline."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from keel.cli.common import EXIT_OK, home_layout


def register(sub) -> None:
    inc = sub.add_parser("incidents", help="the faults the platform detected: detected, located, acted, recovered")
    inc.add_argument("--json", action="store_true", help="one JSON object per incident")
    inc.set_defaults(func=_list)


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
