"""The Triton model repository: each registered LightGBM model version becomes a Python-backend model version.

Layout, one Triton model per registry model name, one Triton version per registry version::

    <root>/<model>/config.pbtxt            the model's config, for people reading the repository
    <root>/<model>/<version>/model.py      gpu_runtime/triton_model.py
    <root>/<model>/<version>/model.txt     the LightGBM text model, byte for byte as registered
    <root>/<model>/<version>/meta.json     sha256, registry version, release id

A version directory is written completely under a temporary name and renamed into place, so Triton never sees a
half-written version. Which versions are loaded is decided per load call (``version_policy: specific``), through
``model_config``: the repository holds every version ever published, Triton serves the ones asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.names import validate_name

MODEL_PY = Path(__file__).resolve().parent / "triton_model.py"


@dataclass(frozen=True)
class ServingConfig:
    """How Triton runs a model: batching, instances and the input width."""

    n_features: int
    max_batch_size: int = 256
    max_queue_delay_us: int = 200  # dynamic batching: how long a request may wait for others
    preferred_batch_sizes: tuple[int, ...] = ()
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"  # KIND_GPU on a GPU machine
    parameters: dict[str, str] = field(default_factory=dict)  # e.g. keel_fault_file (fault injection)


def model_config(name: str, serving: ServingConfig, versions: list[int]) -> dict[str, Any]:
    """The Triton model configuration (as JSON) serving exactly ``versions``."""
    batching: dict[str, Any] = {"max_queue_delay_microseconds": serving.max_queue_delay_us}
    if serving.preferred_batch_sizes:
        batching["preferred_batch_size"] = list(serving.preferred_batch_sizes)
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": serving.max_batch_size,
        "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [serving.n_features]}],
        "output": [{"name": "score", "data_type": "TYPE_FP32", "dims": [1]}],
        "dynamic_batching": batching,
        "instance_group": [{"kind": serving.instance_kind, "count": serving.instance_count}],
        "version_policy": {"specific": {"versions": sorted(versions)}},
        "parameters": {k: {"string_value": v} for k, v in sorted(serving.parameters.items())},
    }


def _pbtxt(config: dict[str, Any]) -> str:
    """A readable config.pbtxt of the same configuration (Triton reads the JSON passed at load time)."""
    lines = [
        f'name: "{config["name"]}"',
        'backend: "python"',
        f"max_batch_size: {config['max_batch_size']}",
    ]
    for kind in ("input", "output"):
        for t in config[kind]:
            lines.append(f'{kind} [{{ name: "{t["name"]}" data_type: {t["data_type"]} dims: {t["dims"]} }}]')
    db = config["dynamic_batching"]
    lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {db['max_queue_delay_microseconds']} }}")
    ig = config["instance_group"][0]
    lines.append(f"instance_group [{{ kind: {ig['kind']} count: {ig['count']} }}]")
    return "\n".join(lines) + "\n"


class ModelRepository:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def version_dir(self, name: str, version: int) -> Path:
        validate_name(name, what="model name")
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"Triton versions are positive integers, got {version!r}")
        return self.root / name / str(version)

    def publish(self, name: str, version: int, model_text: str, meta: dict[str, Any]) -> Path:
        """Write one model version (idempotent: an existing complete version is left as it is)."""
        target = self.version_dir(name, version)
        if (target / "meta.json").exists():
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
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    def write_config(self, config: dict[str, Any]) -> None:
        path = self.root / config["name"] / "config.pbtxt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(_pbtxt(config))
        os.replace(tmp, path)

    def versions(self, name: str) -> list[int]:
        d = self.root / name
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []

    def meta(self, name: str, version: int) -> dict[str, Any]:
        return json.loads((self.version_dir(name, version) / "meta.json").read_text())
