"""``keel new`` end to end: read the table, profile it, plan, render, write the package and register it.

``origin_of`` says where the generated reader finds the table: a file inside an installed distribution becomes that
distribution's exact pin in the package's requirements (``requirements-no-deps.txt`` when its own dependencies are
not all installed — keel reads only its data), any other file is copied into the package's ``data/`` folder.
``register`` adds the entry point to pyproject.toml's ``keel.usecases`` section (the set-up refreshes entry points in
place). Writes are atomic; an existing package is never overwritten (``force`` replaces the generated files only).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import polars as pl

from keel.new.plan import Options, Plan, plan
from keel.new.profile import TableProfile, describe, profile_table
from keel.new.render import Origin, render
from keel.storage import write_text_atomic
from keel.usecase import USECASE_NAME

SECTION = '[project.entry-points."keel.usecases"]'


class NewError(ValueError):
    """keel new cannot go on (a bad name, an unreadable file, a package that exists)."""


def read_text_table(path: Path) -> pl.DataFrame:
    """The table as text (every column a string), the way the generated reader reads it."""
    fmt = table_format(path)
    try:
        if fmt == "csv":
            return pl.read_csv(path, infer_schema=False)
        return pl.read_parquet(path).select(pl.all().cast(pl.String))
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise NewError(f"{path}: cannot read it as {fmt}: {exc}") from None


def table_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".parquet"):
        return "parquet"
    raise NewError(f"{path}: keel new reads a .csv or .parquet file")


def origin_of(path: Path) -> Origin:
    path = path.resolve()
    fmt = table_format(path)
    for site in map(Path, sys.path):
        try:
            rel = path.relative_to(site.resolve())
        except (ValueError, OSError):
            continue
        if not (site.name in ("site-packages", "dist-packages") and len(rel.parts) > 1):
            continue
        module = rel.parts[0]
        dists = metadata.packages_distributions().get(module, [])
        if not dists:
            continue
        dist = metadata.distribution(dists[0])
        unmet = _unmet(dist)
        resource = "/".join(rel.parts[1:])
        return Origin(fmt, f"PyPI {dist.metadata['Name']}=={dist.version} ({module}/{resource})",
                      dist.metadata["Name"], dist.version, module, resource, bool(unmet), unmet)  # fmt: skip
    return Origin(fmt, f"the file {path.name}, shipped in this package (data/{path.name})", copied=path.name)


def _unmet(dist) -> tuple[str, ...]:
    from packaging.requirements import Requirement

    out = []
    for line in dist.requires or ():
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            out.append(req.name)
    return tuple(out)


@dataclass(frozen=True)
class Result:
    profile: TableProfile
    plan: Plan
    files: dict[str, str]  # relative to the package folder
    origin: Origin
    folder: Path


def build(path: Path, opts: Options, root: Path, command: str, progress=print) -> Result:
    if not USECASE_NAME.fullmatch(opts.name):
        raise NewError(f"use case name {opts.name!r}: 1…31 of a-z 0-9 _, starting with a letter")
    progress(f"keel new: reading {path}")
    text = read_text_table(path)
    progress(f"keel new: profiling {text.height:,} rows × {text.width} columns")
    try:
        profile, typed = profile_table(text, opts.time)
        if opts.months and len(profile.time.months) > opts.months:
            keep = profile.time.months[-opts.months :]
            at = typed[profile.time.column]
            month = (at.dt.date() if at.dtype != pl.Date else at).dt.strftime("%Y-%m")
            progress(f"keel new: {len(profile.time.months)} months in the table: the latest {opts.months} "
                     f"({keep[0]} … {keep[-1]}; --months says how many)")  # fmt: skip
            text = text.filter(month.is_in(list(keep)))
            profile, typed = profile_table(text, opts.time)
        chosen = plan(profile, typed, opts)
    except ValueError as exc:
        raise NewError(str(exc)) from None
    origin = origin_of(path)
    files = render(chosen, origin, command, describe(profile))
    return Result(profile, chosen, files, origin, root / "usecases" / opts.name)


def write(result: Result, source: Path, root: Path, *, force: bool = False, progress=print) -> list[Path]:
    folder = result.folder
    if folder.exists() and not force:
        raise NewError(f"{folder} exists: choose another name, or --force to replace its generated files")
    written = []
    package_root = folder.parent / "__init__.py"
    if not package_root.exists():  # a fresh folder: usecases/ becomes the package its use cases are imported from
        folder.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(
            '"""The use cases of this repository, one package each (docs/usecases.md)."""\n', package_root
        )
    for rel, text in result.files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(text, target)
        written.append(target)
    if result.origin.copied:
        (folder / "data").mkdir(exist_ok=True)
        shutil.copyfile(source, folder / "data" / result.origin.copied)
        written.append(folder / "data" / result.origin.copied)
    _format([p for p in written if p.suffix == ".py"])
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and register(pyproject, result.plan.name):
        progress(f"keel new: {pyproject} names {result.plan.name} in its keel.usecases entry points")
    return written


def _format(paths: list[Path]) -> None:
    """Format the generated modules with ruff when it is installed (the repository's style); else leave them."""
    ruff = shutil.which("ruff") or str(Path(sys.prefix) / "bin" / "ruff")
    if paths and Path(ruff).is_file():
        subprocess.run([ruff, "format", "-q", *map(str, paths)], check=False, capture_output=True)


def register(pyproject: Path, name: str) -> bool:
    """Add ``name = "usecases.<name>:usecase"`` to the ``keel.usecases`` entry points; False when it is there."""
    text = pyproject.read_text()
    line = f'{name} = "usecases.{name}:usecase"'
    if re.search(rf"^{re.escape(name)}\s*=", text.split(SECTION, 1)[-1].split("\n[", 1)[0], re.M):
        return False
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n{line}\n"
    else:
        head, rest = text.split(SECTION, 1)
        body, sep, tail = rest.partition("\n[")
        text = head + SECTION + body.rstrip("\n") + f"\n{line}\n" + (f"\n[{tail}" if sep else "")
    write_text_atomic(text, pyproject)
    return True
