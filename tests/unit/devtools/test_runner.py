"""The development runner plans through the operator's StagePlanner: same checks, same plan, its own targets."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG

from airflow_provider_speculative import Pipeline, all_to_all, parquet_source
from airflow_provider_speculative.control.planning import RunInfo, StagePlanner
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.devtools.runner import plan_connect_stage, plan_local_stage, write_plan
from airflow_provider_speculative.exceptions import PlanError, StageFailedError, StoreError
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.task_state import record_task_state

CONFIG = SpeculativeConfig().with_overrides({"targets": [{"name": "a", "slots": 1}, {"name": "b", "slots": 1}]},
                                            "test")


def _graph(tmp_path: Path, application: str = "app.py", mode: str = "blocking") -> PipelineGraph:
    (tmp_path / "app.py").write_text("print('app')\n")
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for i in range(2):
        pq.write_table(pa.table({"k": [i]}), src / f"part-{i}.parquet")
    with DAG("d", schedule=None), Pipeline("p") as pipeline:
        scan = pipeline.stage("scan", application=str(tmp_path / application), parallelism=2,
                              inputs={"src": parquet_source(str(src))})
        pipeline.stage("agg", application=str(tmp_path / "app.py"), parallelism=1,
                       inputs={"partials": all_to_all(scan, key=["k"], mode=mode)})
    return pipeline.graph()


def test_local_plan_is_the_planners_plan_with_local_spark_submit_targets(tmp_path: Path) -> None:
    graph = _graph(tmp_path)
    plan = plan_local_stage(graph, "scan", tmp_path / "store", "d", "r", CONFIG, master="local[2]")
    assert plan["parallelism"] == 2 and sorted(plan["targets"]) == ["a", "b"]
    command = plan["targets"]["a"]["command"]
    assert command[command.index("--master") + 1] == "local[2]"
    assert command[-1] == str((tmp_path / "app.py").resolve())
    same = StagePlanner(graph, "scan", sink=None, declared_sink=None, config=CONFIG, root=tmp_path / "store",
                        targets=lambda *_: plan["targets"],
                        run=RunInfo(dag_id="d", run_id="r", try_number=1, clear_number=0)).decide({})
    assert same == plan


def test_local_plan_refuses_what_the_operator_refuses(tmp_path: Path) -> None:
    graph = _graph(tmp_path, application="missing.py")
    with pytest.raises(PlanError, match=r"pipeline 'p', stage 'scan': application .*missing.py.* does not exist"):
        plan_local_stage(graph, "scan", tmp_path / "store", "d", "r", CONFIG)
    (tmp_path / "src" / "part-9.parquet").write_text("not parquet")
    with pytest.raises(PlanError, match=r"pipeline 'p', stage 'scan', input 'src'"):
        plan_local_stage(_graph(tmp_path), "scan", tmp_path / "store", "d", "r", CONFIG)


def test_connect_consumer_of_a_hybrid_producer_without_a_plan_says_so(tmp_path: Path) -> None:
    graph = _graph(tmp_path, mode="hybrid")
    with pytest.raises(StoreError, match=r"stage 'agg': hybrid producer scan has no usable plan"):
        plan_connect_stage(graph, "agg", tmp_path / "store", "d", "r", CONFIG)
    write_plan(plan_connect_stage(graph, "scan", tmp_path / "store", "d", "r", CONFIG))
    plan = plan_connect_stage(graph, "agg", tmp_path / "store", "d", "r", CONFIG)
    assert plan["inputs"]["partials"]["mode"] == "hybrid" and plan["targets"]["a"]["kind"] == "spark_connect"


def test_connect_consumer_of_a_failed_hybrid_producer_fails_naming_it(tmp_path: Path) -> None:
    graph = _graph(tmp_path, mode="hybrid")
    write_plan(plan_connect_stage(graph, "scan", tmp_path / "store", "d", "r", CONFIG))
    record_task_state(StageLayout(tmp_path / "store", "d", "r", "scan"), "failed", reason="boom")
    with pytest.raises(StageFailedError, match=r"stage 'agg', input 'partials': hybrid producer stage 'scan' failed"):
        plan_connect_stage(graph, "agg", tmp_path / "store", "d", "r", CONFIG)
