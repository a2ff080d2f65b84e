"""Where the Triton binary comes from: the ``tritonserver`` build inside PyPI's nvidia-pytriton wheel, taken out of
the wheel rather than installed — keel serves through its own native backend (gpu_runtime/backend/), so the model
runtime needs no Python environment of its own and runs from the main one (numpy 2).

``python -m gpu_runtime.triton_dist`` (scripts/setup runs it) downloads the wheel pinned with its sha256 in
``gpu_runtime/triton-wheel.txt`` (``pip download --require-hashes --no-deps``) and extracts two of its folders into
``.keel-triton/`` (``$KEEL_TRITON_HOME`` elsewhere), keeping the wheel's layout — the binary's RPATH finds its
bundled libraries at ``bin/../../../nvidia_pytriton.libs``:

    .keel-triton/pytriton/tritonserver/   bin/tritonserver, backends/python, caches/local, python_backend_stubs/
    .keel-triton/nvidia_pytriton.libs/    libtritonserver and what it links (auditwheel-bundled)

A stamp (the pin's hash) makes it idempotent; the build is extracted beside the folder and moved into place, so a
crash mid-extract leaves the previous one (or, between the two renames, none: the next set-up fetches it again). Triton's Python backend is an explicit option (``ServingConfig(backend="python")``): it needs an
interpreter with numpy < 2 and lightgbm, named by ``$KEEL_RUNTIME_PYTHON`` (``scripts/python-backend-env`` makes
one, ``.venv-pybackend``); nothing by default loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from keel.errors import KeelError

REPO_ROOT = Path(__file__).resolve().parent.parent
PIN = REPO_ROOT / "gpu_runtime" / "triton-wheel.txt"
MEMBERS = ("pytriton/tritonserver/", "nvidia_pytriton.libs/")
STAMP = ".keel-stamp"
EXTRACTION = 2  # bumped when what the extraction writes changes (2: file modes never world-writable)


class TritonDistError(KeelError):
    """The Triton binary is not where keel looks, or could not be fetched."""


def triton_home() -> Path:
    return Path(os.environ.get("KEEL_TRITON_HOME") or REPO_ROOT / ".keel-triton")


def pin_stamp() -> str:
    return hashlib.sha256(PIN.read_bytes() + f"extraction {EXTRACTION}".encode()).hexdigest()[:16]


def pinned_version() -> str:
    """The pinned wheel's version, e.g. ``nvidia-pytriton 0.7.0``."""
    for line in PIN.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            return line.split()[0].replace("==", " ")
    raise TritonDistError(f"{PIN}: no requirement line")


@dataclass(frozen=True)
class TritonDist:
    """The extracted binary: its server folder (bin/, backends/, caches/, python_backend_stubs/), the folder of its
    bundled libraries, and the wheel it came from."""

    server: Path
    libs: Path
    version: str


def triton_dist(home: Path | None = None) -> TritonDist:
    home = home or triton_home()
    server = home / "pytriton" / "tritonserver"
    if not (server / "bin" / "tritonserver").exists():
        raise TritonDistError(
            f"no Triton binary at {server / 'bin' / 'tritonserver'}: run scripts/setup "
            "(or .venv/bin/python -m gpu_runtime.triton_dist)"
        )
    stamp = home / STAMP
    if not stamp.exists() or stamp.read_text().strip() != pin_stamp():
        raise TritonDistError(f"{home} holds another build than {PIN.name} pins: run scripts/setup again")
    return TritonDist(server, home / "nvidia_pytriton.libs", pinned_version())


@dataclass(frozen=True)
class PythonBackendEnv:
    """The interpreter Triton's Python backend runs models in (the explicit option): its version and paths."""

    python: Path
    version: str  # "3.11"
    libdir: str
    site_packages: str
    bindir: str


def python_backend_env() -> PythonBackendEnv | None:
    """``$KEEL_RUNTIME_PYTHON``'s environment, or None when it is unset (the default: no Python backend)."""
    value = os.environ.get("KEEL_RUNTIME_PYTHON")
    if not value:
        return None
    python = Path(value)
    code = (
        "import json, sys, sysconfig, pathlib, numpy, lightgbm;"
        "print(json.dumps({'version': f'{sys.version_info[0]}.{sys.version_info[1]}', 'numpy': numpy.__version__,"
        "'libdir': sysconfig.get_config_var('LIBDIR'), 'site_packages': sysconfig.get_paths()['purelib'],"
        "'bindir': str(pathlib.Path(sys.executable).parent)}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True) if python.exists() else None
    if out is None or out.returncode != 0:
        why = "does not exist" if out is None else out.stderr.strip().splitlines()[-1]
        raise TritonDistError(f"KEEL_RUNTIME_PYTHON={python}: {why} (scripts/python-backend-env makes one)")
    info = json.loads(out.stdout)
    if int(info["numpy"].split(".")[0]) >= 2:
        raise TritonDistError(
            f"KEEL_RUNTIME_PYTHON={python} has numpy {info['numpy']}: Triton's Python backend needs numpy < 2"
        )
    return PythonBackendEnv(python, info["version"], info["libdir"], info["site_packages"], info["bindir"])


def _extract(wheel: Path, dest: Path) -> int:
    """The wheel's server and library folders into ``dest``, with their file modes (zip keeps them)."""
    n = 0
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.infolist():
            if not member.filename.startswith(MEMBERS) or member.is_dir():
                continue
            target = dest / member.filename
            if not target.resolve().is_relative_to(dest.resolve()):
                raise TritonDistError(f"{wheel.name}: member {member.filename!r} leaves the folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (member.external_attr >> 16) & 0o777
            os.chmod(target, (mode or 0o644) & 0o755)  # never world-writable
            n += 1
    return n


def install(home: Path | None = None) -> Path:
    """Fetch and extract the pinned build into ``home`` unless it is there already."""
    home = home or triton_home()
    if (home / STAMP).exists() and (home / STAMP).read_text().strip() == pin_stamp():
        print(f"keel setup: Triton binary is up to date ({pinned_version()}, {home})", flush=True)
        return home
    print(f"keel setup: fetching the Triton binary ({pinned_version()}, ~55 MB) into {home}", flush=True)
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent, prefix=".keel-triton-") as tmp:
        wheels = Path(tmp) / "wheel"
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--require-hashes", "-r", str(PIN), "-d", str(wheels)]  # fmt: skip
        done = subprocess.run(pip, capture_output=True, text=True)
        if done.returncode != 0:
            raise TritonDistError(f"pip download of {PIN.name} failed:\n{done.stderr.strip()[-2000:]}")
        [wheel] = wheels.glob("*.whl")
        staged = Path(tmp) / "home"
        n = _extract(wheel, staged)
        (staged / STAMP).write_text(pin_stamp() + "\n")
        old = Path(tmp) / "old"
        if home.exists():
            os.rename(home, old)  # the previous build stays readable until the new one is in place
        os.rename(staged, home)
    print(f"keel setup: Triton binary ready ({n} files, {home / 'pytriton/tritonserver/bin/tritonserver'})")
    return home


if __name__ == "__main__":
    try:
        install()
    except TritonDistError as exc:
        print(f"keel setup: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
