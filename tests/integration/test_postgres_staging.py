"""PostgresSink staging on a real Postgres: a failed stage run, discarded attempts and gc leave no staging table.

Real Postgres (the session's throw-away server, tests/services.py), a private database per test module; real Spark
DataFrames (a Connect session on the suite's pool) written by the sink's own writer; the operator's real failure path.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psycopg2
import pytest

from airflow_provider_speculative.control.lifecycle import SINK_STAGING, execute_gc, list_sink_staging, plan_gc
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.plan import PLAN_VERSION
from airflow_provider_speculative.exceptions import StageFailedError
from airflow_provider_speculative.sinks.base import InitializationContext, StagingScope
from airflow_provider_speculative.sinks.postgres import PostgresSink, dsn_env_var
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from tests import services

CONN_ID = "pg_staging_test"
SUBTASKS, ATTEMPTS = 10, 2


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A private database (unique name), dropped afterwards; its DSN is what attempts would get."""
    name = f"safety_{uuid.uuid4().hex[:10]}"
    server = services.postgres()
    server.create_database(name)
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = server.url(name, scheme="postgresql")
    try:
        yield server.dsn(name)
    finally:
        os.environ.pop(f"AIRFLOW_CONN_{CONN_ID.upper()}", None)
        server.drop_database(name)


@pytest.fixture(scope="module")
def spark(shared_connect_pool) -> Iterator[object]:
    """A Spark Connect session on the suite's pool, as a Connect attempt has (the host's files are the server's).

    Not a driver in the test process: a second JVM there costs a start-up and, once, did not come up in CI.
    """
    from pyspark.sql import SparkSession

    from airflow_provider_speculative.core.contract import SPARK_CONNECT_MODE_ENV

    # pyspark's builder switches the whole process into Connect mode (os.environ): put it back afterwards, or every
    # Spark process a later test starts from here would try to be a Connect client.
    before = {name: os.environ.get(name) for name in SPARK_CONNECT_MODE_ENV}
    session = SparkSession.builder.remote(shared_connect_pool.servers[0].url + "/").getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def staging_tables(dsn: str) -> list[str]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'speculative_staging' ORDER BY 1")
        return [r[0] for r in cur.fetchall()]


def write_attempts(spark: object, dsn: str, sink: PostgresSink, run_id: str, tmp: Path,
                   attempts: int = ATTEMPTS) -> None:
    """Every attempt of a 10-subtask stage writes its staging table through the sink's own writer."""
    os.environ[dsn_env_var(CONN_ID)] = dsn
    try:
        df = spark.createDataFrame([(i, f"row {i}") for i in range(5)], "id bigint, name string")  # type: ignore[attr-defined]
        for subtask in range(SUBTASKS):
            for attempt in range(attempts):
                writer = sink.create_writer(InitializationContext(subtask, SUBTASKS, attempt, "dag", run_id, "write",
                                                                  tmp / f"{subtask}-{attempt}"))
                assert writer.write(df)["records"] == 5
    finally:
        os.environ.pop(dsn_env_var(CONN_ID), None)


def stage_plan(root: Path, sink: PostgresSink, run_id: str) -> StageLayout:
    layout = StageLayout(root, "dag", run_id, "write")
    layout.claim_run()  # as planning does: gc and the failure path act only on runs this store owns
    atomic_write_json(layout.plan, {
        "version": PLAN_VERSION, "targets": {},
        "stage": "write", "dag_id": "dag", "run_id": run_id, "store_root": str(root), "parallelism": SUBTASKS,
        "output": {"key": [], "max_parallelism": 32, "sink": sink.to_json()}, "subtasks": [], "consumers": [],
        "config": {}, "fingerprint": "fp"})
    return layout


