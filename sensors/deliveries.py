"""Which delivery a month's features were last built from: the tag the landing sensor's monthly runs carry (and the
set-up's history runs, scripts/materialize.py), read back from the instance. Shared by the landing sensor (a drift
report only for a month built whole) and the drift sensor (a challenger gated only on months built whole)."""

from __future__ import annotations

import dagster as dg

DELIVERY_TAG = "keel/delivery"  # which delivery a monthly run built: the landing run key (scripts/materialize.py too)


def built_from(instance: dg.DagsterInstance, features: dg.AssetKey, month: str) -> str | None:
    """The delivery the run that last materialized the month's features built: its delivery tag, else its run key,
    else ``run:<id>`` (a build that was no delivery's); None: the month was never built."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=features, asset_partitions=[month]), limit=1
    ).records
    if not records:
        return None
    run = instance.get_run_by_id(records[0].run_id)
    if run is None:
        return f"run:{records[0].run_id}"
    return run.tags.get(DELIVERY_TAG) or run.tags.get("dagster/run_key") or f"run:{run.run_id}"
