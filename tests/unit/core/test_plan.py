"""plan_stage: per-subtask inputs for sources, all_to_all and pointwise exchanges (by range), and the fingerprint."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.plan import PLAN_VERSION, StagePlan, load_plan, plan_stage
from airflow_provider_speculative.exceptions import PlanError
from tests.factories import planned

MAX_P = 4  # producer max_parallelism: 4 subpartitions
SCHEMA = {"type": "struct", "fields": [{"name": "user", "type": "long", "nullable": True, "metadata": {}}]}


def build_graph() -> PipelineGraph:
    stages = [
        StageSpec("clean", "apps/clean.py", 2, {"raw": SourceSpec("/data/raw")}, max_parallelism=MAX_P),
        StageSpec("agg", "apps/agg.py", 2,
                  {"events": ExchangeSpec("clean", "all_to_all", key=("user",))}, max_parallelism=MAX_P),
        StageSpec("enrich", "apps/enrich.py", 2, {"events": ExchangeSpec("clean", "all_to_all", key=("user",)),
                                                   "totals": ExchangeSpec("agg", "broadcast")},
                  max_parallelism=MAX_P),
        StageSpec("post", "apps/post.py", 2, {"totals": ExchangeSpec("agg", "pointwise")}, max_parallelism=MAX_P),
    ]
    graph = PipelineGraph(name="p", stages={s.name: s for s in stages})
    graph.validate()
    return graph


def committed(stage: str, parallelism: int) -> dict[str, Any]:
    """A committed.json record: producer i wrote one file per subpartition, size 100*i + sp + 1."""
    return {"stage": stage, "parallelism": parallelism, "subtasks": {
        str(i): {"attempt": i + 1, "data": f"/store/{stage}/subtask={i}/attempt={i + 1}/data",
                 "schema": SCHEMA,
                 "files": [{"path": f"_sp={sp}/part-{i}.parquet", "size": 100 * i + sp + 1, "subpartition": sp}
                           for sp in range(MAX_P)]}
        for i in range(parallelism)}}


RAW = [("/data/raw/a.parquet", 300), ("/data/raw/b.parquet", 200), ("/data/raw/c.parquet", 100)]


def plan(stage: str, *, raw: list[tuple[str, int]] = RAW, run_id: str = "manual__1",
         upstream: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One stage of this file's graph, its producers committed as :func:`committed` writes them."""
    if upstream is None:
        upstream = {"clean": committed("clean", 2), "agg": committed("agg", 2)}
    return planned(build_graph(), stage, sources={"raw": raw}, upstream=upstream, run_id=run_id,
                   logical_date="2026-01-01", application=f"apps/{stage}.py")


def test_source_files_are_split_per_subtask_with_input_bytes() -> None:
    result = plan("clean")
    subtasks = result["subtasks"]
    assert len(subtasks) == 2
    files = [[f["path"] for f in s["inputs"]["raw"]["files"]] for s in subtasks]
    assert files == [["/data/raw/a.parquet"], ["/data/raw/b.parquet", "/data/raw/c.parquet"]]
    assert [s["input_bytes"] for s in subtasks] == [300, 300]
    assert result["inputs"]["raw"] == {"kind": "source", "format": "parquet", "path": "/data/raw",
                                       "schema_file": "/data/raw/a.parquet"}
    assert result["output"]["key"] == ["user"]
    assert result["consumers"] == ["agg", "enrich"]


def test_source_without_files_fails_naming_the_input() -> None:
    with pytest.raises(PlanError, match="pipeline 'p', stage 'clean', input 'raw'"):
        plan("clean", raw=[])


def test_all_to_all_consumer_reads_exactly_its_subpartition_range() -> None:
    result = plan("agg")
    subtasks = result["subtasks"]
    assert [s["inputs"]["events"] for s in subtasks] == [{"producers": [0, 2], "subpartitions": [0, 2]},
                                                         {"producers": [0, 2], "subpartitions": [2, 4]}]
    # input bytes: the range's files of every producer (size 100 * producer + subpartition + 1).
    assert [s["input_bytes"] for s in subtasks] == [(1 + 2) + (101 + 102), (3 + 4) + (103 + 104)]
    shared = result["inputs"]["events"]
    assert shared["upstream"] == "clean" and shared["distribution"] == "all_to_all"
    assert shared["schema"] == SCHEMA and shared["producer_parallelism"] == 2
    # No file is listed in the plan: attempts resolve them from the producers' commits.
    assert "_sp=" not in json.dumps(result)


def test_all_to_all_bytes_come_from_a_compact_commit_too() -> None:
    compact = committed("clean", 2)
    for part in compact["subtasks"].values():
        part["subpartition_bytes"] = {str(f["subpartition"]): f["size"] for f in part.pop("files")}
    assert [s["input_bytes"] for s in plan("agg", upstream={"clean": compact})["subtasks"]] == \
        [s["input_bytes"] for s in plan("agg")["subtasks"]]


def test_pointwise_subtask_reads_only_its_producer() -> None:
    result = plan("post")
    subtasks = result["subtasks"]
    assert result["inputs"]["totals"]["distribution"] == "pointwise"
    for i in range(2):
        assert subtasks[i]["inputs"]["totals"] == {"producers": [i, i + 1], "subpartitions": None}
    assert [s["input_bytes"] for s in subtasks] == [sum(100 * i + sp + 1 for sp in range(MAX_P)) for i in range(2)]


