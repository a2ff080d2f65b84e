"""The set-up's jobs (assets/jobs.py, generated per use case) build the whole pipeline: every asset the backfill needs
belongs to exactly one job, and every asset's parents are built before it — by an earlier job, or earlier in the
same run."""

from __future__ import annotations

import dagster as dg

import definitions

GRAPH = definitions.defs.resolve_asset_graph()
STAGES = [stage for jobs in definitions.JOBS.values() for stage in jobs.build_order]  # the use cases' build orders


def job_keys(job) -> set[dg.AssetKey]:
    return set(job.selection.resolve(GRAPH))


def on_demand() -> set[dg.AssetKey]:
    """Assets no set-up job builds: the ones tagged to follow live traffic, and external ones (observed, never
    materialized, such as feature_freezes)."""
    return {
        k
        for k in GRAPH.get_all_asset_keys()
        if GRAPH.get(k).tags.get("keel/backfill") == "skip" or not GRAPH.get(k).is_materializable
    }


def test_every_backfilled_asset_is_in_exactly_one_job():
    seen: dict[dg.AssetKey, str] = {}
    for stage in STAGES:
        job = stage.job
        for key in job_keys(job):
            assert key not in seen, f"{key.to_user_string()} is in {seen[key]} and {job.name}"
            seen[key] = job.name
    assert set(seen) == set(GRAPH.get_all_asset_keys()) - on_demand()


def test_parents_are_built_first_and_partitioning_matches_the_job():
    built: set[dg.AssetKey] = set()
    for stage in STAGES:
        job, partitioned = stage.job, stage.partitioned
        keys = job_keys(job)
        for key in keys:
            node = GRAPH.get(key)
            assert node.is_partitioned == partitioned, f"{key.to_user_string()} in {job.name}"
            for parent in node.parent_keys:
                if parent in on_demand():
                    continue
                assert parent in built or parent in keys, f"{key.to_user_string()} needs {parent.to_user_string()}"
                if parent in keys and partitioned:
                    # same run, same month: only an identity dependency can be satisfied inside one run
                    assert GRAPH.get(parent).partitions_def == node.partitions_def
        built |= keys


def test_the_jobs_are_the_definitions_jobs():
    names = {job.name for job in definitions.defs.jobs}
    assert {stage.job.name for stage in STAGES} | {j.challenger.name for j in definitions.JOBS.values()} <= names
