"""What every command group shares: exit codes, where KEEL_HOME is, who is acting, how a verify result is told."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from keel.errors import DataReadError
from keel.sqldb import Location, location_exists

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2


def home_root() -> Path:
    return home_layout().root


def home_layout():
    from keel.home import KeelHome

    return KeelHome.from_env()


def add_usecase_option(parser: argparse.ArgumentParser, *, required: bool = False, every: str = "") -> None:
    """``--usecase NAME``: which installed use case a command acts on. Without it, ``every`` when given (what the
    command then covers), else the one installed (several installed: the command asks to name one)."""
    default = every or "the one $KEEL_USECASES names, else the one installed; name one when several are"
    parser.add_argument("--usecase", required=required, help=f"an installed use case (default: {default})")


def usecase_of(args: argparse.Namespace):
    """The use case ``--usecase`` names, else the one ``$KEEL_USECASES`` limits the platform to (as scripts/up
    plays it), else the one installed (keel.usecase.UseCaseError, exit 2, when several are installed and none is
    named, or the name is unknown: the message lists the installed ones)."""
    from keel.usecase import get, only

    if getattr(args, "usecase", None):
        return get(args.usecase)
    limited = _limited_to()
    return get(limited[0]) if len(limited) == 1 else only()


def _limited_to() -> list[str]:
    from keel.usecase import limited_to

    return limited_to()


def model_usecase(args: argparse.Namespace):
    """The use case whose model ``--model`` names, else the one ``$KEEL_USECASES`` names or the one installed; with
    several installed and none named, a keel.usecase.UseCaseError (exit 2) that lists the models to choose from."""
    from keel.usecase import UseCaseError, by_model, get, installed

    if getattr(args, "model", None):
        return by_model(args.model)
    limited = _limited_to()
    if len(limited) == 1:
        return get(limited[0])
    found = installed()
    if len(found) == 1:
        return next(iter(found.values()))
    served = [uc for uc in found.values() if _served(uc.model.name)]  # installed is not served (issue 49)
    if len(served) == 1:
        return served[0]
    names = ", ".join(sorted(uc.model.name for uc in (served or found.values()))) or "none"
    what = "models are served" if served else "use cases are installed, none served yet; their models"
    raise UseCaseError(f"{len(served or found)} {what} ({names}): name one with --model")


def _served(model: str) -> bool:
    """Whether a runtime of this home serves ``model`` (a routing table for it, in any replica's directory)."""
    from keel.home import KeelHome

    return any(d.routing_of(model).exists() for d in KeelHome.from_env().serving_dirs())


def author_of(args: argparse.Namespace) -> str:
    import getpass

    return args.author or getpass.getuser()


def head_arg(text: str) -> tuple[int, str]:
    """``--head SEQ:HASH`` as argparse takes it (a bad value is a usage error, exit 2)."""
    from keel.chain import parse_head

    try:
        return parse_head(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def report_verify(ok: bool, problems: tuple[str, ...], what: str) -> int:
    """How both hash-chained logs (ledger, policies) report a verify: each problem, then the verdict."""
    for problem in problems:
        print(f"  {problem}")
    print(f"{what}: {'ok' if ok else 'TAMPERED'}")
    return EXIT_OK if ok else EXIT_PROBLEM


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on usage errors, which matches our convention
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"keel: error: {message}\n")


def open_policies(args: argparse.Namespace, *, must_exist: bool = True):
    from keel.policies import PolicyStore

    path = args.store or home_layout().policies
    if must_exist and not location_exists(path, "commits"):
        raise DataReadError(
            f"{path}: no policy store here (pass --store FILE|URL, or set KEEL_HOME / KEEL_CONTROL_PLANE)"
        )
    from keel.registry import versions_lookup

    return PolicyStore(path, versions_of=versions_lookup(args.registry or home_layout().registry))


def ledger_path(args: argparse.Namespace) -> Location:
    return args.ledger or home_layout().ledger
