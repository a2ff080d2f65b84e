"""The Triton model repository: each registered LightGBM model version becomes a Triton model served by keel's native
backend (gpu_runtime/backend/: LightGBM's C library, no Python) — or, as an explicit option, by Triton's Python
backend (``ServingConfig.backend = "python"``, gpu_runtime/triton_model.py).

One Triton model per registry version, named ``<model>-v<version>``, whose only Triton version is the registry
version — so registry version N of ``my-model`` is Triton model ``my-model-vN``, version N::

    <root>/<model>-v<N>/config.pbtxt         the model's config, for people reading the repository
    <root>/<model>-v<N>/<N>/model.txt        the LightGBM text model, byte for byte as registered
    <root>/<model>-v<N>/<N>/meta.json        sha256, registry version, release id
    <root>/<model>-v<N>/<N>/model.py         gpu_runtime/triton_model.py (read only by the Python backend)

Why one Triton model per version: Triton reloads *every* version of a model whenever the model is loaded again, so
versions sharing one Triton model would reload each other on every deploy. Apart, loading a new version touches
nothing that serves, and retiring one is a plain unload.

A version directory is written completely under a temporary name and renamed into place, so Triton never sees a
half-written version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.names import validate_name

MODEL_PY = Path(__file__).resolve().parent / "triton_model.py"
NATIVE_BACKEND = "keel_lightgbm"  # gpu_runtime/backend/keel_lightgbm.cc
BACKENDS = (NATIVE_BACKEND, "python")


@dataclass(frozen=True)
class ServingConfig:
    """How Triton runs a model: batching, instances and the input width."""

    n_features: int
    max_batch_size: int = 256
    # dynamic batching: how long a request may wait for others. 0 (Triton's own default): none — a batch forms from
    # the requests that queued while an instance was busy, so batches grow under load and an idle model answers at
    # once (200 µs cost every batch-1 request 0.2 ms; BENCHMARKS.md, issue 33)
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    # a request that waited in Triton's queue longer than its own timeout (the gateway sends what is left of the
    # request's time with each call) or, without one, than this, is rejected, not run: the work of a call the gateway
    # abandoned (scoring.py: calls are never cancelled — Triton 2.51 crashes on cancellation races) stays bounded
    queue_timeout_us: int = 2_000_000
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"  # KIND_GPU on a GPU machine
    parameters: dict[str, str] = field(default_factory=dict)  # e.g. keel_fault_file (fault injection)
    backend: str = NATIVE_BACKEND  # or "python": Triton's Python backend (needs the runtime environment's numpy<2)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")


def triton_name(model: str, version: int) -> str:
    """The Triton model that serves registry version ``version`` of ``model``."""
    validate_name(model, what="model name")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"registry versions are positive integers, got {version!r}")
    return f"{model}-v{version}"


def model_config(model: str, version: int, serving: ServingConfig) -> dict[str, Any]:
    """The Triton model configuration (as JSON) of one registry version."""
    name = triton_name(model, version)
    versions = [version]
    batching: dict[str, Any] = {
        "max_queue_delay_microseconds": serving.max_queue_delay_us,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": serving.queue_timeout_us,
            "allow_timeout_override": True,
        },
    }
    if serving.preferred_batch_sizes:
        batching["preferred_batch_size"] = list(serving.preferred_batch_sizes)
    return {
        "name": name,
        "backend": serving.backend,
        "max_batch_size": serving.max_batch_size,
        "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [serving.n_features]}],
        "output": [
            {"name": "score", "data_type": "TYPE_FP32", "dims": [1]},
            # only computed when a request asks for them (explanations: TreeSHAP and the raw score, triton_model.py)
            {"name": "contrib", "data_type": "TYPE_FP64", "dims": [serving.n_features + 1]},
            {"name": "raw_score", "data_type": "TYPE_FP64", "dims": [1]},
        ],
        "dynamic_batching": batching,
        "instance_group": [{"kind": serving.instance_kind, "count": serving.instance_count}],
        "version_policy": {"specific": {"versions": sorted(versions)}},
        "parameters": {k: {"string_value": v} for k, v in sorted(serving.parameters.items())},
    }


def _pbtxt(config: dict[str, Any]) -> str:
    """A readable config.pbtxt of the same configuration (Triton reads the JSON passed at load time)."""
    lines = [
        f'name: "{config["name"]}"',
        f'backend: "{config["backend"]}"',
        f"max_batch_size: {config['max_batch_size']}",
    ]
    for kind in ("input", "output"):
        for t in config[kind]:
            lines.append(f'{kind} [{{ name: "{t["name"]}" data_type: {t["data_type"]} dims: {t["dims"]} }}]')
    db = config["dynamic_batching"]
    qp = db["default_queue_policy"]
    lines.append(
        f"dynamic_batching {{ max_queue_delay_microseconds: {db['max_queue_delay_microseconds']} "
        f"default_queue_policy {{ timeout_action: {qp['timeout_action']} default_timeout_microseconds: "
        f"{qp['default_timeout_microseconds']} allow_timeout_override: true }} }}"
    )
    ig = config["instance_group"][0]
    lines.append(f"instance_group [{{ kind: {ig['kind']} count: {ig['count']} }}]")
    return "\n".join(lines) + "\n"


class ModelRepository:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def version_dir(self, model: str, version: int) -> Path:
        return self.root / triton_name(model, version) / str(version)

    def publish(self, name: str, version: int, model_text: str, meta: dict[str, Any]) -> Path:
        """Write one model version. Idempotent: an intact copy of the same model is left as it is; a version
        directory whose file no longer hashes to its sha256 (corrupt, tampered, half-copied by hand) is replaced.
        ``model.py`` (the Python backend's entry point) is written too: a config naming the native backend ignores
        it, and the same version directory can be loaded by either."""
        target = self.version_dir(name, version)
        if self._intact(target, meta.get("sha256")):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=target.parent))
        try:
            shutil.copyfile(MODEL_PY, tmp / "model.py")
            (tmp / "model.txt").write_text(model_text)
            (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True, indent=2))
            for f in tmp.iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            if target.exists():
                aside = target.with_name(f".{version}.replaced-{os.getpid()}")
                os.rename(target, aside)
                os.rename(tmp, target)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    @staticmethod
    def _intact(target: Path, sha256: str | None) -> bool:
        try:
            meta = json.loads((target / "meta.json").read_text())
            data = (target / "model.txt").read_bytes()
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return meta.get("sha256") == sha256 and hashlib.sha256(data).hexdigest() == sha256

    def write_config(self, config: dict[str, Any]) -> None:
        """config.pbtxt for people, config.json for keel: the configuration a version was last loaded with."""
        folder = self.root / config["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in (("config.pbtxt", _pbtxt(config)), ("config.json", json.dumps(config, sort_keys=True))):
            tmp = folder / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, folder / name)

    def loaded_config(self, model: str, version: int) -> dict[str, Any] | None:
        try:
            return json.loads((self.root / triton_name(model, version) / "config.json").read_text())
        except FileNotFoundError:
            return None

    def versions(self, model: str) -> list[int]:
        """Registry versions published for ``model``."""
        prefix = f"{model}-v"
        return sorted(
            int(p.name[len(prefix) :])
            for p in self.root.iterdir()
            if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit() and (p / p.name[len(prefix) :]).is_dir()
        )

    def meta(self, name: str, version: int) -> dict[str, Any]:
        return json.loads((self.version_dir(name, version) / "meta.json").read_text())
