"""Materialize the whole asset graph into the local Dagster instance, month by month, with progress output.

Run by scripts/up (DAGSTER_HOME set); runs land in the instance, so the UI shows them with their checks.
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

# Step-by-step events go to the instance (the UI shows them); the terminal gets one progress line per month.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", help="comma-separated month keys (default: all of 2013)")
    args = parser.parse_args()
    keys = args.partitions.split(",") if args.partitions else monthly_2013.get_partition_keys()
    defs = definitions.defs
    all_assets = list(defs.assets)
    partitioned = [a for a in all_assets if getattr(a, "partitions_def", None) is not None]
    unpartitioned = [a for a in all_assets if getattr(a, "partitions_def", None) is None]
    resources = dict(defs.resources)
    instance = dg.DagsterInstance.get()
    t0 = time.perf_counter()
    print(
        f"keel: materializing {len(unpartitioned)} reference assets, then {len(keys)} monthly partitions", flush=True
    )
    result = dg.materialize(
        unpartitioned, instance=instance, resources=resources, run_config=QUIET, tags={"keel/source": "scripts/up"}
    )
    if not result.success:
        print("keel: reference assets failed; see the run in the Dagster UI", file=sys.stderr)
        return 1
    failures = 0
    for i, key in enumerate(keys, 1):
        t = time.perf_counter()
        result = dg.materialize(
            all_assets,
            selection=dg.AssetSelection.assets(*partitioned),
            instance=instance,
            resources=resources,
            partition_key=key,
            raise_on_error=False,
            run_config=QUIET,
            tags={"keel/source": "scripts/up"},
        )
        line = []
        for ev in result.get_asset_materialization_events():
            md = ev.materialization.metadata
            if "rows_in" in md:
                line.append(
                    f"{ev.asset_key.to_user_string()} {md['rows_in'].value:,} in → {md['valid'].value:,} valid, "
                    f"{md['quarantined'].value:,} quarantined"
                )
        failed_checks = [
            f"{e.asset_key.to_user_string()}:{e.check_name}"
            for e in result.get_asset_check_evaluations()
            if not e.passed
        ]
        status = "ok" if result.success else "FAILED"
        failures += not result.success
        print(
            f"[{i:>2}/{len(keys)}] {key} {status} in {time.perf_counter() - t:4.1f}s  " + "; ".join(line), flush=True
        )
        if failed_checks:
            print(f"        failed checks: {', '.join(failed_checks)}", flush=True)
    print(f"keel: done in {time.perf_counter() - t0:.0f}s, {failures} failed partition(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
