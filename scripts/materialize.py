"""Materialize keel's 2013 pipeline through a running Dagster webserver, job by job, with progress output.

scripts/up starts ``dagster dev`` (webserver + daemon) first, then runs this. Every run is launched by Dagster
itself from the defined jobs of assets/jobs.py (``BUILD_ORDER``), through the webserver's GraphQL API, exactly as
the UI's "Materialize" button does: runs show under their job in the Runs list and on the Overview timeline, can be
re-executed from the UI, and the monthly jobs fill the assets' partition bars. Partitioned jobs run month by month,
in calendar order, one run at a time (each month's delay rates are built from the months before it, and the drift
sensor acts on the reports in the order they arrive); a failed month is reported and the rest go on, and the
script exits non-zero at the end.

Usage: python scripts/materialize.py --port 3000 [--partitions 2013-01,2013-02]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagster as dg  # noqa: E402

# The asset modules are imported for the job names only: their Dagster preview/beta notices are not news here.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
from dagster._core.events import DagsterEventType  # noqa: E402
from dagster_graphql import DagsterGraphQLClient  # noqa: E402

from assets.jobs import BUILD_ORDER  # noqa: E402
from assets.partitions import monthly_2013  # noqa: E402

LOCATION = "keel"  # workspace.yaml's location_name
TAGS = {"keel/source": "scripts/up"}
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
RUN_TIMEOUT_S = 3600  # a bound on one run, far above any month (seconds on this data)


def wait_for_run(client: DagsterGraphQLClient, run_id: str) -> dg.DagsterRunStatus:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    delay = 0.2
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id)
        if status in TERMINAL:
            return status
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise TimeoutError(f"run {run_id} did not finish in {RUN_TIMEOUT_S} s")


def summary(instance: dg.DagsterInstance, run_id: str) -> tuple[str, list[str]]:
    """One line of what the run made (rows, drift verdict, AUC, the live release) and its failed checks."""
    parts, failed = [], []
    events = instance.all_logs(
        run_id, of_type={DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION}
    )
    for entry in events:
        check = entry.asset_check_evaluation
        if check is not None:
            if not check.passed:
                sev = "warn" if check.severity == dg.AssetCheckSeverity.WARN else "error"
                failed.append(f"{check.asset_key.to_user_string()}:{check.check_name} ({sev})")
            continue
        mat = entry.asset_materialization
        md, key = mat.metadata, mat.asset_key.to_user_string()
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
    return "; ".join(parts), failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="the Dagster webserver's port on 127.0.0.1")
    parser.add_argument("--partitions", help="comma-separated month keys (default: all of 2013)")
    args = parser.parse_args()
    months = args.partitions.split(",") if args.partitions else monthly_2013.get_partition_keys()
    unknown = sorted(set(months) - set(monthly_2013.get_partition_keys()))
    if unknown:
        parser.error(f"--partitions: {', '.join(unknown)} not in 2013-01…2013-12")
    client = DagsterGraphQLClient("127.0.0.1", port_number=args.port, timeout=120)
    instance = dg.DagsterInstance.get()
    t0 = time.perf_counter()
    failures = 0
    print(f"keel: materializing {len(BUILD_ORDER)} jobs over {len(months)} months", flush=True)
    for n, stage in enumerate(BUILD_ORDER, 1):
        print(f"job {n}/{len(BUILD_ORDER)}: {stage.job.name}", flush=True)
        for i, month in enumerate(months if stage.partitioned else [None], 1):
            t = time.perf_counter()
            tags = TAGS | ({"dagster/partition": month} if month else {})
            run_id = client.submit_job_execution(stage.job.name, repository_location_name=LOCATION, tags=tags)
            status = wait_for_run(client, run_id)
            ok = status == dg.DagsterRunStatus.SUCCESS
            failures += not ok
            made, failed_checks = summary(instance, run_id)
            label = f"[{i:>2}/{len(months)}] {month}" if month else "       all"
            state = "ok" if ok else status.value
            print(f"  {label} {state} in {time.perf_counter() - t:4.1f}s  {made}", flush=True)
            if failed_checks:
                print(f"        checks not passed: {', '.join(failed_checks)}", flush=True)
            if not ok:
                print(f"        run {run_id}: see its logs in the UI (Runs)", flush=True)
    print(f"keel: done in {time.perf_counter() - t0:.0f}s, {failures} failed run(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
