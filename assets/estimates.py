"""The loop report's record of the estimator (keel/loop/estimate.py): each served version's quality as estimated from
its scores alone, beside the realized value on the same rows once the labels are in — the estimator measured month
by month, and a WARN check (``estimate_held``) when it missed, saying whether the labels show concept drift (a change
of how the label follows the features, keel/loop/concept.py: invisible to an estimate made from the scores) or not
(the estimator's own error); the outcome gate still decides on labels."""

from __future__ import annotations

import dagster as dg

from keel.factories.checks import partitioned_check
from keel.loop.estimate import TOLERANCE
from keel.loop.report import EstimateRecord

ESTIMATE_CHECK = "estimate_held"
ESTIMATES_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("version", "int", description="the served model version"),
        dg.TableColumn("metric", "string", description="the task's headline metric"),
        dg.TableColumn("estimated", "float", description="from the scores alone, before the labels"),
        dg.TableColumn("realized", "float", description="on the same rows' labels"),
        dg.TableColumn("error", "float", description="estimated − realized (AUC), estimated / realized − 1 (RMSE)"),
        dg.TableColumn("held", "bool", description="within the tolerance"),
        dg.TableColumn("rows", "int"),
        dg.TableColumn(
            "concept_drift",
            "bool",
            description="the labels show the estimator's assumption broke (empty: too few days)",
        ),
        dg.TableColumn("concept", "string", description="the test on the labels (keel/loop/concept.py), in words"),
        dg.TableColumn(
            "realized_se",
            "float",
            description="the realized value's own standard error on these rows, clustered by day (RMSE; empty: AUC)",
        ),
        dg.TableColumn(
            "within_noise", "bool", description="the estimate inside the realized value's own 95 % interval"
        ),
    ]
)


def estimate_check_spec(report_key: dg.AssetKey, partitions_def, task: str) -> dg.AssetCheckSpec:
    tolerance = f"{TOLERANCE['auc']} AUC" if task == "binary" else f"{TOLERANCE['rmse']:.0%} RMSE"
    return partitioned_check(
        ESTIMATE_CHECK,
        asset=report_key,
        partitions_def=partitions_def,
        description=f"each served version's quality as estimated from its scores alone (keel/loop/estimate.py) came "
        f"within {tolerance} of the realized value (a WARN: concept drift is invisible to the estimate; the outcome "
        "gate still decides on labels)",
    )


def estimates_table(estimates: list[tuple[int, EstimateRecord]]) -> dg.MetadataValue:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "version": v,
                    "metric": e.metric,
                    "estimated": round(e.estimated, 4),
                    "realized": round(e.realized, 4),
                    "error": round(e.error, 4),
                    "held": e.held,
                    "rows": e.rows,
                    "concept_drift": e.concept.drifted if e.concept else None,
                    "concept": e.concept.describe() if e.concept else "too few days to judge",
                    "realized_se": round(e.realized_se, 4) if e.realized_se is not None else None,
                    "within_noise": e.within_noise,
                }
            )
            for v, e in estimates
        ],
        schema=ESTIMATES_SCHEMA,
    )


def estimate_check(key: dg.AssetKey, estimates: list[tuple[int, EstimateRecord]]) -> dg.AssetCheckResult:
    """``estimate_held``: every served version's estimate within its tolerance of the realized value; which missed,
    and by how much, when one did."""
    missed = [
        f"v{v}: {e.metric} estimated {e.estimated:.4f}, realized {e.realized:.4f} — "
        + (e.concept.describe() if e.concept else "too few days to say whether it was concept drift")
        for v, e in estimates
        if not e.held
    ]
    unexplained = [(v, e) for v, e in estimates if not e.held and not (e.concept and e.concept.drifted)]
    noise = [v for v, e in unexplained if e.within_noise]
    own = [v for v, e in unexplained if not e.within_noise]
    if not estimates:
        why = "no served version of the month has an estimator (trained before models kept one) or enough rows"
    elif missed:
        causes = []
        if own:
            causes.append(f"the estimator's own error on v{', v'.join(map(str, own))} (no concept drift found)")
        if noise:
            causes.append(
                f"on v{', v'.join(map(str, noise))} no concept drift found and the miss inside the realized value's "
                "own 95 % interval: these rows cannot tell it from their sampling noise"
            )
        cause = "; ".join(causes) or "concept drift: the labels moved where the scores did not"
        why = f"the estimate missed — {cause}; the outcome gate decides on labels: " + "; ".join(missed)
    else:
        why = "every served version's estimate held: " + ", ".join(
            f"v{v} {e.metric} {e.estimated:.4f} vs {e.realized:.4f}" for v, e in estimates
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=ESTIMATE_CHECK,
        passed=not missed,
        severity=dg.AssetCheckSeverity.WARN,
        description=why,
    )
