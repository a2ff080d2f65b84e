"""``keel ledger``: the release ledger, and rollback to the previous release."""

from __future__ import annotations

import argparse
import json

from keel.cli.common import EXIT_OK, EXIT_PROBLEM, Parser, head_arg, home_layout, ledger_path, report_verify
from keel.errors import DataReadError
from keel.sqldb import location_exists, location_of


def register(sub) -> None:
    ledger = sub.add_parser("ledger", help="the release ledger: what was live when, and is the log intact")
    ledger.add_argument(
        "--ledger",
        type=location_of,
        help="ledger: a file or a postgresql:// URL (default: $KEEL_HOME/ledger.sqlite, or $KEEL_CONTROL_PLANE)",
    )
    lsub = ledger.add_subparsers(dest="action", required=True, parser_class=Parser)
    at = lsub.add_parser("at", help="the release of every model live at a UTC instant (ISO 8601)")
    at.add_argument("timestamp")
    at.set_defaults(func=_ledger_at)
    lsub.add_parser("log", help="every entry, oldest first").set_defaults(func=_ledger_log)
    why = lsub.add_parser(
        "why",
        help="the chain that led to a release: drift report → training run → gate → canary policy versions → live",
    )
    why.add_argument("release", help="a release id (rel-…), or 'live' for the newest entry")
    why.add_argument("--model", help="the model (default: the installed use case's)")
    why.set_defaults(func=_ledger_why)
    lverify = lsub.add_parser(
        "verify", help="check the hash chain (exit 1 when an entry was edited, reordered or removed)"
    )
    lverify.add_argument(
        "--head", type=head_arg, metavar="SEQ:HASH",
        help="a head a witness off this machine saw (an alert's witness.ledger): the ledger must hold it",
    )  # fmt: skip
    lverify.set_defaults(func=_ledger_verify)
    rb = sub.add_parser(
        "rollback", help="put the previous release back in service (Triton, routing, registry, ledger)"
    )
    rb.add_argument("--reason", required=True)
    rb.add_argument("--model", help="the model (default: the installed use case's)")
    rb.set_defaults(func=_rollback)


def _open_ledger(args: argparse.Namespace):
    from keel.ledger import Ledger

    path = ledger_path(args)
    if not location_exists(path, "entries"):
        raise DataReadError(f"{path}: no ledger here (pass --ledger FILE|URL, or set KEEL_HOME / KEEL_CONTROL_PLANE)")
    return Ledger(path)


def _print_entry(entry) -> None:
    revert = f" (revert of entry {entry.reverts})" if entry.reverts else ""
    print(f"#{entry.seq} {entry.release_id} live from {entry.live_from.isoformat()}{revert}  hash {entry.hash[:12]}")
    for key, value in entry.manifest.items():
        print(f"    {key}: {json.dumps(value, default=str)}")


def _ledger_at(args: argparse.Namespace) -> int:
    from datetime import datetime

    try:
        when = datetime.fromisoformat(args.timestamp.replace("Z", "+00:00"))
    except ValueError:
        raise DataReadError(f"not an ISO 8601 timestamp: {args.timestamp!r}") from None
    entries = _open_ledger(args).at_each(when)  # one per model: what served each at that instant
    if not entries:
        print(f"nothing was live at {args.timestamp}")
        return EXIT_PROBLEM
    for entry in entries:
        _print_entry(entry)
    return EXIT_OK


def _ledger_log(args: argparse.Namespace) -> int:
    for entry in _open_ledger(args).log():
        _print_entry(entry)
    return EXIT_OK


