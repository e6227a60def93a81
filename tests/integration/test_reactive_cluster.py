"""Reactive slots (FLIP-159) on a real Spark standalone cluster on loopback.

One target with ``"slots": "auto"``: its capacity is read from the master's ``/json/`` every check.
The stage starts with one worker (one core: one attempt at a time); a second worker joins mid-stage
and receives an attempt (its reported node is the new worker's host); that worker is then killed
while its attempt runs: the attempt is cancelled as "node lost" and rerun on the first worker,
without counting as a failure, and the committed result is exactly Q1.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.devtools.runner import plan_local_stage, run_stage
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import read_committed
from airflow_provider_speculative.store.slots import TargetSlots
from tests.integration.q1 import assert_q1_equal, duckdb_q1
from tests.integration.spark_helpers import processes_mentioning, wait_for
from tests.integration.standalone_cluster import StandaloneCluster
from tests.integration.test_standalone_cluster import APPS, DRIVER_CONF, SHUFFLE, merge_partials

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture
def three_files(tmp_path, tpch_data):
    """Three lineitem parts: three scan subtasks."""
    directory = tmp_path / "lineitem"
    directory.mkdir()
    for path in sorted(tpch_data.glob("*.parquet"))[:3]:
        (directory / path.name).symlink_to(path)
    return directory


def attempt_on(layout: StageLayout, parallelism: int, node: str) -> tuple[int, int] | None:
    """An attempt whose executors run on ``node`` now (from its heartbeat), if any."""
    if not layout.dir.exists():
        return None
    for sub in range(parallelism):
        for number in layout.attempt_numbers(sub):
            heartbeat = read_json(layout.heartbeat(sub, number)) or {}
            status = read_json(layout.status(sub, number)) or {}
            if heartbeat.get("node") == node and heartbeat.get("executors") and not status.get("end_at"):
                return sub, number
    return None


def test_worker_joining_gets_attempts_and_a_lost_worker_reruns_them_uncounted(tmp_path, three_files):
    started = time.monotonic()
    with StandaloneCluster(tmp_path / "cluster") as cluster:
        cluster.start(workers=1)
        first = cluster.nodes[0]
        config = SpeculativeConfig().with_overrides({
            "check_interval": "0.5s", "max_failures_per_stage": 0, "max_failures_per_subtask": 0,
            "targets": [{"name": "cluster", "conn_id": "unused", "slots": "auto", "master_ui": cluster.webui_url,
                         "conf": DRIVER_CONF}],
        }, "test")
        # Attempts hold their executor long enough for a worker to join and to be killed mid-attempt.
        held = {"k/scan": {"targets": {"cluster": {"delay": "8s"}}}}
        graph = PipelineGraph("k", {
            "scan": StageSpec("scan", str(APPS / "q1_scan.py"), 3, {"lineitem": SourceSpec(str(three_files))},
                              max_parallelism=8, spark_conf=SHUFFLE),
        })
        root = tmp_path / "store"
        scan = StageLayout(root, "k", "r1", "scan")
        result: dict[str, Any] = {}

        def run_scan() -> None:
            try:
                with injected(held):
                    result["scan"] = run_stage(plan_local_stage(graph, "scan", root, "k", "r1", config,
                                                                cluster.master_url), timeout=600)
            except BaseException as exc:  # surfaced by the main thread
                result["error"] = exc

        runner = threading.Thread(target=run_scan)
        runner.start()
        try:
            wait_for(lambda: attempt_on(scan, 3, first), 300, f"an attempt with executors on {first}")
            # One worker with one core: one slot, so one attempt at a time so far.
            assert TargetSlots(root, "cluster").count() == 1
            second = cluster.add_worker()
            victim = wait_for(lambda: attempt_on(scan, 3, second), 300, f"an attempt with executors on {second}")
            cluster.kill_worker(second)
            cluster.wait_dead(second, 120)
        finally:
            runner.join(600)
        assert "error" not in result, result.get("error")
        controller = result["scan"]

    sched = controller.scheduler
    attempts = {(a.subtask, a.number): a for a in sched.all_attempts()}
    # The joined worker received an attempt; losing it cancelled that attempt, not counted as a failure.
    assert attempts[victim].node == second and attempts[victim].state.value in ("CANCELED", "FAILED")
    assert victim in sched.target_lost
    assert sched.stage_failures() == 0 and sched.failures(victim[0]) == 0
    cancels = [e for e in read_jsonl(scan.journal) if e["event"] == "cancel"]
    assert any(f"node {second}" in e["reason"] and "lost" in e["reason"] for e in cancels), cancels
    # Every subtask's admitted attempt ran on a live worker; the victim's subtask reran on the first one.
    committed = read_committed(scan)
    admitted = {int(k): v["attempt"] for k, v in committed["subtasks"].items()}
    assert admitted[victim[0]] > victim[1] and attempts[(victim[0], admitted[victim[0]])].node == first
    assert_q1_equal(merge_partials(scan, committed), duckdb_q1(three_files))
    # Every slot was given back.
    assert TargetSlots(root, "cluster").count() == 0
    assert processes_mentioning(str(root)) == []
    print(f"\n[reactive] join + loss scenario: {time.monotonic() - started:.1f}s")

