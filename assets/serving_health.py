"""``serving_health``: what actually answered, per model and day, judged against the model's tier — its check and the
``degraded_serving`` incident.

Every status the gateway returns can be 200 while the model serves nothing: the coarse fallback answers for a dead
runtime, the last resort for a missing model. This asset reads the day's exposure log (every request, one line) and
says how each request ended (keel/serving_health.py: scored by a version, coarse, last resort, failed by error code),
with the share each version scored, the answers given while the breaker was open, and p50/p99. Its check
``serving_objective`` fails when a day missed its model's SLA tier (the model's own answers below the tier's
availability, more than 5 % answered by a fallback, failed requests, p99 over target); each such (model, day) opens a
``degraded_serving`` incident (keel/incidents.py: the watchdog sends it as an alert) with the breaches as its located
cause, recovered by the first later day the model served as promised.

Built with each metered day (job ``keel_metering``, launched by the metering sensor as the gateway's days end).
"""

from __future__ import annotations

import warnings
from datetime import UTC, datetime

import dagster as dg
import polars as pl

from assets.metering import BY_DAY, METERING_DAYS, ON_DEMAND, SERVING_HEALTH, day_span
from keel.exposure_log import scan_exposures
from keel.factories.markdown import frame_to_markdown
from keel.incidents import IncidentLog
from keel.serving_health import DayHealth, day_health, tier_for
from resources import simulated
from resources.home import KeelHomeResource
from resources.policy import PolicyStoreResource
from resources.simulated import SIM_TAG

SERVING_OBJECTIVE = "serving_objective"
KIND = "degraded_serving"
SCHEMA = {
    "model": pl.String, "day": pl.String, "requests": pl.Int64, "scored_share": pl.Float64,
    "coarse_share": pl.Float64, "last_resort_share": pl.Float64, "failed_share": pl.Float64,
    "breaker_open": pl.Int64, "breaker_open_s": pl.Float64, "p50_ms": pl.Float64, "p99_ms": pl.Float64, "versions": pl.String,
    "errors": pl.String, "breaches": pl.String,
}  # fmt: skip

with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)  # the backfill policy (assets/metering.py says why)

    @dg.asset(
        key=SERVING_HEALTH,
        partitions_def=METERING_DAYS,
        group_name="operations",
        kinds={"parquet"},
        tags=ON_DEMAND,
        metadata=BY_DAY,
        backfill_policy=dg.BackfillPolicy.single_run(),
        check_specs=[
            dg.AssetCheckSpec(
                SERVING_OBJECTIVE,
                asset=SERVING_HEALTH,
                description="Every model served each day of the run as its SLA tier promises: its own answers at "
                "least the tier's availability, at most 5 % answered by the coarse model or the last resort, no "
                "failed request, p99 within the tier's target. Fails naming the model, the day and what it missed; "
                "each such day is a `degraded_serving` incident.",
            )
        ],
        description="What actually answered, per model and day, from the gateway's exposure log: the share the model "
        "scored (and each version's), the coarse fallback's, the last resort's and the failed requests' (by error "
        "code), answers given while the breaker was open and for how long, p50/p99 — whatever status the client saw. Judged against "
        "each model's SLA tier by its check; a missed day opens a `degraded_serving` incident. See docs/ui.md.",
    )
    def serving_health(context, keel_home: KeelHomeResource, policies: PolicyStoreResource):
        days = context.partition_keys
        home = keel_home.layout()
        records, skipped = [], 0
        for runtime in home.serving_dirs():
            for day in days:
                scan = scan_exposures(runtime.exposures, day=day)
                records += scan.records
                skipped += scan.skipped
        health = day_health(records)
        with policies.open() as store:
            state = store.state()
        judged = [(h, h.breaches(tier_for(state, h.model))) for h in health]
        frame = pl.DataFrame([h.as_row() | {"breaches": "; ".join(b)} for h, b in judged], schema=SCHEMA)
        missed = [(h, b) for h, b in judged if b]
        when = context.run.tags.get(SIM_TAG) or datetime.now(UTC).isoformat(timespec="seconds")
        record_incidents(home, judged, when)
        for h, b in missed:
            context.log.warning(f"{h.model} on {h.day}: {'; '.join(b)}")
        for day in days:  # each day's partition shows its own numbers, not the run's
            mine = [h for h in health if h.day == day]
            requests = sum(h.requests for h in mine)
            context.add_asset_metadata(
                {
                    "day": day,
                    "requests": requests,
                    "scored_share": dg.MetadataValue.float(
                        round(sum(h.scored for h in mine) / requests, 4) if requests else 0.0
                    ),
                    "degraded_models": sum(1 for h, b in missed if h.day == day),
                    "missed": dg.MetadataValue.md(
                        "\n".join(f"- **{h.model}**: {'; '.join(b)}" for h, b in missed if h.day == day)
                        or "every model met its tier"
                    ),
                    "dagster/row_count": len(mine),
                    "health": dg.MetadataValue.md(
                        frame_to_markdown(frame.filter(pl.col("day") == day).drop("breaches", "day"), max_rows=50)
                    ),
                },
                partition_key=day,
            )
        yield dg.Output(
            frame, metadata={**simulated.of_run(context), "run_days": day_span(days), "skipped_lines": skipped}
        )
        yield dg.AssetCheckResult(
            check_name=SERVING_OBJECTIVE,
            passed=not missed,
            metadata={
                "days_judged": len(judged),
                "days_missed": len(missed),
                "why": dg.MetadataValue.md(
                    "\n".join(f"- **{h.model} {h.day}**: {'; '.join(b)}" for h, b in missed)
                    or "every day met its tier"
                ),
            },
        )


def record_incidents(home, judged: list[tuple[DayHealth, list[str]]], when: str) -> None:
    """Open a ``degraded_serving`` incident for each (model, day) that missed its tier; close a model's open ones
    when a later day of it met the tier."""
    with IncidentLog(home.incidents) as log:
        for h, breaches in sorted(judged, key=lambda x: (x[0].day, x[0].model)):
            if breaches:
                log.open_incident(
                    f"{KIND}:{h.model}:{h.day}", KIND, "critical",
                    f"{h.model} served degraded on {h.day}: {breaches[0]}",
                    located="; ".join(breaches), detected_at=when, requests_failed=h.failed,
                    requests_degraded=h.fallback, source="serving_health", details=h.as_row(),
                )  # fmt: skip
                continue
            for incident in log.open_incidents(KIND):
                if incident.key.startswith(f"{KIND}:{h.model}:") and incident.key.rsplit(":", 1)[1] < h.day:
                    log.open_incident(incident.key, KIND, incident.severity, incident.summary, recovered_at=when,
                                      action=f"served as its tier promises again on {h.day}")  # fmt: skip
