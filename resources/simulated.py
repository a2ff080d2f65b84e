"""The simulated time an event of a live replay belongs to, on the event itself.

In a live replay (docs/live.md) the runs the sensors and the set-up launch carry the simulated instant they were
asked at (the run tag ``keel/sim_now``, in the use case's own time); Dagster itself stamps every event with the wall
clock, so a whole replayed year sits in a sliver of one afternoon on the UI's timelines and plots. Every
materialization (through the Parquet IO manager, or an asset's own ``MaterializeResult``) and observation of such a
run therefore carries ``simulated_at`` and its ``simulated_month`` in its metadata — where a person reads the year as it
happened. Outside a replay (no clock file in the home: a backfill, production) nothing is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

SIM_TAG = "keel/sim_now"  # the simulated instant a run was asked at (ISO 8601, the use case's own time)
CLOCK_FILE = "clock.json"  # keel.home.KeelHome.clock: a live replay's clock


def simulated_metadata(tags: Mapping[str, str], home: Path | str | None) -> dict[str, str]:
    """``simulated_at`` and ``simulated_month`` from a replay run's ``tags``; {} outside a replay (no clock in
    ``home``) or for a run no replay launched."""
    sim = tags.get(SIM_TAG)
    if not sim or home is None or not (Path(home) / CLOCK_FILE).exists():
        return {}
    return {"simulated_at": sim, "simulated_month": sim[:7]}


def of_run(context) -> dict[str, str]:
    """``simulated_metadata`` of the run an asset's ``context`` executes in, in the environment's KEEL_HOME (where
    every resource of the deployment points: definitions.py)."""
    from keel.home import KeelHome

    return simulated_metadata(context.run.tags, KeelHome.from_env().root)
