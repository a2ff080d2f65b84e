"""``keel lineage``: what a change touches, and what changed between releases."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keel.cli.common import EXIT_OK, Parser, ledger_path
from keel.sqldb import location_of


def register(sub) -> None:
    lineage = sub.add_parser("lineage", help="what a change touches, and what changed between releases (asset graph)")
    lineage.add_argument(
        "--definitions",
        type=Path,
        default=Path("definitions.py"),
        help="the Dagster definitions file to read the asset graph from (default: ./definitions.py)",
    )
    lsub = lineage.add_subparsers(dest="action", required=True, parser_class=Parser)
    impact = lsub.add_parser(
        "impact", help="every downstream feature, model, deployment and experiment asset of an asset or column"
    )
    impact.add_argument("target", help="an asset key, a column, or ASSET.COLUMN")
    impact.set_defaults(func=_lineage_impact)
    up = lsub.add_parser(
        "upstream",
        help="where an asset or column comes from: the columns, contracts and deliveries it is derived from",
    )
    up.add_argument("target", help="an asset key, a column, or ASSET.COLUMN (e.g. features.temp)")
    up.set_defaults(func=_lineage_upstream)
    ldiff = lsub.add_parser(
        "diff",
        help="which of data / model / infra / policy changed between two releases, and which assets produced it",
    )
    ldiff.add_argument("release_a", help="release id (or a unique prefix) in the ledger, or a manifest .json file")
    ldiff.add_argument("release_b")
    ldiff.add_argument(
        "--ledger",
        type=location_of,
        help="ledger: a file or a postgresql:// URL (default: $KEEL_HOME/ledger.sqlite, or $KEEL_CONTROL_PLANE)",
    )
    ldiff.set_defaults(func=_lineage_diff)


def _lineage_graph(args: argparse.Namespace):
    from keel.lineage import LineageGraph, load_definitions

    return LineageGraph.from_definitions(load_definitions(args.definitions))


def _columns(item) -> str:
    return "whole asset" if item.columns == ("*",) else "columns " + ", ".join(item.columns)


def _lineage_impact(args: argparse.Namespace) -> int:
    graph = _lineage_graph(args)
    impact = graph.impact(args.target)
    print(f"{args.target} lives in: {', '.join(impact.sources)}")
    if not impact.assets:
        print("nothing downstream depends on it")
        return EXIT_OK
    for role, items in impact.by_role().items():
        print(f"{role}:")
        for item in items:
            print(f"  {item.key:<28} {_columns(item)}")
    print(f"{len(impact.assets)} downstream assets")
    return EXIT_OK


def _lineage_upstream(args: argparse.Namespace) -> int:
    graph = _lineage_graph(args)
    up = graph.upstream(args.target)
    print(f"{args.target} lives in: {', '.join(up.sources)}")
    if not up.assets:
        print("it is a source: nothing upstream")
        return EXIT_OK
    for item in up.assets:
        print(f"  {item.key:<28} {item.role:<10} {_columns(item)}")
    print(f"contracts on the way: {', '.join(up.contracts) or 'none'}")
    print(f"deliveries (sources): {', '.join(up.roots)}")
    return EXIT_OK


def _lineage_diff(args: argparse.Namespace) -> int:
    from keel.lineage import read_manifest

    ledger = ledger_path(args)
    a, b = read_manifest(args.release_a, ledger), read_manifest(args.release_b, ledger)
    graph = _lineage_graph(args)
    print(f"{a.get('release_id', args.release_a)} → {b.get('release_id', args.release_b)}")
    diffs = graph.diff_manifests(a, b)
    for d in diffs:
        if not d.changed:
            print(f"{d.part}: unchanged ({d.hash_a[:12]})")
            continue
        print(f"{d.part}: CHANGED {d.hash_a[:12]} → {d.hash_b[:12]}")
        for c in d.changes:
            print(f"    {c.path}: {_short(c.old)} → {_short(c.new)}")
        if d.producers:
            print(f"  produced by: {', '.join(d.producers)}")
            if d.upstream:
                print(f"  upstream of those: {', '.join(d.upstream)}")
        elif d.part == "infra":
            print("  produced by: the environment (packages, Python, Triton, CUDA), not an asset")
    changed = [d.part for d in diffs if d.changed]
    print(f"changed: {', '.join(changed) if changed else 'nothing'}")
    return EXIT_OK


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 72 else text[:69] + "…"
