"""Materialize the whole asset graph into the local Dagster instance, stage by stage, with progress output.

Run by scripts/up (DAGSTER_HOME set); runs land in the instance, so the UI shows them with their checks. The graph
is cut into stages where partitioned and unpartitioned assets meet (raw reference tables → monthly pipeline →
drift reference → monthly drift reports); partitioned stages run month by month.

Usage: python scripts/materialize.py [--partitions 2013-01,2013-02]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagster as dg  # noqa: E402

import definitions  # noqa: E402
from assets.partitions import monthly_2013  # noqa: E402

# Step-by-step events go to the instance (the UI shows them); the terminal gets one progress line per run.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
TAGS = {"keel/source": "scripts/up"}


def stages(graph) -> list[tuple[bool, list[dg.AssetKey]]]:
    """(partitioned, keys) in execution order: a new stage wherever partitioned-ness changes along an edge."""
    stage: dict[dg.AssetKey, int] = {}
    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        part = node.is_partitioned
        parents = [p for p in node.parent_keys if p in stage]
        s = 1 if part else 0
        for p in parents:
            s = max(s, stage[p] + (graph.get(p).is_partitioned != part))
        stage[key] = s
    out: dict[int, list[dg.AssetKey]] = {}
    for key, s in stage.items():
        out.setdefault(s, []).append(key)
    return [(graph.get(keys[0]).is_partitioned, keys) for _, keys in sorted(out.items())]


def summary(result) -> str:
    parts = []
    for ev in result.get_asset_materialization_events():
        md, key = ev.materialization.metadata, ev.asset_key.to_user_string()
        if "rows_in" in md:
            parts.append(
                f"{key} {md['rows_in'].value:,}→{md['valid'].value:,} valid/{md['quarantined'].value:,} quarantined"
            )
        elif "verdict" in md:
            parts.append(f"drift: {md['verdict'].value} ({md['drifted_features'].value})")
        elif key == "flight_features":
            parts.append(f"features {md['dagster/row_count'].value:,} rows")
        elif key == "model_evaluation":
            parts.append(f"AUC {md['auc'].value:.3f}, ECE {md['ece'].value:.3f}")
        elif key == "model_deployment":
            parts.append(f"live: {md['release_id'].value} at {md['gateway'].value}")
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", help="comma-separated month keys (default: all of 2013)")
    args = parser.parse_args()
    keys = args.partitions.split(",") if args.partitions else monthly_2013.get_partition_keys()
    defs = definitions.defs
    all_assets = list(defs.assets)
    resources = dict(defs.resources)
    instance = dg.DagsterInstance.get()
    graph = defs.resolve_asset_graph()
    # Assets tagged keel/backfill: skip follow live traffic (the experiment data lake, by day): materialized on
    # demand by their sensors or from the UI, not by the 2013 backfill.
    on_demand = {k for k in graph.get_all_asset_keys() if graph.get(k).tags.get("keel/backfill") == "skip"}
    plan = [(p, [k for k in ks if k not in on_demand]) for p, ks in stages(graph)]
    plan = [(p, ks) for p, ks in plan if ks]
    t0 = time.perf_counter()
    failures = 0
    print(f"keel: materializing {len(plan)} stages over {len(keys)} months", flush=True)
    for n, (partitioned, stage_keys) in enumerate(plan, 1):
        names = ", ".join(k.to_user_string() for k in stage_keys)
        print(f"stage {n}/{len(plan)}: {names}", flush=True)
        for i, key in enumerate(keys if partitioned else [None], 1):
            t = time.perf_counter()
            result = dg.materialize(
                all_assets,
                selection=dg.AssetSelection.assets(*stage_keys),
                instance=instance,
                resources=resources,
                partition_key=key,
                raise_on_error=False,
                run_config=QUIET,
                tags=TAGS,
            )
            failures += not result.success
            label = f"[{i:>2}/{len(keys)}] {key}" if key else "       all"
            status = "ok" if result.success else "FAILED"
            print(f"  {label} {status} in {time.perf_counter() - t:4.1f}s  {summary(result)}", flush=True)
            failed_checks = [
                f"{e.asset_key.to_user_string()}:{e.check_name}"
                for e in result.get_asset_check_evaluations()
                if not e.passed
            ]
            if failed_checks:
                print(f"        failed checks: {', '.join(failed_checks)}", flush=True)
    print(f"keel: done in {time.perf_counter() - t0:.0f}s, {failures} failed run(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
