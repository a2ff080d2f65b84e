"""``keel policy``: versioned serving policies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from keel.cli.common import EXIT_OK, EXIT_PROBLEM, Parser, author_of, head_arg, open_policies, report_verify
from keel.errors import DataReadError
from keel.sqldb import location_of


def register(sub) -> None:
    policy = sub.add_parser("policy", help="versioned serving policies: show, log, diff, commit, revert, at")
    policy.add_argument(
        "--store",
        type=location_of,
        help="policy store: a file or a postgresql:// URL (default: $KEEL_HOME/policies.sqlite, or $KEEL_CONTROL_PLANE)",
    )
    policy.add_argument(
        "--registry", type=Path, help="model registry to check model versions against (default: $KEEL_HOME/registry)"
    )
    psub = policy.add_subparsers(dest="action", required=True, parser_class=Parser)
    show = psub.add_parser("show", help="every policy as of the latest version (or --version)")
    show.add_argument("--version", type=int)
    show.set_defaults(func=_policy_show)
    psub.add_parser("log", help="every commit, oldest first").set_defaults(func=_policy_log)
    pdiff = psub.add_parser("diff", help="what differs between two versions")
    pdiff.add_argument("a", type=int)
    pdiff.add_argument("b", type=int)
    pdiff.set_defaults(func=_policy_diff)
    pcommit = psub.add_parser("commit", help="validate and commit a policy file (YAML)")
    pcommit.add_argument("file", type=Path)
    pcommit.add_argument("--reason", required=True)
    pcommit.add_argument("--author", help="default: $USER")
    pcommit.set_defaults(func=_policy_commit)
    prevert = psub.add_parser("revert", help="a new commit setting every policy back to VERSION")
    prevert.add_argument("version", type=int)
    prevert.add_argument("--reason", required=True)
    prevert.add_argument("--author", help="default: $USER")
    prevert.set_defaults(func=_policy_revert)
    pat = psub.add_parser("at", help="the policies in force at a UTC instant (ISO 8601)")
    pat.add_argument("timestamp")
    pat.set_defaults(func=_policy_at)
    pverify = psub.add_parser("verify", help="check the hash chain and SQLite integrity (exit 1 on a problem)")
    pverify.add_argument(
        "--head", type=head_arg, metavar="SEQ:HASH",
        help="a head a witness off this machine saw (an alert's witness.policies): the store must hold it",
    )  # fmt: skip
    pverify.set_defaults(func=_policy_verify)


def _print_policies(version: int, policies: dict) -> None:
    print(f"policy version {version}")
    for name, p in policies.items():
        print(f"  {name} ({p.type}, set in version {p.version}): {json.dumps(p.body, sort_keys=True)}")


def _policy_show(args: argparse.Namespace) -> int:
    store = open_policies(args)
    version = args.version if args.version is not None else store.version()
    if version > store.version() or version < 0:
        raise DataReadError(f"no policy version {version} (latest is {store.version()})")
    policies = store.state(version)
    _print_policies(version, policies)
    problems = store.state_problems(policies)
    for problem in problems:
        print(f"keel policy show: WARNING: {problem}", file=sys.stderr)
    if problems:
        print("keel policy show: what is shown cannot be trusted; run `keel policy verify`", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK


def _policy_log(args: argparse.Namespace) -> int:
    for c in open_policies(args).log():
        revert = f" (revert to {c.reverts})" if c.reverts else ""
        print(
            f"#{c.version} {c.committed_at.isoformat()} {c.author}{revert}: {c.reason}  [{', '.join(c.changes)}]"
            f"  hash {c.hash[:12]}"
        )
    return EXIT_OK


def _policy_diff(args: argparse.Namespace) -> int:
    store = open_policies(args)
    changes = store.diff(args.a, args.b)
    for name, (pa, pb) in changes.items():
        print(f"{name}:")
        print(f"  - {json.dumps(pa.body, sort_keys=True) if pa else '(absent)'}")
        print(f"  + {json.dumps(pb.body, sort_keys=True) if pb else '(absent)'}")
    print(f"{len(changes)} policies differ between versions {args.a} and {args.b}")
    return EXIT_OK


def _policy_commit(args: argparse.Namespace) -> int:
    from keel.policies import load_policy_file

    changes, expected = load_policy_file(args.file)
    store = open_policies(args, must_exist=False)
    c = store.apply(changes, author=author_of(args), reason=args.reason, expected_version=expected)
    print(f"committed policy version {c.version}: {', '.join(c.changes)}  hash {c.hash[:12]}")
    return EXIT_OK


def _policy_revert(args: argparse.Namespace) -> int:
    c = open_policies(args).revert(args.version, author=author_of(args), reason=args.reason)
    print(f"committed policy version {c.version}: reverted {', '.join(c.changes)} to version {args.version}")
    return EXIT_OK


def _policy_at(args: argparse.Namespace) -> int:
    try:
        version, policies = open_policies(args).at(args.timestamp)
    except ValueError:
        raise DataReadError(f"not an ISO 8601 timestamp: {args.timestamp!r}") from None
    if version == 0:
        print(f"no policy was committed by {args.timestamp}")
        return EXIT_PROBLEM
    _print_policies(version, policies)
    return EXIT_OK


def _policy_verify(args: argparse.Namespace) -> int:
    result = open_policies(args).verify(args.head)
    return report_verify(result.ok, result.problems, f"{result.commits} commits")