def test_broadcast_exchange_gives_every_subtask_every_producer_whole() -> None:
    result = plan("enrich")
    subtasks = result["subtasks"]
    assert result["inputs"]["totals"]["distribution"] == "broadcast"
    assert [s["inputs"]["totals"] for s in subtasks] == [{"producers": [0, 2], "subpartitions": None}] * 2
    # input_bytes adds both inputs: the all_to_all range of 'clean' and all of agg.
    agg_bytes = sum(100 * i + sp + 1 for sp in range(MAX_P) for i in range(2))
    clean_bytes = [(1 + 2) + (101 + 102), (3 + 4) + (103 + 104)]
    assert [s["input_bytes"] for s in subtasks] == [agg_bytes + c for c in clean_bytes]


def test_broadcast_above_the_size_limit_is_refused_naming_the_input() -> None:
    graph = build_graph()
    config = SpeculativeConfig().with_overrides({"broadcast_max_bytes": 100}, "t")
    with pytest.raises(PlanError, match=r"pipeline 'p', stage 'enrich', input 'totals': broadcast input is 420 "
                                        r"bytes, above broadcast_max_bytes \(100\)"):
        plan_stage(graph, "enrich", config, source_files={}, sink=None, speculation_blocker=None,
                   upstream_committed={"clean": committed("clean", 2), "agg": committed("agg", 2)},
                   context={"dag_id": "d", "run_id": "r", "store_root": "/store", "targets": {}})


def test_broadcast_source_lists_its_files_once_for_every_subtask() -> None:
    graph = PipelineGraph("p", {"j": StageSpec("j", "/a.py", 3, {
        "facts": ExchangeSpec("clean", "all_to_all", key=("user",)),
        "dim": SourceSpec("/data/dim", broadcast=True)}, max_parallelism=MAX_P),
        "clean": StageSpec("clean", "/c.py", 2, {"raw": SourceSpec("/data/raw")}, max_parallelism=MAX_P)})
    graph.validate()
    result = plan_stage(graph, "j", SpeculativeConfig(), source_files={"dim": RAW}, sink=None,
                        speculation_blocker=None, upstream_committed={"clean": committed("clean", 2)},
                        context={"dag_id": "d", "run_id": "r", "store_root": "/store", "targets": {}})
    assert [f["path"] for f in result["inputs"]["dim"]["files"]] == [p for p, _ in RAW]
    assert all(s["inputs"]["dim"] == {"broadcast": True} for s in result["subtasks"])
    assert json.dumps(result).count("/data/raw/b.parquet") == 1


def test_incomplete_upstream_commit_is_rejected() -> None:
    partial = committed("clean", 2)
    del partial["subtasks"]["1"]
    with pytest.raises(PlanError, match="input 'events': upstream 'clean' committed 1 of 2 subtasks"):
        plan("agg", upstream={"clean": partial})


def test_fingerprint_is_stable_for_equal_inputs() -> None:
    assert plan("clean")["fingerprint"] == plan("clean")["fingerprint"]
    assert plan("agg")["fingerprint"] == plan("agg")["fingerprint"]


def test_fingerprint_ignores_the_run_id() -> None:
    # The run id does not change the output, so a rerun's equal plan may reuse results.
    assert plan("clean", run_id="manual__1")["fingerprint"] == plan("clean", run_id="manual__2")["fingerprint"]


def test_fingerprint_changes_when_source_inputs_change() -> None:
    base = plan("clean")["fingerprint"]
    grown = [*RAW[:2], ("/data/raw/c.parquet", 101)]
    extra = [*RAW, ("/data/raw/d.parquet", 5)]
    assert plan("clean", raw=grown)["fingerprint"] != base
    assert plan("clean", raw=extra)["fingerprint"] != base


def test_fingerprint_ignores_which_attempt_produced_an_upstream_partition() -> None:
    # A partition re-produced by failover keeps the consumers' plan equal, so their results are reused.
    base = plan("agg")["fingerprint"]
    other = committed("clean", 2)
    other["subtasks"]["0"]["attempt"] = 7
    other["subtasks"]["0"]["data"] = "/store/clean/subtask=0/attempt=7/data"
    assert plan("agg", upstream={"clean": other})["fingerprint"] == base


def test_fingerprint_changes_when_the_producer_was_replanned() -> None:
    # A reprocessed date whose sources changed re-plans the producer: its consumers must not reuse results.
    base = plan("agg")["fingerprint"]
    other = committed("clean", 2)
    other["fingerprint"] = "replanned-producer"
    assert plan("agg", upstream={"clean": other})["fingerprint"] != base


def test_a_plan_reads_back_through_load_plan_with_every_declared_key() -> None:
    planned = plan("agg")
    loaded = load_plan(json.loads(json.dumps(planned)), "plan.json")
    assert loaded == planned
    required = StagePlan.__required_keys__
    assert required <= set(planned), sorted(required - set(planned))
    assert set(planned) <= required | StagePlan.__optional_keys__, sorted(set(planned) - set(StagePlan.__annotations__))


@pytest.mark.parametrize(("raw", "message"), [
    ([], r"where: not a stage plan \(expected a JSON object, got list\)"),
    ({"stage": "agg"}, r"where: plan version None, .*older provider: clear the stage's task"),
    ({"version": 1, "stage": "agg"}, r"where: plan version 1, this provider reads version 2; .*older provider"),
    ({"version": PLAN_VERSION + 1}, r"plan version 3, .*newer provider: upgrade this one"),
    ({"version": PLAN_VERSION, "stage": "agg"}, r"where: plan version 2 without config, dag_id, fingerprint, "
                                                r"parallelism, run_id, store_root, subtasks, targets"),
])
def test_load_plan_refuses_another_version_or_a_damaged_plan_naming_it(raw: Any, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        load_plan(raw, "where")
