"""Lineage questions answered from the Dagster asset graph: what does a change touch, and what changed between two
releases.

``LineageGraph`` is a plain snapshot of the graph — per asset its group, kinds, tags, parents, children and, where the
asset publishes them, its columns (``dagster/column_schema``) and column lineage (``dagster/column_lineage``). It is
built from a ``Definitions`` object (``LineageGraph.from_definitions``), never from a hand-kept list, so a new asset
shows up in every answer the moment it is defined.

- ``impact(target)``: every asset downstream of an asset key, or of a column (``column`` or ``asset.column``). A
  column follows column lineage where the consumer publishes it (an asset that declares which inputs each of its
  columns comes from is touched only when one of those inputs is); a consumer that publishes none is assumed to use
  every column of its inputs.
- ``upstream(target)``: where an asset or a column comes from — every asset and column it is derived from, back to
  the sources (assets with no parents: the deliveries), and the data contracts on the way (``keel/contract`` tags).
  The root-cause question: a drifted feature or a failed check → the source columns, contract and delivery.
- ``diff_manifests(a, b)``: which of data / model / infra / policy differ between two release manifests, each
  changed value, and the assets that produced it (and their upstream).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.errors import KeelError
from keel.release import PARTS

WHOLE = "*"  # stands for "every column of this asset"
ROLE_ORDER = ("data", "feature", "drift", "model", "deployment", "experiment", "policy")


class LineageError(KeelError):
    """The target is not in the graph, or a release or definitions file cannot be found."""


@dataclass(frozen=True)
class AssetInfo:
    key: str
    group: str | None
    kinds: frozenset[str]
    tags: dict[str, str]
    parents: tuple[str, ...]
    children: tuple[str, ...]
    columns: tuple[str, ...] = ()
    column_deps: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    @property
    def role(self) -> str:
        """What the asset is to a person asking "what does this touch": by group first (a use case's group
        ``<use case>_<kind>`` by its kind), then kinds."""
        group = (self.group or "").rsplit("_", 1)[-1]
        if group in ("features",) or "feature" in self.kinds:
            return "feature"
        if group in ("drift",):
            return "drift"
        if group in ("models",) or "model" in self.kinds:
            return "model"
        if group in ("deployments", "serving") or "deployment" in self.kinds:
            return "deployment"
        if group in ("experiments",) or "experiment" in self.kinds:
            return "experiment"
        if group in ("policies", "control") or "policy" in self.kinds:
            return "policy"
        return "data"


@dataclass(frozen=True)
class Impacted:
    key: str
    role: str
    columns: tuple[str, ...]  # the impacted columns, or ("*",) when the whole asset is


@dataclass(frozen=True)
class Impact:
    target: str
    sources: tuple[str, ...]  # the assets the target lives in
    assets: tuple[Impacted, ...]  # downstream, in topological order

    def by_role(self) -> dict[str, list[Impacted]]:
        out: dict[str, list[Impacted]] = {}
        for item in self.assets:
            out.setdefault(item.role, []).append(item)
        return {role: out[role] for role in ROLE_ORDER if role in out}


@dataclass(frozen=True)
class Change:
    path: str
    old: Any
    new: Any


@dataclass(frozen=True)
class PartDiff:
    part: str
    hash_a: str
    hash_b: str
    changes: tuple[Change, ...]
    producers: tuple[str, ...]  # assets whose output the changed values are
    upstream: tuple[str, ...]  # and everything upstream of them

    @property
    def changed(self) -> bool:
        return self.hash_a != self.hash_b


@dataclass(frozen=True)
class Upstream:
    target: str
    sources: tuple[str, ...]  # the asset(s) the target lives in
    assets: tuple[Impacted, ...]  # what it is derived from, nearest first
    roots: tuple[str, ...]  # the deliveries: upstream assets with no parents
    contracts: tuple[str, ...]  # data contracts on the way


class LineageGraph:
    def __init__(self, assets: dict[str, AssetInfo]):
        self.assets = assets
        self._order = {key: i for i, key in enumerate(_toposort(assets))}

    @classmethod
    def from_definitions(cls, defs: Any) -> LineageGraph:
        """Snapshot the asset graph of a ``dagster.Definitions`` object (or of a repository: a sensor's
        ``context.repository_def``)."""
        graph = defs.resolve_asset_graph() if hasattr(defs, "resolve_asset_graph") else defs.asset_graph
        assets = {}
        for node in graph.asset_nodes:
            key = node.key.to_user_string()
            meta = node.metadata or {}
            schema = meta.get("dagster/column_schema")
            schema = getattr(schema, "value", schema)  # a TableSchema, or the metadata value wrapping one
            columns = tuple(c.name for c in schema.columns) if schema is not None else ()
            lineage = meta.get("dagster/column_lineage")
            deps = {}
            if lineage is not None:
                for column, col_deps in getattr(lineage, "value", lineage).deps_by_column.items():
                    deps[column] = tuple((d.asset_key.to_user_string(), d.column_name) for d in col_deps)
            assets[key] = AssetInfo(
                key=key,
                group=node.group_name,
                kinds=frozenset(node.kinds),
                tags=dict(node.tags or {}),
                parents=tuple(sorted(k.to_user_string() for k in node.parent_keys)),
                children=tuple(sorted(k.to_user_string() for k in node.child_keys)),
                columns=columns,
                column_deps=deps,
            )
        return cls(assets)

    def sorted(self, keys: set[str] | list[str]) -> list[str]:
        return sorted(keys, key=lambda k: (self._order.get(k, len(self._order)), k))

    def ancestors(self, keys: list[str]) -> list[str]:
        seen: set[str] = set()
        queue = deque(keys)
        while queue:
            for parent in self.assets[queue.popleft()].parents:
                if parent not in seen and parent in self.assets:
                    seen.add(parent)
                    queue.append(parent)
        return self.sorted(seen - set(keys))

    def impact(self, target: str) -> Impact:
        seeds = self._resolve(target)
        impacted: dict[str, set[str]] = {asset: set(cols) for asset, cols in seeds.items()}
        queue = deque(self.sorted(list(seeds)))
        while queue:
            parent = queue.popleft()
            hit = impacted[parent]
            for child_key in self.assets[parent].children:
                child = self.assets[child_key]
                declared = [c for c, srcs in child.column_deps.items() if any(a == parent for a, _ in srcs)]
                if declared:
                    cols = {
                        c
                        for c in declared
                        if any(a == parent and (WHOLE in hit or col in hit) for a, col in child.column_deps[c])
                    }
                else:  # no column lineage from this parent: assume the child uses all of it
                    cols = {WHOLE}
                new = cols - impacted.get(child_key, set())
                if new:
                    impacted.setdefault(child_key, set()).update(new)
                    queue.append(child_key)
        downstream = [k for k in self.sorted(list(impacted)) if k not in seeds]
        return Impact(
            target=target,
            sources=tuple(self.sorted(list(seeds))),
            assets=tuple(
                Impacted(k, self.assets[k].role, (WHOLE,) if WHOLE in impacted[k] else tuple(sorted(impacted[k])))
                for k in downstream
            ),
        )

    def upstream(self, target: str) -> Upstream:
        """Every asset (and column, where column lineage says) that ``target`` is derived from, nearest first."""
        seeds = self._resolve(target)
        found: dict[str, set[str]] = {}
        queue = deque((asset, col) for asset, cols in seeds.items() for col in cols)
        seen: set[tuple[str, str]] = set()
        while queue:
            asset, col = queue.popleft()
            if (asset, col) in seen:
                continue
            seen.add((asset, col))
            info = self.assets[asset]
            if col != WHOLE and col in info.column_deps:
                sources = list(info.column_deps[col])
            elif col == WHOLE and info.column_deps:
                sources = sorted({src for deps in info.column_deps.values() for src in deps})
                sources += [(p, WHOLE) for p in info.parents if all(a != p for a, _ in sources)]
            else:  # no column lineage: the whole of every parent
                sources = [(p, WHOLE) for p in info.parents]
            for parent, parent_col in sources:
                if parent not in self.assets:
                    continue
                found.setdefault(parent, set()).add(parent_col)
                queue.append((parent, parent_col))
        keys = [k for k in self.sorted(list(found)) if k not in seeds]
        keys.reverse()  # nearest first
        items = tuple(
            Impacted(k, self.assets[k].role, (WHOLE,) if WHOLE in found[k] else tuple(sorted(found[k]))) for k in keys
        )
        return Upstream(
            target=target,
            sources=tuple(self.sorted(list(seeds))),
            assets=items,
            roots=tuple(i.key for i in items if not self.assets[i.key].parents),
            contracts=tuple(
                sorted(
                    {
                        self.assets[i.key].tags["keel/contract"]
                        for i in items
                        if "keel/contract" in self.assets[i.key].tags
                    }
                )
            ),
        )

    def _resolve(self, target: str) -> dict[str, set[str]]:
        if target in self.assets:
            return {target: {WHOLE}}
        asset, sep, column = target.rpartition(".")
        if sep and asset in self.assets:
            info = self.assets[asset]
            if info.columns and column not in info.columns:
                raise LineageError(f"asset {asset} has no column {column!r} (its columns: {', '.join(info.columns)})")
            return {asset: {column}}
        holders = {k: {target} for k, info in self.assets.items() if target in info.columns}
        if not holders:
            raise LineageError(
                f"{target!r} is neither an asset key nor a column any asset publishes; assets: "
                + ", ".join(self.sorted(list(self.assets)))
            )
        # A column published by an asset and by what was derived from it: start from the most upstream holders.
        return {k: v for k, v in holders.items() if not set(self.ancestors([k])) & set(holders)}

    def diff_manifests(self, a: dict[str, Any], b: dict[str, Any]) -> list[PartDiff]:
        out = []
        for part in PARTS:
            old, new = a[part]["parts"], b[part]["parts"]
            changes = [Change(p, x, y) for p, x, y in _leaf_changes(old, new)]
            producers = self.sorted(list({k for c in changes for k in self._producers(part, c.path, a, b)}))
            out.append(
                PartDiff(
                    part=part,
                    hash_a=a[part]["hash"],
                    hash_b=b[part]["hash"],
                    changes=tuple(changes),
                    producers=tuple(producers),
                    upstream=tuple(self.ancestors(producers)) if producers else (),
                )
            )
        return out

    def _producers(self, part: str, path: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
        head, _, rest = path.partition(".")
        if part == "data":
            if head == "contracts":
                name = rest.split(".", 1)[0]
                return [k for k, info in self.assets.items() if info.tags.get("keel/contract") == name]
            return [head] if head in self.assets else []
        if part == "model":
            asset = b["model"]["parts"].get("asset") or a["model"]["parts"].get("asset")
            return [asset] if asset in self.assets else []
        if part == "policy":
            return [k for k, info in self.assets.items() if info.tags.get("keel/policy") == head]
        return []  # infra is the environment, not an asset


def _leaf_changes(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            out.extend(_leaf_changes(old.get(key), new.get(key), path))
        return out
    return [] if old == new else [(prefix, old, new)]


def _toposort(assets: dict[str, AssetInfo]) -> list[str]:
    indegree = {k: sum(p in assets for p in info.parents) for k, info in assets.items()}
    ready = sorted(k for k, d in indegree.items() if d == 0)
    order = []
    while ready:
        key = ready.pop(0)
        order.append(key)
        for child in assets[key].children:
            if child in indegree:
                indegree[child] -= 1
                if indegree[child] == 0:
                    ready.append(child)
                    ready.sort()
    return order


def load_definitions(path: str | Path) -> Any:
    """Import a definitions file the way ``dagster dev`` does and return its ``Definitions`` object."""
    import dagster as dg

    path = Path(path).resolve()
    if not path.is_file():
        raise LineageError(f"{path}: no definitions file here (pass --definitions FILE)")
    root = str(path.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location("_keel_definitions", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # beta/preview warnings are for the pipeline's author, not this command
        spec.loader.exec_module(module)
    found = [v for v in vars(module).values() if isinstance(v, dg.Definitions)]
    if len(found) != 1:
        raise LineageError(f"{path}: expected one dagster.Definitions object, found {len(found)}")
    return found[0]


def read_manifest(ref: str, ledger_path: Path | None) -> dict[str, Any]:
    """A release manifest from a JSON file, or from the ledger by release id (a unique prefix will do)."""
    as_path = Path(ref)
    if as_path.suffix == ".json" or as_path.is_file():
        try:
            manifest = json.loads(as_path.read_text())
        except FileNotFoundError:
            raise LineageError(f"{ref}: no such manifest file") from None
        except json.JSONDecodeError as exc:
            raise LineageError(f"{ref}: not JSON ({exc})") from None
        if not all(isinstance(manifest.get(p), dict) and "hash" in manifest[p] for p in PARTS):
            raise LineageError(f"{ref}: not a release manifest (needs {', '.join(PARTS)} with hash and parts)")
        return manifest
    from keel.ledger import Ledger

    if ledger_path is None or not ledger_path.exists():
        raise LineageError(f"{ref!r} is not a manifest file, and there is no ledger at {ledger_path} to look it up")
    ledger = Ledger(ledger_path)
    try:
        matches = {e.release_id: e.manifest for e in ledger.log() if e.release_id.startswith(ref)}
    finally:
        ledger.close()
    if len(matches) != 1:
        raise LineageError(
            f"release {ref!r} {'is not in' if not matches else 'is ambiguous in'} the ledger at {ledger_path}"
            + (f": {', '.join(sorted(matches))}" if matches else "")
        )
    return next(iter(matches.values()))
