"""The Triton Inference Server process: start, stop, health, explicit load/unload, readiness.

The binary is the ``tritonserver`` build inside PyPI's nvidia-pytriton, extracted from the pinned wheel into
``.keel-triton`` (gpu_runtime/triton_dist.py) — no environment of its own: every model is served by keel's native
backend (gpu_runtime/backend/). ``prepare_dist`` copies the server directory into keel's work dir with that backend,
and the process gets ``LD_LIBRARY_PATH`` = the build's bundled libraries. Only with the Python backend option
(``$KEEL_RUNTIME_PYTHON``, an interpreter with numpy < 2) does it also get that interpreter's stub, libpython (first
on the path), site-packages and bin directory.

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
from gpu_runtime.triton_dist import PythonBackendEnv, TritonDist, TritonDistError, python_backend_env, triton_dist
from keel.errors import KeelError

REPO_ROOT = Path(__file__).resolve().parent.parent
ADMIN_HEADER = "keel-admin-key"
ADMIN_KEY_ENV = "KEEL_TRITON_ADMIN_KEY"


class TritonError(KeelError):
    """Triton did not start, a model did not load, or its binary is missing."""


@dataclass(frozen=True)
class RuntimeInfo:
    """What a server runs: the extracted Triton build and, only when the Python backend option is configured
    (``$KEEL_RUNTIME_PYTHON``), the interpreter that backend runs models in."""

    dist: TritonDist
    python: PythonBackendEnv | None

    @property
    def triton_version(self) -> str:
        return self.dist.version


def runtime_info() -> RuntimeInfo:
    try:
        return RuntimeInfo(triton_dist(), python_backend_env())
    except TritonDistError as exc:
        raise TritonError(str(exc)) from None


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
    """Copy the extracted tritonserver folder (once) — with the Python backend's stub for its interpreter's version
    when that option is configured — and keel's native backend (every time: a rebuilt backend replaces the copy)."""
    py = info.python
    dest = work_dir / (f"tritonserver-py{py.version}" if py else "tritonserver")
    marker = dest / "backends" / "python" / "triton_python_backend_stub" if py else dest / "bin" / "tritonserver"
    if marker.exists():
        install_native_backend(dest)
        return dest
    src = info.dist.server
    tmp = work_dir / f".tritonserver-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("python_backend_stubs"))
    if py:
        stub = src / "python_backend_stubs" / py.version / "triton_python_backend_stub"
        if not stub.exists():
            raise TritonError(f"the Triton build has no Python backend stub for Python {py.version}")
        shutil.copy2(stub, tmp / "backends" / "python")
    try:
        os.rename(tmp, dest)
    except OSError:  # another process prepared it first
        shutil.rmtree(tmp, ignore_errors=True)
    install_native_backend(dest)
    return dest


_HANDED_OUT: set[int] = set()  # ports this process handed out or was given: free_port never returns them again


def reserve_port(port: int) -> None:
    """A port this process will bind later (given to it, e.g. ``--gateway-port``): ``free_port`` never hands it out.
    A CI run saw Triton's HTTP port drawn equal to the gateway's port, given by the test but not bound yet."""
    _HANDED_OUT.add(port)


def free_port() -> int:
    """A loopback port free now and never handed out or reserved in this process before (two draws before either
    port is bound could otherwise return the same one)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free loopback port in 100 draws")


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
        """The build's bundled libraries on the library path; with the Python backend option, its interpreter's
        libpython first (the stub must load *that* one) and its site-packages (numpy < 2, lightgbm)."""
        env = dict(os.environ)
        py = info.python
        paths = (py.libdir if py else None, str(info.dist.libs), env.get("LD_LIBRARY_PATH"))
        env["LD_LIBRARY_PATH"] = ":".join(p for p in paths if p)
        env.pop("PYTHONHOME", None)
        if py:
            env["PYTHONPATH"] = py.site_packages
            env["PATH"] = f"{py.bindir}:{env.get('PATH', '')}"
            env["PYTHONNOUSERSITE"] = "1"
        else:
            env.pop("PYTHONPATH", None)
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
            # its Python stubs are children: stop them as a group — a process group of its own in the serving
            # process's session, so that it shares the session's CPU priority (process.serving_priority)
            process_group=0,
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
            hint = (" (a Python-backend model: the server needs KEEL_RUNTIME_PYTHON, an interpreter with numpy < 2 — "
                    "scripts/python-backend-env; keel's default is the native backend)")  # fmt: skip
            hint = hint if config.get("backend") == "python" else ""
            raise TritonError(
                f"Triton could not load {name} versions {_versions(config)}: {exc.message()}{hint}"
            ) from None

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
