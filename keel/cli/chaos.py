"""``keel chaos``: inject a real fault into the running platform and watch it detect, locate and undo it."""

from __future__ import annotations

import argparse
import json

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM, add_usecase_option, home_layout, usecase_of


def register(sub) -> None:
    from keel.chaos import DRILLS

    chaos = sub.add_parser("chaos", help="chaos drills: inject a fault, watch the platform undo it (docs/alerts.md)")
    csub = chaos.add_subparsers(dest="action", required=True)
    run = csub.add_parser("run", help="inject one drill's fault and watch its incident until it is recovered")
    run.add_argument("drill", choices=DRILLS)
    run.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the recovery (default 600)")
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_usecase_option(run)  # whose deliveries and model the drill breaks
    run.set_defaults(func=_run)
    lst = csub.add_parser("list", help="the drills and what each injects")
    lst.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:  # noqa: ARG001
    from keel import chaos

    for line in chaos.__doc__.splitlines():
        if line.startswith("| ``"):
            cells = [c.strip().replace("``", "") for c in line.strip("|").split("|")]
            print(f"{cells[0]:<22} {cells[1]}\n{'':<22} → {cells[2]}")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from keel.chaos import DrillError, run_drill

    home = home_layout()
    say = (lambda m: None) if args.json else (lambda m: print(f"keel chaos {args.drill}: {m}", flush=True))
    try:
        result = run_drill(args.drill, home, usecase_of(args), args.timeout, progress=say)
    except DrillError as exc:
        print(f"keel chaos: {exc}")
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(result.as_dict(), default=str))
    else:
        i = result.incident
        if i is None:
            print(
                f"keel chaos {args.drill}: NOT DETECTED within {args.timeout:.0f} s (no incident {result.injection.incident_key})"
            )
        else:
            print(f"keel chaos {args.drill}: incident {i.key} — {'recovered' if not i.open else 'NOT recovered'}")
            print(f"    located    {i.located}")
            print(f"    action     {i.action}")
            if result.traffic is not None:
                t = result.traffic
                usual = t.get("baseline_degraded_share")
                print(f"    traffic    {t['answered']} answered, {t['failed']} failed {t['by_error'] or ''}, "
                      f"{t['degraded']} degraded"
                      + (f" (before the drill {usual:.0%} of answers were)" if usual is not None else ""))  # fmt: skip
    return EXIT_OK if result.recovered else EXIT_PROBLEM
