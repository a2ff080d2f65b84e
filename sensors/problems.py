"""How a sensor reports an entry it had to skip (a malformed policy, a freeze the store refuses): an asset observation
on the asset the entry concerns, so that the problem is on that asset's page in the UI, counted and explained —
besides the error line in the tick's log. The other entries of the tick proceed."""

from __future__ import annotations

import dagster as dg


def automation_problems(asset: dg.AssetKey, sensor: str, problems: list[str]) -> list[dg.AssetObservation]:
    if not problems:
        return []
    return [
        dg.AssetObservation(
            asset_key=asset,
            metadata={
                "automation_problems": len(problems),
                "sensor": sensor,
                "skipped": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems)),
            },
        )
    ]
