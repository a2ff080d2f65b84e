"""Release manifests: the full-stack version snapshot of what a deployment runs.

Four parts, each hashed over what it is made of — data (input partitions' data versions, contract hashes), model
(file hash, training code hash, params including the seed), infra (package versions, Python, Triton and CUDA
where present), policy (routing, canary and breaker policy versions) — and a release id derived from the four
hashes, so two releases differ in id exactly when one of the parts differs.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PARTS = ("data", "model", "infra", "policy")
INFRA_PACKAGES = ("keel", "dagster", "polars", "pyarrow", "numpy", "scipy", "lightgbm", "duckdb", "tritonclient")


def _hash(payload: Any) -> str:
    return hashlib.sha256(
        json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def infra_snapshot() -> dict[str, Any]:
    packages = {}
    for name in INFRA_PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "triton": None,
        "cuda": None,
    }


def release_manifest(
    *, data: dict[str, Any], model: dict[str, Any], infra: dict[str, Any], policy: dict[str, Any]
) -> dict[str, Any]:
    parts = {"data": data, "model": model, "infra": infra, "policy": policy}
    hashes = {name: _hash(parts[name]) for name in PARTS}
    release_id = "rel-" + hashlib.sha256("".join(hashes[name] for name in PARTS).encode()).hexdigest()[:16]
    return {"release_id": release_id, **{name: {"hash": hashes[name], "parts": parts[name]} for name in PARTS}}


def changed_parts(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Which of data / model / infra / policy differ between two manifests."""
    return [name for name in PARTS if a[name]["hash"] != b[name]["hash"]]
