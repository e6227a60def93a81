"""FLIP-1 with real Spark: a corrupted upstream partition reruns exactly its producer, then its readers.

The attempts are clients of the session's shared Connect pool: the rerun path under test (the runtime's checks of
an exchange file, the failure it reports, the controller's recovery) is the same on every kind of target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.devtools.runner import plan_connect_stage, run_stages, write_plan
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import read_committed
from tests.integration.connect_runner import ConnectPool
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

APPS = Path(__file__).resolve().parents[2] / "dags" / "apps"
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
KEY = ("l_returnflag", "l_linestatus")


def _flipped_at(path: Path, where: str) -> int:
    """A byte of a packed exchange file: in its tail (checked by SHA-256) or in a page (checked by its CRC)."""
    import pyarrow.parquet as pq

    from airflow_provider_speculative.store.manifest import parquet_data_end

    metadata = pq.ParquetFile(path).metadata
    if where == "tail":
        return (parquet_data_end(metadata) + path.stat().st_size) // 2
    # The last byte of a value column's chunk: its last page's data, which only the page's CRC covers.
    chunk = max((metadata.row_group(0).column(c) for c in range(metadata.num_columns)
                 if not metadata.row_group(0).column(c).has_dictionary_page),
                key=lambda c: c.total_compressed_size)
    return chunk.data_page_offset + chunk.total_compressed_size - 1


@pytest.mark.parametrize("where", ["tail", "page"])
def test_corrupt_partition_reruns_only_its_producer_then_the_consumers(tmp_path, tpch_data, where,
                                                                       shared_connect_pool: ConnectPool):
    two_files = tmp_path / "two"
    two_files.mkdir()
    for path in sorted(tpch_data.glob("*.parquet"))[:2]:
        (two_files / path.name).symlink_to(path)
    graph = PipelineGraph("f", {
        "scan": StageSpec("scan", str(APPS / "q1_scan.py"), 2, {"lineitem": SourceSpec(str(two_files))},
                          max_parallelism=8, spark_conf=SHUFFLE),
        "aggregate": StageSpec("aggregate", str(APPS / "q1_final.py"), 2,
                               {"partials": ExchangeSpec("scan", "all_to_all", KEY)}, spark_conf=SHUFFLE),
    })
    root = tmp_path / "store"
    pool = shared_connect_pool

    def run(stage: str):
        plan = plan_connect_stage(graph, stage, root, "f", "r1", pool.config())
        write_plan(plan)
        return run_stages([plan], target_env=pool.target_env(), timeout=600)[stage]

    run("scan")
    scan = StageLayout(root, "f", "r1", "scan")
    (victim, *_) = read_json(scan.manifest(1, 0))["files"]
    assert victim["tail"]  # packed (the default layout): each consumer reads part of it
    at = _flipped_at(scan.data(1, 0) / victim["path"], where)
    with open(scan.data(1, 0) / victim["path"], "r+b") as handle:  # flip one byte
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0xFF]))

    aggregate = run("aggregate")

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
    # Found before Spark opened the file (its tail) or by Spark's read of the page (its CRC), blamed on it.
    errors = [read_json(aggregate.layout.failure(a.subtask, a.number))["error"] for a in failed]
    found = "Parquet footer and indexes" if where == "tail" else "cannot read exchange file"
    assert all(found in e and victim["path"] in e for e in errors), errors
    out = [aggregate.layout.data(s, a) for s, a in aggregate.scheduler.admitted.items()]
    merged = {}
    for path in out:
        merged.update(read_q1_output(path))
    assert_q1_equal(merged, duckdb_q1(two_files))
