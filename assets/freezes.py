"""What the online store serves frozen, as an asset the UI shows: which features, at what value, since when, why.

The drift sensor freezes and unfreezes features in the online store (sensors/drift.py). The store keeps the state
and its log; ``feature_freezes`` is an external asset — keel does not materialize it, the drift sensor observes it
each time it acts — so that served degradation is on an asset page with its history, not only in tick logs and
response bodies. The gateway's /metrics says the same (``keel_features_frozen``).
"""

from __future__ import annotations

from functools import cache

import dagster as dg

from assets.drift import build_drift_assets
from assets.usecase import wiring
from keel.features.online import OnlineStore
from keel.usecase import UseCase

RECENT_CHANGES = 20


@cache
def build_freezes_spec(uc: UseCase) -> dg.AssetSpec:
    """The use case's ``feature_freezes``: an external asset in its features group, downstream of its drift report."""
    w = wiring(uc)
    return dg.AssetSpec(
        w.key("feature_freezes"),
        group_name=w.group("features"),
        kinds={"sqlite"},
        deps=[build_drift_assets(uc)[1].key],
        description="Features the online store serves frozen (a fixed value, every answer flagged "
        "`frozen:<feature>`), with the value, since when and the drift decision behind each; observed by the drift "
        "sensor whenever it freezes or unfreezes. `frozen` plots the count over time.",
    )


def freeze_observation(
    store: OnlineStore, sensor: str, key: dg.AssetKey, simulated: dict[str, str] | None = None
) -> dg.AssetObservation:
    """What ``store`` serves frozen now and its recent changes, as an observation of the freezes asset ``key``;
    ``simulated``: a live replay's simulated time of it (resources/simulated.py)."""
    frozen = store.frozen()
    log = store.freeze_log()
    since = {}
    for event in log:  # the latest freeze of each feature still frozen
        if event.action == "freeze":
            since[event.feature] = event
    current = [
        dg.TableRecord(
            {
                "feature": name,
                "value": value,
                "since": since[name].at.isoformat(timespec="seconds") if name in since else None,
                "decision": since[name].reason if name in since else None,
            }
        )
        for name, value in sorted(frozen.items())
    ]
    changes = [
        dg.TableRecord(
            {
                "at": e.at.isoformat(timespec="seconds"),
                "feature": e.feature,
                "action": e.action,
                "value": e.value,
                "reason": e.reason,
            }
        )
        for e in reversed(log[-RECENT_CHANGES:])
    ]
    return dg.AssetObservation(
        asset_key=key,
        metadata={
            **(simulated or {}),
            "frozen": len(frozen),
            "frozen_features": ", ".join(sorted(frozen)) or "none",
            "freezes": dg.MetadataValue.table(
                records=current,
                schema=dg.TableSchema(
                    columns=[
                        dg.TableColumn("feature", "string"),
                        dg.TableColumn("value", "float", description="what every answer uses instead"),
                        dg.TableColumn(
                            "since", "string", description="UTC, the shared clock's (simulated in a live replay)"
                        ),
                        dg.TableColumn("decision", "string", description="the drift decision and its report"),
                    ]
                ),
            ),
            "recent_changes": dg.MetadataValue.table(
                records=changes,
                schema=dg.TableSchema(
                    columns=[
                        dg.TableColumn(
                            "at", "string", description="UTC, the shared clock's (simulated in a live replay)"
                        ),
                        dg.TableColumn("feature", "string"),
                        dg.TableColumn("action", "string"),
                        dg.TableColumn("value", "float"),
                        dg.TableColumn("reason", "string"),
                    ]
                ),
            ),
            "observed_by": sensor,
        },
    )
