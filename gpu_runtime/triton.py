"""The Triton Inference Server process: start, stop, health, explicit load/unload, readiness.

The binary is the ``tritonserver`` shipped inside PyPI's nvidia-pytriton, installed in the runtime environment
(.venv-runtime, numpy<2). ``prepare_dist`` copies its server directory into keel's work dir with the Python
backend stub for the runtime's Python version (what pytriton itself does), and the process gets:

- ``LD_LIBRARY_PATH``: the runtime interpreter's lib directory first (the stub must load *that* libpython, not
  the system one), then the wheel's bundled libraries;
- ``PYTHONPATH``: the runtime environment's site-packages (numpy<2, lightgbm), ``PATH``: its bin directory.

Every endpoint binds 127.0.0.1. The model-repository API (load/unload/index) is restricted: requests need the
header ``keel-admin-key: <KEEL_TRITON_ADMIN_KEY>``, a secret taken from the environment (generated when unset), so
the gateway — which only infers — cannot load or unload models. tritonserver takes that key only as a command-line
argument, which any local user can read in /proc; so the moment the server is live, its parent overwrites the key
in the child's argument memory (``hide_admin_key``: /proc/<pid>/mem, which a parent may write) and checks
/proc/<pid>/cmdline no longer shows it. What remains is the window between exec and live (docs/serving.md).

The server dies with the process that started it (PR_SET_PDEATHSIG), and its process group id is kept in
``tritonserver.pid`` so that a later start can stop one left behind by a crash (gpu_runtime/process.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_runtime.process import die_with_parent, hide_admin_key
from keel.errors import KeelError

REPO_ROOT = Path(__file__).resolve().parent.parent
ADMIN_HEADER = "keel-admin-key"
ADMIN_KEY_ENV = "KEEL_TRITON_ADMIN_KEY"


class TritonError(KeelError):
    """Triton did not start, a model did not load, or the runtime environment is missing."""


def runtime_python() -> Path:
    """The runtime environment's interpreter: $KEEL_RUNTIME_PYTHON, else .venv-runtime in the repository."""
    path = Path(os.environ.get("KEEL_RUNTIME_PYTHON") or REPO_ROOT / ".venv-runtime" / "bin" / "python")
    if not path.exists():
        raise TritonError(f"no runtime environment at {path}: run scripts/setup (it creates .venv-runtime)")
    return path


@dataclass(frozen=True)
class RuntimeInfo:
    python: Path
    version: str  # "3.11"
    libdir: str
    site_packages: str
    bindir: str
    pytriton: str
    triton_version: str


