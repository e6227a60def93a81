"""A real Spark standalone cluster on loopback (master + 2 workers, each its own node) as the targets.

Each target is pinned to one worker through the worker's node resource, so an attempt's node is the
worker that ran its executors (read by the runtime from the driver, not the target's label). Covered:
a slow node is blocked and a speculative copy lands on the other worker (through dag.test with a
``spark`` connection from AIRFLOW_CONN_*), and a worker killed mid-stage fails only its attempt, which
reruns on the other worker, with the committed Q1 result still exact (through devtools/runner.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.placement import standalone_pin_conf
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.devtools.runner import plan_local_stage, run_stage
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import read_committed
from tests.conftest import LIGHT_JVM_OPTIONS, TEST_ENV
from tests.integration import dag_faults
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.spark_helpers import HERE, load_dag, processes_mentioning, wait_for
from tests.integration.standalone_cluster import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]

APPS = Path(__file__).resolve().parents[2] / "dags" / "apps"
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
# Drivers run here in client mode: bind them to loopback; executors are small (a worker has 1 GiB) and as
# light as the drivers (tests/conftest.py).
DRIVER_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
               "spark.executor.memory": "512m", "spark.ui.enabled": "false",
               "spark.executor.extraJavaOptions": LIGHT_JVM_OPTIONS}


def cluster_targets(nodes: list[str], conn_id: str = "spark_cluster") -> list[dict[str, Any]]:
    """One target per worker: its node label is the worker's host, its conf pins executors there."""
    return [{"name": f"worker-{i + 1}", "conn_id": conn_id, "slots": 1, "node": node,
             "conf": {**DRIVER_CONF, **standalone_pin_conf(node)}} for i, node in enumerate(nodes)]