def _ledger_why(args: argparse.Namespace) -> int:
    args.model = args.model or _model_of_release(args) or _installed_model()
    from keel.deploy.plan import training_asset
    from keel.loop.why import explain, from_loop
    from keel.policies import PolicyStore
    from keel.registry import ModelRegistry

    home = home_layout()
    ledger = _open_ledger(args)
    entries = ledger.log()
    if args.release == "live":  # the model's newest release (the ledger holds every model's)
        matching = ledger.of_line(training_asset(args.model))
    else:
        matching = [e for e in entries if e.release_id == args.release]
    if not matching:
        print(f"no release {args.release} in the ledger ({len(entries)} entries; `keel ledger log` lists them)")
        return EXIT_PROBLEM
    entry = matching[-1]
    sha = (entry.manifest.get("model") or {}).get("parts", {}).get("sha256")
    if not sha:
        print(f"release {entry.release_id} names no model")
        return EXIT_PROBLEM
    with ModelRegistry(home.registry) as registry:
        version = registry.version(args.model, sha)
        metadata = registry.get(args.model, sha).metadata
    commits = []
    store_version = (entry.manifest.get("policy") or {}).get("parts", {}).get("store_version")
    if home.policies.exists():
        with PolicyStore(home.policies) as store:
            for v in range(1, (store_version or store.version()) + 1):
                c = store.commit(v)
                if any(_canary_of(change, args.model, version) for change in c.changes.values()):
                    commits.append((v, c.committed_at.isoformat(timespec="seconds"), c.author, c.reason))
    revert = f" (a revert of entry #{entry.reverts})" if entry.reverts else ""
    print(f"release {entry.release_id}: ledger entry #{entry.seq}{revert}, model v{version} ({sha[:12]})")
    if not from_loop(metadata):
        print("  not trained by the loop: no drift report asked for it (the first model, or promoted by hand)")
    for link in explain(entry.release_id, entry.live_from.isoformat(timespec="seconds"), version, metadata, commits):
        print(f"  {link.step:<13} {link.when:<25} {link.detail}")
    return EXIT_OK


def _ledger_verify(args: argparse.Namespace) -> int:
    result = _open_ledger(args).verify(args.head)
    return report_verify(result.ok, result.problems, f"{result.entries} entries")


def _rollback(args: argparse.Namespace) -> int:
    args.model = args.model or _installed_model()
    from keel.clock import SimClock
    from keel.deploy.runtime import load_deployer
    from keel.ledger import Ledger
    from keel.registry import ModelRegistry
    from keel.rollback import rollback
    from keel.usecase import by_model

    home = home_layout()
    ledger_path = home.ledger
    if not ledger_path.exists():
        raise DataReadError(f"{ledger_path}: no ledger here (set KEEL_HOME)")
    with ModelRegistry(home.registry) as registry, Ledger(ledger_path) as ledger:
        deployer = load_deployer(home.serving.root, args.model, len(by_model(args.model).features.names))
        uc = by_model(args.model)
        when = SimClock(home.clock, uc.name).now()  # a live replay's simulated now in the model's time span
        result = rollback(registry, ledger, deployer, args.model, args.reason, live_from=when)
    print(
        f"rolled back {result.replaced.release_id} → {result.restored.release_id} "
        f"(ledger entry #{result.restored.seq}, reverts #{result.restored.reverts}); "
        f"routing generation {result.report.generation}, loaded {list(result.report.loaded)}"
    )
    return EXIT_OK


def _model_of_release(args: argparse.Namespace) -> str | None:
    """The model a named release is of (its model part's training asset, ``<use case>/<asset>``), when installed."""
    from keel.ledger import model_line
    from keel.usecase import installed

    if args.release == "live":
        return None
    lines = {model_line(e.manifest) for e in _open_ledger(args).log() if e.release_id == args.release}
    found = [uc.model.name for uc in installed().values() if uc.training_asset in lines]
    return found[0] if len(found) == 1 else None


def _installed_model() -> str:
    from keel.cli.common import model_usecase

    return model_usecase(argparse.Namespace()).model.name


def _canary_of(change: dict, model: str, version: int) -> bool:
    """A committed change that is a canary of ``model`` rolling out ``version`` (whatever it is called: the loop's
    ``<model>.loop-v<N>``, a drill's, one started by hand)."""
    body = change.get("body") or {}
    return change.get("type") == "canary" and body.get("model") == model and body.get("challenger_version") == version
