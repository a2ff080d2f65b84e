"""The ``keel`` command line: one module per command group (contracts, drift, ledger and rollback, lineage, policy,
tenant, experiment, k8s, live, incidents, chaos, usage and cost, explain), each with its ``register(sub)``.

Exit codes, the same for every command: 0 ok, 1 the check found a problem, 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import sys

from keel import __version__
from keel.cli import (
    chaos,
    contracts,
    drift,
    experiment,
    explain,
    incidents,
    k8s,
    ledger,
    lineage,
    live,
    metering,
    new,
    policy,
    tenants,
)
from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM, Parser
from keel.cli.contracts import partition_window
from keel.errors import KeelError

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_PROBLEM", "build_parser", "main", "partition_window"]
GROUPS = (contracts, drift, ledger, lineage, policy, tenants, experiment, k8s, live, incidents, chaos, metering,
          explain, new)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="keel", description="keel: an AI-engineering platform on Dagster assets.")
    parser.add_argument("--version", action="version", version=f"keel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeelError as exc:
        print(f"keel: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