def merge_partials(layout: StageLayout, committed: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """Q1 from the scan stage's committed partial aggregates, merged exactly (decimals) in Python."""
    import pyarrow.parquet as pq

    sums: dict[tuple[str, str], dict[str, Any]] = {}
    for sub, entry in committed["subtasks"].items():
        data = layout.data(int(sub), entry["attempt"])
        for file in read_json(layout.manifest(int(sub), entry["attempt"]))["files"]:
            for row in pq.read_table(data / file["path"]).to_pylist():
                group = sums.setdefault((row["l_returnflag"], row["l_linestatus"]), {})
                for column in ("sum_qty", "sum_base_price", "sum_disc_price", "sum_charge", "sum_disc", "count_order"):
                    group[column] = group.get(column, 0) + row[column]
    return {key: {"sum_qty": float(g["sum_qty"]), "sum_base_price": float(g["sum_base_price"]),
                  "sum_disc_price": float(g["sum_disc_price"]), "sum_charge": float(g["sum_charge"]),
                  "avg_qty": float(g["sum_qty"] / g["count_order"]),
                  "avg_price": float(g["sum_base_price"] / g["count_order"]),
                  "avg_disc": float(g["sum_disc"] / g["count_order"]), "count_order": float(g["count_order"])}
            for key, g in sums.items()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Master + 2 workers for the module; stopped (every JVM) at the end."""
    started = time.monotonic()
    with StandaloneCluster(tmp_path_factory.mktemp("standalone")) as running:
        running.start(workers=2)
        print(f"\n[cluster] master + 2 workers ALIVE after {time.monotonic() - started:.1f}s")
        yield running
    assert all(w.proc is None or w.proc.poll() is not None for w in running.workers.values())


@pytest.fixture
def two_files(tmp_path, tpch_data):
    """Two lineitem parts (a quarter of the data): enough for two scan subtasks, quick to run."""
    directory = tmp_path / "lineitem"
    directory.mkdir()
    for path in sorted(tpch_data.glob("*.parquet"))[:2]:
        (directory / path.name).symlink_to(path)
    return directory


def test_cluster_harness_exposes_nodes(cluster):
    state = cluster.state()
    assert cluster.nodes == ["127.0.0.2", "127.0.0.3"]
    assert {w["host"]: w["state"] for w in state["workers"]} == {n: "ALIVE" for n in cluster.nodes}
    # Each worker offers exactly its own node resource: that is what pins a target's executors.
    for worker in state["workers"]:
        assert list(worker["resources"]) == [f"node_{worker['host'].replace('.', '_')}"]


def test_slow_node_is_blocked_and_a_copy_runs_on_the_other_worker(cluster, two_files, airflow_db, monkeypatch):
    nodes = cluster.nodes[:2]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps(
        {"conn_type": "spark", "host": cluster.master_url, "extra": {"deploy-mode": "client"}}))
    monkeypatch.setenv("SPECULATIVE_CLUSTER_TARGETS", json.dumps(cluster_targets(nodes)))
    monkeypatch.setenv("SPECULATIVE_CLUSTER_DATA", str(two_files))
    dag = load_dag("cluster_q1", HERE / "dags")
    started = time.monotonic()
    with injected(dag_faults.cluster_q1(cluster_targets(nodes)[1]["name"])):  # the second worker is slow
        run = dag.test(logical_date=pendulum.datetime(2026, 4, 1, tz="UTC"))
    print(f"\n[cluster] dag.test on the cluster: {time.monotonic() - started:.1f}s")
    assert run.state == "success"

    store = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
    report = run_report(store, "cluster_q1", run.run_id)
    stages = {s["stage"]: s for s in report["stages"]}
    attempts = [a for s in stages.values() for sub in s["subtasks"] for a in sub["attempts"]]
    # Every attempt reports the worker that ran its executors, and that is its target's worker.
    by_target = {t["name"]: t["node"] for t in cluster_targets(nodes)}
    assert attempts and all(a["node"] == by_target[a["target"]] for a in attempts), attempts
    layout = StageLayout(store, "cluster_q1", run.run_id, "scan")
    for sub in range(2):
        for number in layout.attempt_numbers(sub):
            heartbeat = read_json(layout.heartbeat(sub, number))
            assert heartbeat["nodes"] == [heartbeat["node"]] and heartbeat["node"] in nodes

    # The slow worker was blocked; the copy of its subtask ran on the other worker and won.
    slow = stages["scan"]["subtasks"][1]["attempts"]
    assert [(a["node"], a["state"], a["admitted"], a["speculative"]) for a in slow] == [
        (nodes[1], "CANCELED", False, False), (nodes[0], "FINISHED", True, True)]
    assert any(e["event"] == "block_node" and e["node"] == nodes[1] for e in read_jsonl(layout.journal))
    assert nodes[1] in stages["aggregate"]["blocked_nodes"]
    assert [a["node"] for a in stages["aggregate"]["subtasks"][0]["attempts"]] == [nodes[0]]

    output = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "cluster_q1" / "2026-04-01"
    assert_q1_equal(read_q1_output(output), duckdb_q1(two_files))
    assert processes_mentioning(str(layout.dir)) == []


def test_killed_worker_fails_only_its_attempt_which_reruns_elsewhere(cluster, two_files, tmp_path):
    nodes = cluster.nodes[:2]
    doomed = nodes[1]
    targets = [{**t, "conn_id": "unused"} for t in cluster_targets(nodes)]
    config = SpeculativeConfig().with_overrides({
        "check_interval": "0.5s", "executor_loss_timeout": "5s", "block_slow_node_duration": "10 min",
        "targets": targets,
    }, "test")
    # Keep the doomed worker's attempt running (executors alive) long enough to kill it mid-stage.
    doomed_held = {"k/scan": {"targets": {targets[1]["name"]: {"delay": "120s"}}}}
    graph = PipelineGraph("k", {
        "scan": StageSpec("scan", str(APPS / "q1_scan.py"), 2, {"lineitem": SourceSpec(str(two_files))},
                          max_parallelism=8, spark_conf=SHUFFLE),
    })
    root = tmp_path / "store"
    scan = StageLayout(root, "k", "r1", "scan")
    result: dict[str, Any] = {}

    def run_scan() -> None:
        try:
            with injected(doomed_held):
                result["scan"] = run_stage(plan_local_stage(graph, "scan", root, "k", "r1", config,
                                                            cluster.master_url), timeout=600)
        except BaseException as exc:  # surfaced by the main thread
            result["error"] = exc

    started = time.monotonic()
    runner = threading.Thread(target=run_scan)
    runner.start()

    def doomed_attempt() -> tuple[int] | None:
        for sub in range(2):
            for number in scan.attempt_numbers(sub) if scan.dir.exists() else []:
                heartbeat = read_json(scan.heartbeat(sub, number)) or {}
                if heartbeat.get("node") == doomed and heartbeat.get("executors"):
                    return (sub,)
        return None

    (victim,) = wait_for(doomed_attempt, 300, f"an attempt with executors on {doomed}")
    killed_at = cluster.kill_worker(doomed)
    dead_at = cluster.wait_dead(doomed, 120)
    wait_for(lambda: (read_json(scan.status(victim, 0)) or {}).get("state") == "FAILED", 120,
             "the killed worker's attempt to fail")
    failed = read_json(scan.status(victim, 0))
    print(f"\n[cluster] worker killed -> master DEAD {dead_at - killed_at:.1f}s, attempt FAILED "
          f"{failed['end_at'] - killed_at:.1f}s")
    runner.join(600)
    assert "error" not in result, result.get("error")
    controller = result["scan"]

    # Only the victim's attempt failed, as node lost; the node was blocked; the rerun ran on the other worker.
    assert failed["failure_kind"] == "node_lost" and "node lost" in failed["cause"]
    attempts = sorted(controller.scheduler.all_attempts(), key=lambda a: (a.subtask, a.number))
    assert [(a.subtask, a.number, a.node, a.state.value) for a in attempts] == sorted([
        (1 - victim, 0, nodes[0], "FINISHED"), (victim, 0, doomed, "FAILED"), (victim, 1, nodes[0], "FINISHED")])
    blocks = [e for e in read_jsonl(scan.journal) if e["event"] == "block_node"]
    assert [b["node"] for b in blocks] == [doomed]

    # The dead worker stays blocked for the run's next stages (run-scoped blocklist).
    assert list(read_json(scan.blocklist)["until"]) == [doomed]
    # The committed partials (one per subtask, the rerun's for the victim) add up to exactly Q1.
    committed = read_committed(scan)
    assert {int(k): v["attempt"] for k, v in committed["subtasks"].items()} == {1 - victim: 0, victim: 1}
    assert_q1_equal(merge_partials(scan, committed), duckdb_q1(two_files))
    print(f"[cluster] kill scenario: {time.monotonic() - started:.1f}s")
    assert processes_mentioning(str(root)) == []
    # The cluster still works with a replacement worker (a new node).
    replacement = cluster.add_worker()
    assert cluster.worker_states()[replacement] == "ALIVE" and replacement not in nodes