def test_failed_stage_run_discarded_attempts_and_gc_leave_no_staging(
        database: str, spark: object, tmp_path: Path) -> None:
    from airflow_provider_speculative.operators.stage import SparkStageOperator

    sink = PostgresSink("results", postgres_conn_id=CONN_ID)
    root = tmp_path / "store"

    # A discarded attempt: the controller's hook drops exactly that attempt's table.
    write_attempts(spark, database, sink, "run_discard", tmp_path / "d")
    assert len(staging_tables(database)) == SUBTASKS * ATTEMPTS
    removed = sink.cleanup_staging(StagingScope("dag", "run_discard", "write", ((3, 1),),
                                                env={dsn_env_var(CONN_ID): database}))
    prefix = sink.staging_prefix("dag", "run_discard", "write")
    assert removed == [f"speculative_staging.{prefix}s3_a1"]
    assert len(staging_tables(database)) == SUBTASKS * ATTEMPTS - 1

    # The stage run fails: the operator's failure path drops every staging table of the run.
    layout = stage_plan(root, sink, "run_discard")
    graph = PipelineGraph("p", {"write": StageSpec("write", "/apps/w.py", SUBTASKS,
                                                   {"rows": SourceSpec("/data/rows")})})
    operator = SparkStageOperator(task_id="write", graph=graph, stage="write", sink=sink)
    event = {"status": "failed", "plan_path": str(layout.plan), "reason": "too many failed attempts",
             "causes": ["subtask 0 attempt 0: boom"]}
    with pytest.raises(StageFailedError, match="pipeline 'p', stage 'write' failed"):
        operator.execute_complete({"ti": SimpleNamespace(try_number=1)}, event)
    assert staging_tables(database) == []
    journal = [json.loads(line) for line in layout.journal.read_text().splitlines()]
    assert next(e for e in journal if e["event"] == "sink_staging_removed")["scope"] == "stage run"

    # A run whose clean-up never happened (worker killed): gc finds its orphans once the run is over.
    write_attempts(spark, database, sink, "run_orphans", tmp_path / "o", attempts=1)
    stage_plan(root, sink, "run_orphans")
    now = time.time()
    running = plan_gc(root, now=now, run_states={("dag", "run_orphans"): "running"}, sink_staging=list_sink_staging)
    assert [i for i in running if i.reason == SINK_STAGING] == []
    items = [i for i in plan_gc(root, now=now, run_states={("dag", "run_orphans"): "failed"},
                                sink_staging=list_sink_staging) if i.reason == SINK_STAGING]
    assert len(items) == SUBTASKS and all(i.bytes > 0 for i in items)
    summary = execute_gc(items, now=now)
    assert summary["by_reason"][SINK_STAGING]["removed"] == SUBTASKS and not summary["errors"]
    assert staging_tables(database) == []


def test_copy_round_trips_every_supported_type_through_staging_and_commit(
        database: str, spark: object, tmp_path: Path) -> None:
    """What COPY's CSV could get wrong (NULL vs empty string, quotes, newlines, bytes, NaN) reads back as written."""
    import datetime as dt
    from decimal import Decimal

    from airflow_provider_speculative.sinks.base import AttemptResult, FinalizationContext

    rows = [
        (1, "plain", "", Decimal("12.34"), dt.date(2026, 1, 31), dt.datetime(2026, 1, 31, 12, 0, 1, 500),
         True, 1.5, bytearray(b"\x00\xff,\"\n"), 2**62),
        (2, 'quote " comma , newline \n cr \r backslash \\ tab \t', None, None, None, None, None, None, None, None),
        (3, "é ü 漢字 😀", "NULL", Decimal("-0.01"), dt.date(1, 1, 1), dt.datetime(1970, 1, 1), False,
         float("nan"), bytearray(), -(2**63)),
        (4, "\\N", " ", Decimal("0"), dt.date(9999, 12, 31), dt.datetime(2026, 6, 1, 23, 59, 59), None,
         float("inf"), None, 0),
    ]
    schema = ("id int, text_value string, maybe string, amount decimal(10,2), day date, at timestamp_ntz, "
              "flag boolean, ratio double, raw binary, big bigint")
    df = spark.createDataFrame(rows, schema)  # type: ignore[attr-defined]
    sink = PostgresSink("round_trip", postgres_conn_id=CONN_ID, partition_value="2026-01-31")
    os.environ[dsn_env_var(CONN_ID)] = database
    try:
        writer = sink.create_writer(InitializationContext(0, 1, 0, "dag", "run_types", "write", tmp_path / "w"))
        info = writer.write(df)
    finally:
        os.environ.pop(dsn_env_var(CONN_ID), None)
    assert info["records"] == len(rows)
    admitted = AttemptResult(subtask=0, attempt=0, data_dir=tmp_path / "w", files=[], sink_info=info)
    result = sink.finalize_global(FinalizationContext(1, {0: admitted}, "dag", "run_types", "write"))
    assert result["records"] == len(rows) and staging_tables(database) == ["commits"]  # the ledger only
    with psycopg2.connect(database) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, text_value, maybe, amount, day, at, flag, ratio, raw, big, ds FROM round_trip "
                    "ORDER BY id")
        stored = cur.fetchall()
    expected = [tuple(r) for r in df.collect()]  # type: ignore[attr-defined]
    for got, want in zip(stored, expected, strict=True):
        assert got[-1] == "2026-01-31"
        for column, (g, w) in enumerate(zip(got[:-1], want, strict=True)):
            if isinstance(w, float) and w != w:
                assert g != g, (column, got)  # NaN stays NaN
            elif isinstance(w, bytes | bytearray):
                assert bytes(g) == bytes(w), (column, got)
            else:
                assert g == w, (column, got, want)
