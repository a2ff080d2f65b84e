"""The Dagster instance on PostgreSQL (issue 19): `dagster dev` — webserver and daemon — with run, event-log and
schedule storage in a database of its own on the machine's real PostgreSQL server (127.0.0.1:5432), a defined job
launched through the webserver, and sensor ticks recorded by the daemon; nothing in SQLite files."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from tests import REPO
from tests.dagster_support import DAGSTER, free_port
from tests.live_platform import stop_groups, wait_until, webserver_up

pytestmark = pytest.mark.slow
SERVER = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture(scope="module")
def database():
    import psycopg2

    name = f"keel_dagster_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(f"{SERVER}/postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')  # a name made here, not input
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="module")
def dagster_on_postgres(tmp_path_factory, database):
    home = tmp_path_factory.mktemp("keel_home")
    env = os.environ | {"KEEL_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home"),
                        "KEEL_DAGSTER_POSTGRES_URL": database}  # fmt: skip
    # what scripts/env.sh does with the variable set
    setup = subprocess.run(["bash", "-c", "source scripts/env.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert setup.returncode == 0, setup.stderr
    assert "KEEL_DAGSTER_POSTGRES_URL" in (home / "dagster_home" / "dagster.yaml").read_text()
    port = free_port()
    proc = subprocess.Popen(
        [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=env, stdout=open(home / "dagster_dev.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_until("dagster dev is up", lambda: webserver_up(port, proc, home / "dagster_dev.log"), 300, 1)
        yield home, port, env
    finally:
        stop_groups([proc])


def rows(database: str, sql: str) -> list[tuple]:
    import psycopg2

    with psycopg2.connect(database.replace("+psycopg2", "")) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_a_job_runs_and_sensors_tick_with_everything_stored_in_postgres(dagster_on_postgres, database):
    import dagster as dg
    from dagster_graphql import DagsterGraphQLClient

    home, port, env = dagster_on_postgres
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    run_id = client.submit_job_execution("flights_reference_tables")
    deadline = time.monotonic() + 600
    while (status := client.get_run_status(run_id)) not in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE):
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert status == dg.DagsterRunStatus.SUCCESS, (home / "dagster_dev.log").read_text()[-3000:]

    # The run and its events are rows of the Postgres database …
    assert rows(database, f"SELECT status FROM runs WHERE run_id = '{run_id}'") == [("SUCCESS",)]  # noqa: S608
    materialized = rows(
        database,
        f"SELECT DISTINCT asset_key FROM event_logs WHERE run_id = '{run_id}' "  # noqa: S608 - a run id made here
        "AND dagster_event_type = 'ASSET_MATERIALIZATION'",
    )
    assert {f'["flights", "{t}"]' for t in ("raw_planes", "raw_airlines", "raw_airports")} <= {
        r[0] for r in materialized
    }
    # … and the daemon's sensor ticks too (watchdog_sensor runs every 10 s).
    deadline = time.monotonic() + 300
    while not any(
        "watchdog_sensor" in body
        for (body,) in rows(database, "SELECT tick_body FROM job_ticks WHERE type = 'SENSOR'")
    ):
        assert time.monotonic() < deadline, "no watchdog_sensor tick recorded in Postgres"
        time.sleep(2)
    os.environ["KEEL_DAGSTER_POSTGRES_URL"] = database  # the instance reads its URL from the environment
    try:
        with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS
    finally:
        os.environ.pop("KEEL_DAGSTER_POSTGRES_URL", None)
    # nothing of the instance went to SQLite files
    leftovers = [p.name for p in (home / "dagster_home").rglob("*.db")]
    assert leftovers == [], leftovers