def runtime_info(python: Path | None = None) -> RuntimeInfo:
    python = python or runtime_python()
    code = (
        "import json, sys, sysconfig, pathlib, importlib.metadata as md, pytriton;"
        "print(json.dumps({'version': f'{sys.version_info[0]}.{sys.version_info[1]}',"
        "'libdir': sysconfig.get_config_var('LIBDIR'), 'site_packages': sysconfig.get_paths()['purelib'],"
        "'bindir': str(pathlib.Path(sys.executable).parent), 'pytriton': str(pathlib.Path(pytriton.__file__).parent),"
        "'pytriton_version': md.version('nvidia-pytriton')}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise TritonError(f"{python}: cannot find nvidia-pytriton in the runtime environment: {out.stderr.strip()}")
    info = json.loads(out.stdout)
    return RuntimeInfo(
        python=python,
        version=info["version"],
        libdir=info["libdir"],
        site_packages=info["site_packages"],
        bindir=info["bindir"],
        pytriton=info["pytriton"],
        triton_version=f"pytriton {info['pytriton_version']}",
    )


NATIVE_BACKEND_LIB = REPO_ROOT / "gpu_runtime" / "backend" / "build" / "keel_lightgbm" / "libtriton_keel_lightgbm.so"


def native_backend_lib() -> Path:
    """keel's native backend library, as scripts/setup builds it (gpu_runtime/backend/Makefile)."""
    if not NATIVE_BACKEND_LIB.exists():
        raise TritonError(
            f"the native backend is not built ({NATIVE_BACKEND_LIB.relative_to(REPO_ROOT)} is missing): run "
            "scripts/setup, or make -C gpu_runtime/backend LIGHTGBM_LIB=<lightgbm's lib directory>"
        )
    return NATIVE_BACKEND_LIB


def install_native_backend(dist: Path) -> None:
    """Put the built backend into the server's backend directory (``backends/keel_lightgbm/``), replacing an older
    build atomically — a server that has it loaded keeps its mapped copy."""
    lib = native_backend_lib()
    dest = dist / "backends" / "keel_lightgbm" / lib.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and dest.read_bytes() == lib.read_bytes():
        return
    tmp = dest.with_name(f".{lib.name}.{os.getpid()}")
    shutil.copy2(lib, tmp)
    os.replace(tmp, dest)


def prepare_dist(work_dir: Path, info: RuntimeInfo) -> Path:
    """Copy the wheel's tritonserver directory (once) with the Python stub for the runtime's Python version, and
    keel's native backend (every time: a rebuilt backend replaces the copy)."""
    dest = work_dir / f"tritonserver-py{info.version}"
    stub_dst = dest / "backends" / "python" / "triton_python_backend_stub"
    if stub_dst.exists():
        install_native_backend(dest)
        return dest
    src = Path(info.pytriton) / "tritonserver"
    tmp = work_dir / f".tritonserver-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("python_backend_stubs"))
    shutil.copy2(
        src / "python_backend_stubs" / info.version / "triton_python_backend_stub", tmp / "backends" / "python"
    )
    try:
        os.rename(tmp, dest)
    except OSError:  # another process prepared it first
        shutil.rmtree(tmp, ignore_errors=True)
    install_native_backend(dest)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """One tritonserver process in explicit model-control mode, bound to 127.0.0.1."""

    def __init__(
        self,
        repository: str | Path,
        work_dir: str | Path,
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        admin_key: str | None = None,
        log_verbose: int = 0,
        grpc_address: str = "127.0.0.1",
    ):
        self.repository = Path(repository).resolve()
        self.grpc_address = grpc_address  # 0.0.0.0 for a replica that deployments reach from other machines
        self.work_dir = Path(work_dir).resolve()
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV) or secrets.token_hex(16)
        self.log_verbose = log_verbose
        self.proc: subprocess.Popen | None = None
        self.log_path = self.work_dir / "tritonserver.log"
        self.info: RuntimeInfo | None = None
        self.admin_key_hidden = False  # True once the key is gone from tritonserver's command line

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def command(self, dist: Path) -> list[str]:
        return [
            str(dist / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            f"--backend-directory={dist / 'backends'}",
            f"--cache-directory={dist / 'caches'}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.grpc_address}",
            f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--exit-on-error=false",
            "--strict-readiness=false",
            "--disable-auto-complete-config",
            f"--grpc-restricted-protocol=model-repository:{ADMIN_HEADER}={self.admin_key}",
            f"--http-restricted-api=model-repository:{ADMIN_HEADER}={self.admin_key}",
            f"--log-verbose={self.log_verbose}",
        ]

    def env(self, info: RuntimeInfo) -> dict[str, str]:
        libs = str(Path(info.site_packages) / "nvidia_pytriton.libs")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (info.libdir, libs, env.get("LD_LIBRARY_PATH")) if p)
        env["PYTHONPATH"] = info.site_packages
        env["PATH"] = f"{info.bindir}:{env.get('PATH', '')}"
        env["PYTHONNOUSERSITE"] = "1"
        env.pop("PYTHONHOME", None)
        return env

    def start(self, timeout: float = 60.0) -> TritonServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.repository.mkdir(parents=True, exist_ok=True)
        self.info = runtime_info()
        dist = prepare_dist(self.work_dir, self.info)
        log = open(self.log_path, "ab")
        setpriv = shutil.which("setpriv")  # util-linux: sets the death signal, then execs (same pid)
        self.proc = subprocess.Popen(
            [setpriv, "--pdeathsig", "KILL", *self.command(dist)] if setpriv else self.command(dist),
            env=self.env(self.info),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its Python stubs are children: stop them as a group
            preexec_fn=None if setpriv else die_with_parent,  # preexec_fn is not thread-safe: only as a fallback
        )
        log.close()
        (self.work_dir / "tritonserver.pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + timeout
        while not self.live():
            if self.proc.poll() is not None:
                raise TritonError(f"tritonserver exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TritonError(f"tritonserver not live after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)
        self.admin_key_hidden = hide_admin_key(self.proc.pid, self.admin_key)
        return self

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0

    def live(self) -> bool:
        return self._get("/v2/health/live") == 200

    def client(self) -> TritonControl:
        return TritonControl(self.grpc_url, self.admin_key)


class TritonControl:
    """Model control and readiness against a running server (this process, or one started elsewhere)."""

    def __init__(self, grpc_url: str, admin_key: str | None = None):
        import tritonclient.grpc as grpcclient

        self.url = grpc_url
        self.admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV)
        self._client = grpcclient.InferenceServerClient(grpc_url)
        self._grpc = grpcclient

    @property
    def _headers(self) -> dict[str, str]:
        # Triton's gRPC frontend expects restricted-protocol headers prefixed with "triton-grpc-protocol-".
        return {f"triton-grpc-protocol-{ADMIN_HEADER}": self.admin_key} if self.admin_key else {}

    def load(self, name: str, config: dict[str, Any]) -> None:
        """Load (or reload) ``name`` with ``config``; on failure Triton keeps what was loaded before."""
        from tritonclient.utils import InferenceServerException

        try:
            self._client.load_model(name, headers=self._headers, config=json.dumps(config))
        except InferenceServerException as exc:
            raise TritonError(f"Triton could not load {name} versions {_versions(config)}: {exc.message()}") from None

    def unload(self, name: str) -> None:
        self._client.unload_model(name, headers=self._headers)

    def ready(self, name: str, version: int | None = None) -> bool:
        from tritonclient.utils import InferenceServerException

        try:
            return bool(self._client.is_model_ready(name, str(version) if version else ""))
        except InferenceServerException:
            return False

    def server_ready(self) -> bool:
        from tritonclient.utils import InferenceServerException

        try:
            return bool(self._client.is_server_ready())
        except InferenceServerException:
            return False

    def server_version(self) -> str:
        return str(self._client.get_server_metadata(as_json=True).get("version"))

    def loaded_versions(self, model: str) -> list[int]:
        """Registry versions of ``model`` that Triton has loaded and ready (Triton models ``<model>-v<N>``)."""
        index = self._client.get_model_repository_index(headers=self._headers, as_json=True)
        prefix = f"{model}-v"
        return sorted(
            int(m["name"][len(prefix) :])
            for m in index.get("models", [])
            if m.get("name", "").startswith(prefix) and m.get("state") == "READY"
        )

    def infer(self, name: str, version: int, features, timeout_s: float = 5.0):
        """Scores for a [batch, n_features] float32 array from one model version."""
        import numpy as np

        x = np.ascontiguousarray(features, dtype=np.float32)
        inp = self._grpc.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = self._client.infer(
            name,
            [inp],
            model_version=str(version),
            outputs=[self._grpc.InferRequestedOutput("score")],
            client_timeout=timeout_s,
        )
        return result.as_numpy("score")[:, 0]

    def inference_statistics(self, name: str, version: int) -> dict[str, Any]:
        """Triton's statistics of one model version (``get_inference_statistics`` as JSON: cumulative counts and
        nanoseconds since the version was loaded; keel.metering.compute reads them)."""
        return self._client.get_inference_statistics(name, str(version), as_json=True)

    def close(self) -> None:
        self._client.close()


def _versions(config: dict[str, Any]) -> list[int]:
    return config.get("version_policy", {}).get("specific", {}).get("versions", [])
