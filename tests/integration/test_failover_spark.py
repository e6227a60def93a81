"""FLIP-1 with real Spark: a corrupted upstream partition reruns exactly its producer, then its readers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from airflow_provider_speculative.backends.controller import StageController
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.store.files import atomic_write_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import admitted_results, read_committed, write_committed
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.spark_helpers import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

APPS = Path(__file__).resolve().parents[2] / "dags" / "apps"
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
KEY = ("l_returnflag", "l_linestatus")


def run_stage(graph: PipelineGraph, stage: str, root: Path, files: list[tuple[str, int]]) -> StageController:
    """Plan, run and commit one stage the way the operator and trigger do, without Airflow."""
    config = SpeculativeConfig().with_overrides({"check_interval": 0.5}, "test")
    spec = graph.stages[stage]
    command = [SPARK_SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false", spec.application]
    upstream = {u: read_committed(StageLayout(root, "f", "r1", u)) for u in graph.upstreams(stage)}
    plan = plan_stage(graph, stage, config, source_files={"lineitem": files}, upstream_committed=upstream,
                      sink=None, speculation_blocker=None,
                      context={"dag_id": "f", "run_id": "r1", "store_root": str(root), "logical_date": None,
                               "application": spec.application,
                               "commands": {t.name: command for t in config.targets}})
    layout = StageLayout(root, "f", "r1", stage)
    atomic_write_json(layout.plan, plan)
    controller = StageController(plan)

    def done() -> bool:
        controller.step()
        return controller.done

    wait_for(done, 600, f"stage {stage} to finish")
    payload = controller.event_payload()
    assert payload["status"] == "success", payload
    write_committed(layout, admitted_results(layout, {int(k): v for k, v in payload["admitted"].items()}))
    return controller


def test_corrupt_partition_reruns_only_its_producer_then_the_consumers(tmp_path, tpch_data):
    files = [(str(p), p.stat().st_size) for p in sorted(tpch_data.glob("*.parquet"))[:2]]
    graph = PipelineGraph("f", {
        "scan": StageSpec("scan", str(APPS / "q1_scan.py"), 2, {"lineitem": SourceSpec(str(tpch_data))},
                          max_parallelism=8),
        "aggregate": StageSpec("aggregate", str(APPS / "q1_final.py"), 2,
                               {"partials": ExchangeSpec("scan", "all_to_all", KEY)}),
    })
    root = tmp_path / "store"
    run_stage(graph, "scan", root, files)
    scan = StageLayout(root, "f", "r1", "scan")
    (victim, *_) = read_json(scan.manifest(1, 0))["files"]
    with open(scan.data(1, 0) / victim["path"], "r+b") as handle:  # flip one byte: checksum mismatch
        handle.seek(victim["size"] // 2)
        byte = handle.read(1)
        handle.seek(victim["size"] // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))

    aggregate = run_stage(graph, "aggregate", root, files)

    # Exactly the producer of the corrupt partition reran, as a new attempt, and was re-committed.
    assert scan.attempt_numbers(0) == [0] and scan.attempt_numbers(1) == [0, 1]
    assert read_json(scan.admitted(1))["attempt"] == 1
    assert read_committed(scan)["subtasks"]["1"]["attempt"] == 1
    assert [r["subtask"] for r in read_committed(scan)["recovered"]] == [1]
    events = [e["event"] for e in read_jsonl(aggregate.layout.journal)]
    assert events.count("recover_partition") == 1 and "input_restored" in events
    # The readers that failed on it reran after the partition was back; the result is exactly Q1.
    failed = [a for a in aggregate.scheduler.all_attempts() if a.lost_partition]
    assert failed and all(a.lost_partition == ("scan", 1) for a in failed)
    out = [aggregate.layout.data(s, a) for s, a in aggregate.scheduler.admitted.items()]
    merged = {}
    for path in out:
        merged.update(read_q1_output(path))
    two_files = tmp_path / "two"
    two_files.mkdir()
    for path, _ in files:
        (two_files / Path(path).name).symlink_to(path)
    assert_q1_equal(merged, duckdb_q1(two_files))
