"""Packed exchange files: their subpartition index, the files a consumer reads, and the bytes planning sees."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.failover import files_in_range
from airflow_provider_speculative.core.plan import (
    exchange_layout,
    file_subpartitions,
    is_packed,
    packed_index,
    subpartition_bytes,
)
from airflow_provider_speculative.exceptions import ConfigError
from airflow_provider_speculative.store.results import compact
from tests.unit.core.test_plan import MAX_P, SCHEMA, plan

PARTITIONED = {"path": "_sp=2/part-0.parquet", "size": 70, "subpartition": 2}
# One task's file sorted by subpartition: rows in 0, 1 and 3, none in 2.
PACKED = {"path": "part-0.parquet", "size": 400, "subpartitions": {"0": 100, "1": 200, "3": 100}}


def test_packed_index_apportions_the_size_by_rows_and_adds_up() -> None:
    index = packed_index(1001, {0: 1, 1: 2, 3: 1, 5: 0})
    assert index == {"0": 250, "1": 501, "3": 250}
    assert sum(index.values()) == 1001
    assert packed_index(10, {}) == {} and packed_index(10, {4: 0}) == {}


def test_file_subpartitions_reads_either_layout() -> None:
    assert file_subpartitions(PARTITIONED) == {2: 70}
    assert file_subpartitions(PACKED) == {0: 100, 1: 200, 3: 100}
    assert file_subpartitions({"path": "part-0.parquet", "size": 5}) == {}
    assert is_packed(PACKED) and not is_packed(PARTITIONED)
    # An empty packed file is packed, with no rows in any subpartition.
    assert is_packed({"path": "p", "size": 0, "subpartitions": {}})


@pytest.mark.parametrize(("span", "expected"), [
    ([0, 1], ["_p"]), ([2, 3], ["_sp=2/part-0.parquet"]), ([2, 4], ["_sp=2/part-0.parquet", "_p"]),
    ([4, 8], []), (None, ["_sp=2/part-0.parquet", "_p"]),
])
def test_a_packed_file_is_read_by_every_range_it_has_rows_in(span: list[int] | None, expected: list[str]) -> None:
    files = [PARTITIONED, {**PACKED, "path": "_p"}]
    assert [f["path"] for f in files_in_range(files, span)] == expected


def test_planning_and_the_compact_commit_see_a_packed_files_bytes_per_subpartition() -> None:
    part = {"attempt": 1, "files": [PACKED, {**PACKED, "path": "part-1.parquet"}], "bytes": 800}
    assert subpartition_bytes(part) == {0: 200, 1: 400, 3: 200}
    record = compact(part)
    assert record["subpartition_bytes"] == {"0": 200, "1": 400, "3": 200}
    assert record["file_count"] == 2 and "files" not in record
    assert subpartition_bytes(record) == subpartition_bytes(part)


def packed_committed(stage: str, parallelism: int) -> dict[str, Any]:
    """The committed record of ``test_plan.committed`` written packed: one file per producer, same bytes."""
    return {"stage": stage, "parallelism": parallelism, "subtasks": {
        str(i): {"attempt": i + 1, "data": f"/store/{stage}/subtask={i}/attempt={i + 1}/data", "schema": SCHEMA,
                 "files": [{"path": "part-0.parquet", "size": sum(100 * i + sp + 1 for sp in range(MAX_P)),
                            "subpartitions": {str(sp): 100 * i + sp + 1 for sp in range(MAX_P)}}]}
        for i in range(parallelism)}}


def test_consumer_ranges_and_input_bytes_are_the_same_for_either_layout() -> None:
    upstream = {"clean": packed_committed("clean", 2), "agg": packed_committed("agg", 2)}
    packed, partitioned = plan("agg", upstream=upstream), plan("agg")
    assert [s["inputs"] for s in packed["subtasks"]] == [s["inputs"] for s in partitioned["subtasks"]]
    assert [s["input_bytes"] for s in packed["subtasks"]] == [s["input_bytes"] for s in partitioned["subtasks"]]


@pytest.mark.parametrize(("setting", "expected"), [
    ("auto", "packed"), ("packed", "packed"), ("partitioned", "partitioned"),
])
def test_auto_layout_is_packed_on_every_store(setting: str, expected: str) -> None:
    config = SpeculativeConfig().with_overrides({"exchange_layout": setting}, "test")
    assert exchange_layout(config) == expected


def test_a_keyed_stage_plans_its_layout_and_an_unkeyed_one_none() -> None:
    assert plan("clean")["output"]["layout"] == "packed"
    assert "layout" not in plan("post")["output"]


def test_an_unknown_layout_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="exchange_layout"):
        SpeculativeConfig().with_overrides({"exchange_layout": "striped"}, "test")
