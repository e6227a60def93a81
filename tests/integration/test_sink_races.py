"""Race tests: two attempts of every subtask end within milliseconds; exactly one is committed, per sink."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from pathlib import Path

import pendulum
import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.files import read_json
from tests import services
from tests.conftest import TEST_ENV
from tests.integration.dag_faults import RACE_SINKS
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

FILES, ROWS_PER_FILE = 2, 750  # one file per subtask: run_race checks this against the DAG's parallelism
STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])


@pytest.fixture(scope="module")
def race_env(tmp_path_factory):
    """Source data with unique ids, a private Postgres table and staging schema, and the DAGs' env."""
    data = tmp_path_factory.mktemp("race-data")
    for f in range(FILES):
        ids = list(range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE))
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"row-{i}" for i in ids],
                                 "amount": pa.array([i * 0.25 for i in ids], pa.float64())}),
                       data / f"part-{f:02d}.parquet")
    suffix = uuid.uuid4().hex[:8]
    server, database = services.postgres(), f"race_{suffix}"
    server.create_database(database)
    env = {"SPECULATIVE_RACE_DATA": str(data), "SPECULATIVE_RACE_TABLE": f"race_results_{suffix}",
           "SPECULATIVE_RACE_STAGING": f"race_staging_{suffix}",
           "SPECULATIVE_RACE_DSN": server.dsn(database),
           "AIRFLOW_CONN_POSTGRES_RACE": server.url(database, scheme="postgresql")}
    os.environ.update(env)
    yield env
    for key in env:
        os.environ.pop(key, None)
    server.drop_database(database)


def expected_rows(data: Path) -> list[tuple]:
    return sorted((r["id"], r["name"], r["amount"]) for r in pq.read_table(str(data)).to_pylist())


def checksum(rows: list[tuple]) -> str:
    return hashlib.sha256(repr(sorted(rows)).encode()).hexdigest()


def release_pairs_at_barrier(dag_id: str, stop: threading.Event, store: StoreBackend) -> None:
    """Release a subtask's held ends (fault injection hold_end, dag_faults.RACE_SINKS) once both attempts succeeded.

    Read and written by name, so the same releaser serves a POSIX store and one on S3.
    """
    released: set[str] = set()
    # Each look at an object store is a request per object: less often there (the ends stay held meanwhile).
    interval = 0.02 if isinstance(store, PosixBackend) else 0.1
    while not stop.wait(interval):
        held: dict[str, int] = {}
        for name in store.list_names(dag_id):
            # <dag>/<run>/write/subtask=<n>/attempt=<m>/status.json
            parts = name.split("/")
            if len(parts) != 6 or parts[2] != "write" or parts[5] != "status.json":
                continue
            release = f"{parts[0]}/{parts[1]}/write/barrier.release.{parts[3].split('=')[1]}"
            if release not in released and (store.read_json(name) or {}).get("held_at") is not None:
                held[release] = held.get(release, 0) + 1
        for release, count in held.items():
            if count >= 2:
                store.replace(release, b"")
                released.add(release)


def run_race(dag_id: str, logical_date: pendulum.DateTime, store: StoreBackend | None = None) -> tuple[object, dict]:
    """Run a race DAG through dag.test() with its pairs released together; check one admission per subtask."""
    store = store or PosixBackend(STORE)
    stop = threading.Event()
    releaser = threading.Thread(target=release_pairs_at_barrier, args=(dag_id, stop, store), daemon=True)
    releaser.start()
    try:
        with injected(RACE_SINKS):
            run = load_dag(dag_id, HERE / "dags").test(logical_date=logical_date)
    finally:
        stop.set()
    assert run.state == "success"
    report = run_report(store, dag_id, run.run_id)
    (stage,) = report["stages"]
    assert len(stage["subtasks"]) == FILES, "race_sinks.PARALLELISM must equal FILES (one source file each)"
    for sub in stage["subtasks"]:
        states = sorted(a["state"] for a in sub["attempts"])
        assert len(sub["attempts"]) == 2, sub
        assert states in (["CANCELED", "FINISHED"], ["FINISHED", "FINISHED"]), sub
        assert sum(a["admitted"] for a in sub["attempts"]) == 1
    return run, stage


def assert_race_commits(stage: dict) -> None:
    """Both attempts of most subtasks finished; the loser was discarded or cancelled, never committed."""
    both_finished = sum(sorted(a["state"] for a in s["attempts"]) == ["FINISHED", "FINISHED"]
                        for s in stage["subtasks"])
    assert both_finished >= 1, "hold_end should make attempts finish together"


def test_parquet_sink_commits_exactly_one_attempt_per_subtask(airflow_db, race_env):
    _, stage = run_race("race_parquet", pendulum.datetime(2026, 4, 1, tz="UTC"))
    assert_race_commits(stage)
    out = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "race_parquet" / "2026-04-01"
    manifest = read_json(out / "_SUCCESS")
    admitted = {s["subtask"]: next(a["attempt"] for a in s["attempts"] if a["admitted"]) for s in stage["subtasks"]}
    assert sorted((f["subtask"], f["attempt"]) for f in manifest["files"]) == sorted(admitted.items())
    rows = sorted((r["id"], r["name"], r["amount"]) for r in pq.read_table(str(out)).to_pylist())
    expected = expected_rows(Path(race_env["SPECULATIVE_RACE_DATA"]))
    assert len(rows) == len(expected) == FILES * ROWS_PER_FILE
    assert checksum(rows) == checksum(expected)
    assert not list(out.parent.glob(".2026-04-01.*")), "staging or old directories left behind"


def test_postgres_sink_commits_exactly_one_attempt_per_subtask(airflow_db, race_env):
    run, stage = run_race("race_postgres", pendulum.datetime(2026, 4, 1, tz="UTC"))
    assert_race_commits(stage)
    table, staging = race_env["SPECULATIVE_RACE_TABLE"], race_env["SPECULATIVE_RACE_STAGING"]
    with psycopg2.connect(race_env["SPECULATIVE_RACE_DSN"]) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT id, name, amount FROM "{table}" WHERE ds = %s', ["2026-04-01"])
        rows = sorted(cur.fetchall())
        cur.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'st\\_%%'", [staging])
        (left,) = cur.fetchone()
        cur.execute(f'SELECT run_id, attempts FROM "{staging}".commits WHERE target_table = %s', [table])
        ledger = cur.fetchall()
    expected = expected_rows(Path(race_env["SPECULATIVE_RACE_DATA"]))
    assert len(rows) == len(expected) == FILES * ROWS_PER_FILE
    assert checksum(rows) == checksum(expected)
    assert left == 0, "staging tables left behind"
    admitted = {str(s["subtask"]): next(a["attempt"] for a in s["attempts"] if a["admitted"])
                for s in stage["subtasks"]}
    assert ledger == [(run.run_id, admitted)]


def test_sink_without_marker_is_never_speculated(airflow_db, race_env):
    with injected(RACE_SINKS):  # copies forced: the sink without the marker must still stop them
        run = load_dag("race_unmarked", HERE / "dags").test(logical_date=pendulum.datetime(2026, 4, 2, tz="UTC"))
    assert run.state == "success"
    (stage,) = run_report(STORE, "race_unmarked", run.run_id)["stages"]
    assert stage["speculation"] == (
        "off: sink UnmarkedParquetSink does not implement SupportsConcurrentExecutionAttempts")
    assert [len(s["attempts"]) for s in stage["subtasks"]] == [1, 1]
    assert not any(a["speculative"] for s in stage["subtasks"] for a in s["attempts"])
