"""The fault tests with the store on S3 (issue 41, item 4): the suite's S3 endpoint and Connect servers.

Every test runs with ``store_path = s3://…`` (``experimental_s3_store``): plans, claims, status, manifests,
exchanges, admissions, journals and commits are objects of the endpoint, read and written by name.

- A committed exchange object corrupted on S3 is found by its reader's checksum: exactly its producer
  reruns and is committed again, then the readers, and Q1 equals DuckDB's. gc then removes only what the
  provider wrote: the expired scan's data and a deleted run; objects under the store that
  it did not write (a foreign run prefix, a foreign DAG) are kept.
- A Connect server killed in the middle of its attempts' Spark jobs: those attempts rerun on the other
  server, nothing they began is admitted, and the answer is DuckDB's.
- Two attempts of every subtask finishing together (fault injection ``hold_end``, released through the
  store) commit exactly one attempt per subtask through ``dag.test()`` and a Parquet sink.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pendulum
import psutil
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.control.lifecycle import (
    DELETED_RUN,
    STALE_WARM_UP,
    STALE_WARM_UP_AFTER,
    execute_gc,
    plan_gc,
)
from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.devtools.localcluster import (
    LocalCluster,
    application_id,
    free_base_port,
    jar_paths,
    s3a_jars,
)
from airflow_provider_speculative.devtools.runner import plan_connect_stage, run_stages, write_plan
from airflow_provider_speculative.hooks.objectstore import settings_from_environment, spark_s3_conf
from airflow_provider_speculative.hooks.targets import REMOTE_ENV
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import TEST_ENV
from tests.integration.airflow_cluster import wait_until
from tests.integration.connect_runner import ConnectPool, committed_table
from tests.integration.q1 import assert_q1_equal, duckdb_q1, q1_of_records
from tests.integration.test_sink_races import (  # noqa: F401 (race_env is a fixture)
    FILES,
    ROWS_PER_FILE,
    checksum,
    expected_rows,
    race_env,
    run_race,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
APPS = HERE.parents[1] / "dags" / "apps"
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
KEY = ("l_returnflag", "l_linestatus")


def q1_graph(name: str, data: Path, scan_app: Path = APPS / "q1_scan.py", scans: int = 2) -> PipelineGraph:
    """Q1 as two stages: ``scans`` scan subtasks, an all_to_all exchange, two aggregate subtasks."""
    return PipelineGraph(name, {
        "scan": StageSpec("scan", str(scan_app), scans, {"lineitem": SourceSpec(str(data))},
                          max_parallelism=8, spark_conf=SHUFFLE),
        "aggregate": StageSpec("aggregate", str(APPS / "q1_final.py"), 2,
                               {"partials": ExchangeSpec("scan", "all_to_all", KEY)}, spark_conf=SHUFFLE),
    })


def run_level(graph: PipelineGraph, stage: str, store: StoreBackend, run_id: str, config: SpeculativeConfig,
              target_env: dict[str, dict[str, str]]) -> None:
    """Plan one stage in ``store``, write its plan and drive it to its commit."""
    plan = plan_connect_stage(graph, stage, store, graph.name, run_id, config)
    write_plan(plan)
    run_stages([plan], target_env=target_env, timeout=600)


def lineitem_parts(tpch_data: Path, tmp_path: Path, count: int) -> Path:
    """A directory of the first ``count`` lineitem parts (links)."""
    parts = tmp_path / f"lineitem-{count}"
    parts.mkdir()
    for path in sorted(tpch_data.glob("*.parquet"))[:count]:
        (parts / path.name).symlink_to(path)
    return parts


def running_jobs(ui_port: int) -> int:
    """The Spark jobs running now on the Connect server whose UI is on ``ui_port`` (Spark's REST API)."""
    app = application_id(ui_port)
    if app is None:
        return 0
    url = f"http://127.0.0.1:{ui_port}/api/v1/applications/{app}/jobs?status=running"
    with urllib.request.urlopen(url, timeout=5) as response:
        return len(json.loads(response.read()))


def events(layout: StageLayout) -> list[str]:
    """The names of a stage run's journal events, in order."""
    return [e["event"] for e in layout.store.read_journal(layout.name(layout.journal))]


def test_a_corrupted_exchange_object_reruns_its_producer_then_gc_removes_only_the_providers(
        s3_store, shared_connect_pool: ConnectPool, tpch_data: Path, tmp_path: Path) -> None:
    root, store = s3_store
    data = lineitem_parts(tpch_data, tmp_path, 2)
    graph = q1_graph("f", data)
    config = shared_connect_pool.config(check_interval="300ms")
    run_level(graph, "scan", store, "r1", config, shared_connect_pool.target_env())
    scan = StageLayout.over(store, "f", "r1", "scan")
    victim = store.read_json(scan.name(scan.manifest(1, 0)))["files"][0]
    name = f"{scan.name(scan.data(1, 0))}/{victim['path']}"
    body = bytearray(store.read(name))
    body[len(body) // 2] ^= 0xFF  # one flipped byte: the size is right, the checksum is not
    store.replace(name, bytes(body))

    run_level(graph, "aggregate", store, "r1", config, shared_connect_pool.target_env())

    # Exactly the producer of the corrupted object reran, as a new attempt, and was committed again.
    assert scan.attempt_numbers(0) == [0] and scan.attempt_numbers(1) == [0, 1]
    assert store.read_json(scan.name(scan.admitted(1)))["attempt"] == 1
    committed = store.read_json(scan.name(scan.committed))
    assert committed["subtasks"]["1"]["attempt"] == 1
    assert [r["subtask"] for r in committed["recovered"]] == [1]
    aggregate = StageLayout.over(store, "f", "r1", "aggregate")
    assert events(aggregate).count("recover_partition") == 1 and "input_restored" in events(aggregate)
    answer = q1_of_records(committed_table(store, "f", "r1", "aggregate").to_pylist(), f"{root}/f/r1/aggregate")
    assert_q1_equal(answer, duckdb_q1(data))

    # gc: objects under the store the provider did not write are never touched.
    foreign = ["f/not-a-run/part-0.parquet", "someone-else/r1/scan/plan.json", "f/r1-copy/notes.txt"]
    for key in foreign:
        store.replace(key, b"not the provider's")
    assert any(n.endswith(".parquet") for n in store.list_names("f/r1")), "the run's data should be there"
    kept: list[str] = []
    # The run succeeded and the scan's retention is over: its data goes (its consumer committed), its records stay
    # (expired.json); the aggregate, a final stage without a sink, keeps the pipeline's only copy of its output.
    now = time.time() + 1
    items = plan_gc(store, now=now, run_states={("f", "r1"): "success"}, retention=0, kept=kept)
    summary = execute_gc(items, root=store)
    assert not summary["errors"], summary
    left = [n for n in store.list_names("f/r1") if n.endswith(".parquet")]
    assert left and all(n.startswith("f/r1/aggregate/") for n in left), f"gc left data of the expired scan: {left}"
    assert store.read_json(scan.name(scan.dir / "expired.json")) is not None, "the expired scan is not marked"
    # The run is deleted in Airflow: gc removes its whole prefix, and only it.
    items = plan_gc(store, now=now, run_states={}, deleted_runs=[("f", "r1")], kept=kept)
    assert [i.name for i in items if i.reason == DELETED_RUN] == ["f/r1"], items
    summary = execute_gc(items, root=store)
    assert not summary["errors"], summary
    assert not store.list_names("f/r1"), "gc left objects of the deleted run"
    # A pool warm-up stopped before it deleted its prefix: gone an hour after its claim, the foreign one kept.
    warm_up = f"_warm-up/{uuid.uuid4().hex}"
    store.claim(warm_up)
    store.replace(f"{warm_up}/r0/a/part-0.parquet", b"rows")
    foreign.append(f"_warm-up/{uuid.uuid4().hex}/r0/part-0.parquet")
    store.replace(foreign[-1], b"not the provider's")
    assert plan_gc(store, now=time.time(), kept=kept) == []
    items = plan_gc(store, now=time.time() + STALE_WARM_UP_AFTER + 60, kept=kept)
    assert [(i.name, i.reason) for i in items] == [(warm_up, STALE_WARM_UP)], items
    summary = execute_gc(items, root=store)
    assert not summary["errors"], summary
    assert not store.list_names(warm_up), "gc left objects of the stale warm-up"
    for key in foreign:
        assert store.read(key) == b"not the provider's", f"gc touched {key}, which the provider did not write"


def test_a_connect_server_killed_mid_job_reruns_its_attempts_on_the_other(
        s3_store, shared_connect_pool: ConnectPool, tpch_data: Path, tmp_path: Path) -> None:
    root, store = s3_store
    data = lineitem_parts(tpch_data, tmp_path, 4)
    graph = q1_graph("lost", data, HERE / "apps" / "q1_scan_held_on.py", scans=4)
    cluster = LocalCluster(tmp_path / "doomed")
    base = free_base_port(2)
    conf = {**spark_s3_conf(settings_from_environment()), "spark.jars": ",".join(jar_paths(s3a_jars()))}
    # No warm-up: its attempts hold in a job there until the server is killed, so how warm it is does not matter.
    (doomed,), _ = cluster.start(servers=1, base_port=base, ui_base_port=base + 1, cores=1, conf=conf,
                                 warm_up=False)
    try:
        survivor = shared_connect_pool.servers[0]
        targets = [{"name": "doomed", "conn_id": "spark_connect_doomed", "slots": 2},
                   {"name": survivor.name, "conn_id": survivor.conn_id, "slots": 2}]
        config = SpeculativeConfig().with_overrides(
            {"enabled": False, "check_interval": "200ms", "speed_check_age": 0, "targets": targets}, "test")
        # The attempts on the doomed server hold in a Spark job there (apps/q1_scan_held_on.py) until it dies.
        target_env = {"doomed": {REMOTE_ENV: doomed.url + "/", "SPECULATIVE_TEST_HELD": "1"},
                      survivor.name: {REMOTE_ENV: survivor.url + "/"}}
        failure: list[BaseException] = []

        def scan() -> None:
            try:
                run_level(graph, "scan", store, "r1", config, target_env)
            except BaseException as exc:  # reported by the test's thread below
                failure.append(exc)

        runner = threading.Thread(target=scan, daemon=True)
        runner.start()
        layout = StageLayout.over(store, "lost", "r1", "scan")

        def job_running_on_doomed() -> bool:
            if failure:
                causes = {(s, n): ((store.read_json(layout.name(layout.status(s, n))) or {}).get("cause"),
                                   (store.read(layout.name(layout.attempt_dir(s, n) / "spark-submit.log")) or b"")
                                   .decode(errors="replace")[-600:])
                          for s in range(4) for n in layout.attempt_numbers(s)}
                raise AssertionError(f"the scan failed before the kill: {failure[0]!r}; attempts: {causes}")
            return running_jobs(doomed.ui_port) > 0

        wait_until(job_running_on_doomed, 300, "a Spark job of an attempt to run on the doomed server", interval=0.5)
        claims = {(subtask, number): store.read_json(layout.name(layout.claim(subtask, number))) or {}
                  for subtask in range(4) for number in layout.attempt_numbers(subtask)}
        held_attempts = {key for key, claim in claims.items() if claim.get("target") == "doomed"}
        assert held_attempts, "no attempt was claimed on the doomed server"
        process = cluster.process(doomed)
        assert process is not None, "the doomed server is not running"
        # Its scratch space (copies of the s3a jars among it) is the pool's, so that the kill leaves none in /tmp.
        assert list(cluster.temp_dir(doomed.name).glob("spark-*")), "the server's scratch space is not the pool's"
        for proc in [process, *process.children(recursive=True)]:
            proc.kill()
        psutil.wait_procs([process], timeout=30)
        runner.join(600)
        assert not runner.is_alive(), "the scan did not end within 10 minutes of the kill"
        assert not failure, f"the scan failed: {failure[0]!r}"
    finally:
        cluster.stop()
    assert not cluster.temp_dir(doomed.name).exists(), "stop left the killed server's temporary files"

    report = {s["stage"]: s for s in run_report(store, "lost", "r1")["stages"]}["scan"]
    for sub in report["subtasks"]:
        winner = next(a for a in sub["attempts"] if a["admitted"])
        assert winner["target"] == survivor.name, f"subtask {sub['subtask']} was admitted on {winner}"
        for attempt in sub["attempts"]:
            if (sub["subtask"], attempt["attempt"]) in held_attempts:
                assert attempt["state"] != "FINISHED", f"an attempt on the killed server finished: {attempt}"
    run_level(graph, "aggregate", store, "r1", config, target_env)
    answer = q1_of_records(committed_table(store, "lost", "r1", "aggregate").to_pylist(), f"{root}/lost/r1")
    assert_q1_equal(answer, duckdb_q1(data))


def test_two_attempts_finishing_together_commit_exactly_once_on_s3(
        s3_store, airflow_db, connect_pool, race_env: dict[str, str]) -> None:  # noqa: F811
    root, store = s3_store
    _, stage = run_race("race_connect", pendulum.datetime(2026, 4, 3, tz="UTC"), store)
    admitted: dict[int, Any] = {s["subtask"]: next(a["attempt"] for a in s["attempts"] if a["admitted"])
                                for s in stage["subtasks"]}
    both = sum(sorted(a["state"] for a in s["attempts"]) == ["FINISHED", "FINISHED"] for s in stage["subtasks"])
    assert both >= 1, "hold_end should make attempts finish together"
    out = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "race_connect" / "2026-04-03"
    files = json.loads((out / "_SUCCESS").read_text())["files"]
    assert sorted((f["subtask"], f["attempt"]) for f in files) == sorted(admitted.items())
    rows = sorted((r["id"], r["name"], r["amount"]) for r in pq.read_table(str(out)).to_pylist())
    expected = expected_rows(Path(race_env["SPECULATIVE_RACE_DATA"]))
    assert len(rows) == len(expected) == FILES * ROWS_PER_FILE
    assert checksum(rows) == checksum(expected)
    assert store.list_names("race_connect"), f"nothing of the run is in {root}"
