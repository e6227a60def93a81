"""Pipeline(task_group=True): stages in an Airflow TaskGroup, keyed in the store by task id."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, TaskGroup
from airflow.sdk.definitions.taskgroup import TaskGroup as SdkTaskGroup
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_speculative import Pipeline, all_to_all, parquet_source
from airflow_provider_speculative.control.attemptlog import attempt_log
from airflow_provider_speculative.control.readmodel import run_plans, run_report
from airflow_provider_speculative.control.rerun import plan_rerun, request_rerun, stage_task_ids
from airflow_provider_speculative.control.stage_output import StageOutputLocator
from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.core.lineage import LineageDataset, stage_lineage
from airflow_provider_speculative.exceptions import NotFoundError, PipelineError
from airflow_provider_speculative.links import StageViewLink
from airflow_provider_speculative.plugin.model import resolve_stage
from airflow_provider_speculative.store.files import atomic_write_json, read_json
from airflow_provider_speculative.store.layout import StageLayout, stage_key
from airflow_provider_speculative.store.results import write_committed
from tests.factories import stage_plan

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _stages(p: Pipeline, source: str = "/data/src", app: str = "/apps/app.py") -> None:
    scan = p.stage("scan", application=app, parallelism=2, inputs={"rows": parquet_source(source)})
    p.stage("agg", application=app, parallelism=1, inputs={"parts": all_to_all(scan, key="k")})


def _dag(*pipelines: tuple[str, bool], env: Path | None = None) -> Any:
    """A DAG "d" of these pipelines (name, task_group), each a scan read by an aggregate; on ``env``'s files."""
    files = {"source": str(env / "src"), "app": str(env / "app.py")} if env is not None else {}
    with DAG("d", schedule=None, start_date=START) as dag:
        for name, grouped in pipelines:
            with Pipeline(name, task_group=grouped) as p:
                _stages(p, **files)
    return dag


def test_without_the_option_task_ids_are_stage_names_and_there_is_no_group() -> None:
    dag = _dag(("p1", False))
    assert sorted(dag.task_dict) == ["agg", "scan"]
    assert not any(isinstance(c, SdkTaskGroup) for c in dag.task_group.children.values())
    assert dag.task_dict["scan"].graph.store_prefix == ""
    assert "store_prefix" not in dag.task_dict["scan"].graph.to_json()


def test_with_the_option_stages_are_in_a_group_named_like_the_pipeline() -> None:
    dag = _dag(("p1", True))
    assert sorted(dag.task_dict) == ["p1.agg", "p1.scan"]
    group = dag.task_group.children["p1"]
    assert isinstance(group, SdkTaskGroup) and sorted(group.children) == ["p1.agg", "p1.scan"]
    for task_id, stage in (("p1.scan", "scan"), ("p1.agg", "agg")):
        op = dag.task_dict[task_id]
        assert op.stage == stage and op.task_group is group
        assert op.graph.store_key(stage) == task_id and set(op.graph.stages) == {"scan", "agg"}
    assert dag.task_dict["p1.agg"].upstream_task_ids == {"p1.scan"}
    # The start trigger rebuilds the graph from JSON: the prefix travels with it.
    kwargs = dag.task_dict["p1.scan"].start_trigger_args.trigger_kwargs
    assert PipelineGraph.from_json(kwargs["graph"]).store_prefix == "p1." and kwargs["stage"] == "scan"


def test_the_stage_handle_knows_its_task_id() -> None:
    with DAG("d", schedule=None, start_date=START), Pipeline("p1", task_group=True) as p:
        scan = p.stage("scan", application="/apps/scan.py", parallelism=1, inputs={"rows": parquet_source("/d")})
        with pytest.raises(PipelineError, match="not compiled yet"):
            _ = scan.task_id
    assert scan.name == "scan" and scan.task_id == "p1.scan" and p.group.group_id == "p1"


def test_two_pipelines_with_the_same_stage_names_parse_with_distinct_store_keys() -> None:
    dag = _dag(("p1", True), ("p2", True), ("plain", False))
    assert sorted(dag.task_dict) == ["agg", "p1.agg", "p1.scan", "p2.agg", "p2.scan", "scan"]
    keys = {dag.task_dict[t].graph.store_key(dag.task_dict[t].stage) for t in dag.task_dict}
    assert keys == set(dag.task_dict)  # the store key is the task id, so unique in the DAG
    assert dag.task_dict["p2.agg"].upstream_task_ids == {"p2.scan"}


def test_dependencies_across_the_group_boundary() -> None:
    with DAG("d", schedule=None, start_date=START) as dag:
        start, end = EmptyOperator(task_id="start"), EmptyOperator(task_id="end")
        with Pipeline("p1", task_group=True) as p:
            _stages(p)
        start >> p.group >> end
    assert start.downstream_task_ids == {"p1.scan"}  # the group's roots
    assert end.upstream_task_ids == {"p1.agg"}  # its leaves
    assert dag.task_dict["p1.scan"].upstream_task_ids == {"start"}


def test_a_pipeline_inside_a_hand_made_group_gets_the_full_prefix() -> None:
    with DAG("d", schedule=None, start_date=START) as dag, TaskGroup("outer"), \
            Pipeline("p1", task_group=True) as p:
        _stages(p)
    assert sorted(dag.task_dict) == ["outer.p1.agg", "outer.p1.scan"]
    assert dag.task_dict["outer.p1.scan"].graph.store_prefix == "outer.p1."


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"task_group": "yes"}, "task_group must be True or False"),
    ({"task_group": True, "name": "p 1"}, "letters, digits"),
    ({"task_group": True, "name": "p.1"}, "letters, digits"),
])
def test_bad_options_are_refused_when_declared(kwargs: dict[str, Any], words: str) -> None:
    name = kwargs.pop("name", "p1")
    with pytest.raises(PipelineError, match=words):
        Pipeline(name, **kwargs)


def test_a_group_needs_a_dag_and_a_free_name() -> None:
    with pytest.raises(PipelineError, match="task_group=True needs a DAG"), Pipeline("p1", task_group=True) as p:
        _stages(p)
    with pytest.raises(PipelineError, match="cannot be the task group 'p1'"):
        _dag(("p1", True), ("p1", True))


def test_an_input_naming_a_task_id_is_refused_naming_pipeline_stage_and_input() -> None:
    with DAG("d", schedule=None, start_date=START), pytest.raises(PipelineError) as error, \
            Pipeline("p1", task_group=True) as p:
        p.stage("scan", application="/apps/scan.py", parallelism=2, inputs={"rows": parquet_source("/d")})
        p.stage("agg", application="/apps/agg.py", parallelism=1, inputs={"parts": all_to_all("p1.scan", key="k")})
    message = str(error.value)
    assert "pipeline 'p1', stage 'agg': input 'parts' names stage 'p1.scan', a task id" in message
    assert "('scan')" in message


def test_a_stage_of_another_pipeline_is_still_refused() -> None:
    with DAG("d", schedule=None, start_date=START), pytest.raises(PipelineError, match="of another pipeline"):
        with Pipeline("p1", task_group=True) as p1:
            scan = p1.stage("scan", application="/apps/scan.py", parallelism=1, inputs={"rows": parquet_source("/d")})
        with Pipeline("p2", task_group=True) as p2:
            p2.stage("agg", application="/apps/agg.py", parallelism=1, inputs={"parts": all_to_all(scan, key="k")})


# -- planning: the store directory is the task id, the plan keeps the stage name ----------------------------

def _context(task_id: str) -> dict[str, Any]:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": "r1", "ti": SimpleNamespace(try_number=1, task_id=task_id),
            "logical_date": START, "dag_run": SimpleNamespace(conf={})}


def test_two_grouped_scans_plan_into_their_own_directories(env: Path) -> None:
    dag = _dag(("p1", True), ("p2", True), env=env)
    store = env / "store"
    plans = {}
    for task_id in ("p1.scan", "p2.scan"):
        op = dag.task_dict[task_id]
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(_context(task_id))
        assert Path(deferred.value.trigger.plan_path) == StageLayout(store, "d", "r1", task_id).plan
        plans[task_id] = read_json(StageLayout(store, "d", "r1", task_id).plan)
    assert not StageLayout(store, "d", "r1", "scan").dir.exists()
    for task_id, plan in plans.items():
        assert plan["stage"] == "scan" and plan["task_id"] == task_id
        assert plan["pipeline"] == task_id.split(".")[0] and plan["store_prefix"] == task_id.split(".")[0] + "."
        assert stage_key(plan) == task_id and stage_key(plan, "agg") == task_id.split(".")[0] + ".agg"
        assert StageLayout.of_plan(plan).dir == StageLayout(store, "d", "r1", task_id).dir


def test_a_consumer_plans_on_its_own_pipelines_producer(env: Path) -> None:
    dag = _dag(("p1", True), ("p2", True), env=env)
    store = env / "store"
    # Only p2's scan committed: p1's aggregate must wait for p1's scan, not take p2's.
    _commit(StageLayout(store, "d", "r1", "p2.scan"), subtasks=2)
    planner = dag.task_dict["p1.agg"]._planner(_context("p1.agg"))
    assert planner.layout.dir == StageLayout(store, "d", "r1", "p1.agg").dir
    assert planner.layout_of("scan").dir == StageLayout(store, "d", "r1", "p1.scan").dir
    assert planner.uncommitted_producers() == ["scan"]
    assert dag.task_dict["p2.agg"]._planner(_context("p2.agg")).uncommitted_producers() == []


def _commit(layout: StageLayout, subtasks: int) -> None:
    write_committed(layout, {"stage": layout.stage, "parallelism": subtasks, "committed_at": 1.0, "subtasks": {
        str(s): {"attempt": 0, "data": "/d", "files": [{"path": "p", "size": 5, "subpartition": s}], "records": 1,
                 "bytes_per_subpartition": {str(s): 5}} for s in range(subtasks)}})


# -- readers: the run's stages by store key ------------------------------------------------------------------

def _grouped_run(root: Path) -> None:
    """Two grouped pipelines (p1, p2) and a plain one, each a scan read by an aggregate, as their plans record."""
    for prefix in ("p1.", "p2.", ""):
        extra = {"store_prefix": prefix} if prefix else {}
        pipeline = prefix.rstrip(".") or "plain"
        for stage, parallelism, inputs, upstreams, consumers in (
                ("scan", 2, {"rows": {"kind": "source", "path": f"/data/{pipeline}", "format": "parquet"}}, [],
                 ["agg"]),
                ("agg", 1, {"parts": {"kind": "exchange", "upstream": "scan", "distribution": "all_to_all",
                                      "mode": "blocking"}}, ["scan"], [])):
            plan = stage_plan(root, dag_id="d", run_id="r1", stage=stage, parallelism=parallelism, inputs=inputs,
                              upstreams=upstreams, consumers=consumers, max_parallelism=4, pipeline=pipeline,
                              task_id=prefix + stage, **extra)
            layout = StageLayout.of_plan(plan)
            atomic_write_json(layout.plan, plan)
            for subtask in range(parallelism):
                atomic_write_json(layout.admitted(subtask), {"attempt": 0, "at": 1.0})
            _commit(layout, parallelism)


def test_the_read_model_names_stages_by_store_key(tmp_path: Path) -> None:
    _grouped_run(tmp_path)
    assert sorted(run_plans(tmp_path, "d", "r1")) == ["agg", "p1.agg", "p1.scan", "p2.agg", "p2.scan", "scan"]
    report = run_report(tmp_path, "d", "r1")
    by_key = {s["stage"]: s for s in report["stages"]}
    assert by_key["p1.agg"]["upstreams"] == ["p1.scan"] and by_key["p1.scan"]["consumers"] == ["p1.agg"]
    assert by_key["p1.agg"]["name"] == "agg" and by_key["p1.agg"]["pipeline"] == "p1"
    assert by_key["agg"]["upstreams"] == ["scan"]
    assert [s["stage"] for s in run_report(tmp_path, "d", "r1", "p2.scan")["stages"]] == ["p2.scan"]
    # A bare name is the plain pipeline's stage when it has one ...
    assert [s["stage"] for s in run_report(tmp_path, "d", "r1", "scan")["stages"]] == ["scan"]


def test_a_bare_stage_name_resolves_when_one_pipeline_has_it_and_is_refused_when_several_do(tmp_path: Path) -> None:
    _grouped_run(tmp_path)
    StageLayout(tmp_path, "d", "r1", "scan").plan.unlink()
    with pytest.raises(NotFoundError, match=r"stage 'scan' is ambiguous.*p1\.scan, p2\.scan"):
        run_report(tmp_path, "d", "r1", "scan")
    with pytest.raises(NotFoundError, match="ambiguous"):
        plan_rerun(tmp_path, "d", "r1", "scan", None)
    StageLayout(tmp_path, "d", "r1", "p2.scan").plan.unlink()
    assert [s["stage"] for s in run_report(tmp_path, "d", "r1", "scan")["stages"]] == ["p1.scan"]


def test_a_rerun_stays_in_its_pipeline_and_clears_the_real_task_ids(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _grouped_run(tmp_path)
    region = plan_rerun(tmp_path, "d", "r1", "p1.scan", [1])
    assert {k: sorted(v) for k, v in region.subtasks.items()} == {"p1.scan": [1], "p1.agg": [0]}
    cleared: list[list[str]] = []
    monkeypatch.setattr("airflow_provider_speculative.control.rerun.clear_stage_tasks",
                        lambda dag_id, run_id, stages, **audit: cleared.append(stages)
                        or stage_task_ids(stages, ["scan", "agg", "p1.scan", "p1.agg", "p2.scan", "p2.agg"]))
    done = request_rerun(tmp_path, "d", "r1", "p1.scan", [1], downstream=True, dry_run=False, by="test")
    assert done["stage_tasks"] == {"p1.scan": "p1.scan", "p1.agg": "p1.agg"}
    assert done["invalidated"] == {"p1.scan": [1], "p1.agg": [0]}
    assert not StageLayout(tmp_path, "d", "r1", "p1.scan").committed.exists()
    for untouched in ("p2.scan", "scan"):
        assert StageLayout(tmp_path, "d", "r1", untouched).committed.is_file()
        assert StageLayout(tmp_path, "d", "r1", untouched).admitted(1).is_file()


def test_the_ui_finds_a_grouped_stage_by_task_id_and_never_takes_anothers(tmp_path: Path) -> None:
    _grouped_run(tmp_path)
    assert resolve_stage(tmp_path, "d", "r1", "p1.scan") == "p1.scan"
    # A stage of a pipeline in a hand-made group keeps its name as key: found by its last part, if its plan
    # was written by that task.
    solo = stage_plan(tmp_path, dag_id="d", run_id="r1", stage="solo", task_id="handmade.solo")
    atomic_write_json(StageLayout.of_plan(solo).plan, solo)
    assert resolve_stage(tmp_path, "d", "r1", "handmade.solo") == "solo"
    assert resolve_stage(tmp_path, "d", "r1", "handmade.scan") is None  # "scan" is the task "scan"'s stage
    StageLayout(tmp_path, "d", "r1", "p2.agg").plan.unlink()
    # Not planned yet: not the plain pipeline's "agg".
    assert resolve_stage(tmp_path, "d", "r1", "p2.agg") is None
    link = StageViewLink().get_link(None, ti_key=SimpleNamespace(dag_id="d", run_id="r1", task_id="p1.scan"))
    assert "task_id=p1.scan" in link


def test_the_plugin_serves_a_grouped_stage_with_its_graph(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from airflow_provider_speculative.plugin.app import create_app

    _grouped_run(tmp_path)
    app = create_app(store=tmp_path)
    for dependency in app.state.access.values():
        app.dependency_overrides[dependency] = lambda: None
    client = TestClient(app)
    stage = client.get("/api/stage", params={"dag_id": "d", "run_id": "r1", "task_id": "p1.agg"})
    assert stage.status_code == 200, stage.text
    assert stage.json()["stage"] == "p1.agg" and stage.json()["name"] == "agg"
    run = client.get("/api/run", params={"dag_id": "d", "run_id": "r1"}).json()
    edges = {(e["from"], e["to"]) for e in run["edges"]}
    assert edges == {("p1.scan", "p1.agg"), ("p2.scan", "p2.agg"), ("scan", "agg")}


def test_logs_find_a_grouped_stage_by_task_id_or_unique_name(tmp_path: Path) -> None:
    _grouped_run(tmp_path)
    for key in ("p1.scan", "p2.scan"):
        layout = StageLayout(tmp_path, "d", "r1", key)
        atomic_write_json(layout.claim(0, 0), {"target": "local-a", "created_at": 1.0})
        layout.log(0, 0).write_text(f"log of {key}\n")
    assert attempt_log(tmp_path, "d", "r1", "p2.scan", 0).text == "log of p2.scan\n"
    StageLayout(tmp_path, "d", "r1", "scan").plan.unlink()
    with pytest.raises(NotFoundError, match="ambiguous"):
        attempt_log(tmp_path, "d", "r1", "scan", 0)
    StageLayout(tmp_path, "d", "r1", "p1.scan").plan.unlink()
    assert attempt_log(tmp_path, "d", "r1", "scan", 0).text == "log of p2.scan\n"


def test_lineage_keeps_the_pipelines_exchanges_apart(tmp_path: Path) -> None:
    _grouped_run(tmp_path)
    plans = run_plans(tmp_path, "d", "r1")
    inputs, outputs = stage_lineage(plans, "p1.agg", None)
    assert inputs == [LineageDataset("speculative", "d/p1.scan")]
    assert outputs == [LineageDataset("speculative", "d/p1.agg")]
    sink = LineageDataset("file", "/out")
    assert stage_lineage(plans, "p2.agg", sink) == (
        [LineageDataset("file", "/data/p2"), LineageDataset("speculative", "d/p2.scan")], [sink])


def test_the_sensor_finds_a_grouped_stage_by_task_id_or_unique_name(tmp_path: Path) -> None:
    _grouped_run(tmp_path)
    found = StageOutputLocator(tmp_path, "d", "p2.scan", run_id="r1").check()
    assert found.ready and found.committed_path == str(StageLayout(tmp_path, "d", "r1", "p2.scan").committed)
    # The plain pipeline's stage of that name is what the bare name means while it exists.
    assert StageOutputLocator(tmp_path, "d", "scan", run_id="r1").check().committed_path == str(
        StageLayout(tmp_path, "d", "r1", "scan").committed)
    StageLayout(tmp_path, "d", "r1", "scan").plan.unlink()
    with pytest.raises(NotFoundError, match=r"ambiguous.*p1\.scan, p2\.scan.*task id"):
        StageOutputLocator(tmp_path, "d", "scan", run_id="r1").check()
    StageLayout(tmp_path, "d", "r1", "p1.scan").plan.unlink()
    assert StageOutputLocator(tmp_path, "d", "scan", run_id="r1").check().committed_path == str(
        StageLayout(tmp_path, "d", "r1", "p2.scan").committed)


def test_a_grouped_hybrid_consumer_follows_its_own_pipelines_producer(tmp_path: Path) -> None:
    from airflow_provider_speculative.control.controller import StageController
    from airflow_provider_speculative.store import journal
    from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
    from tests.factories import Clock
    from tests.unit.control.test_controller import FakeBackend
    from tests.unit.control.test_hybrid_inputs import consumer_plan

    root, clock = tmp_path / "store", Clock()
    producers = {}
    for key in ("p1.scan", "p2.scan"):
        layout = producers[key] = StageLayout(root, "d", "r", key)
        atomic_write_json(layout.plan, {"stage": "scan", "parallelism": 3, "fingerprint": "fp"})
        journal.record(layout.journal, "plan_decided", parallelism=3)
    # Every subtask of the other pipeline's scan is admitted, one of this pipeline's.
    for key, subtasks in (("p2.scan", (0, 1, 2)), ("p1.scan", (1,))):
        for subtask in subtasks:
            data = producers[key].data(subtask, 0)
            data.mkdir(parents=True)
            (data / "part-0.parquet").write_bytes(b"rows")
            write_manifest(producers[key].manifest(subtask, 0), build_manifest(data, schema=None))
            atomic_write_json(producers[key].admitted(subtask), {"attempt": 0})
            journal.record(producers[key].journal, "admit", subtask=subtask, attempt=0)
    plan = {**consumer_plan(root), "store_prefix": "p1."}
    layout = StageLayout.of_plan(plan)
    assert layout.stage == "p1.enrich"
    atomic_write_json(layout.plan, plan)
    backend = FakeBackend(layout, clock)
    ctrl = StageController.open(plan, clock=clock, backends={"local-a": backend}, observer=backend)
    ctrl.step()
    assert [(s.subtask, s.attempt) for s in backend.launched] == [(1, 0)]
    assert ctrl.summary()["hybrid_inputs"] == {"scan": {"admitted": 1, "parallelism": 3, "committed": False}}


def test_an_attempt_reads_its_own_pipelines_producer_and_names_a_lost_one_by_stage(tmp_path: Path) -> None:
    from airflow_provider_speculative.runtime.context import StageContext
    from airflow_provider_speculative.store.manifest import PartitionError, build_manifest, write_manifest
    from tests.unit.control.test_hybrid_inputs import consumer_plan

    root = tmp_path / "store"
    for key, manifests in (("p1.scan", (0, 1)), ("p2.scan", (0, 1, 2))):  # p1's subtask 2 lost its output
        layout = StageLayout(root, "d", "r", key)
        for subtask in range(3):
            data = layout.data(subtask, 0)
            data.mkdir(parents=True)
            (data / "part-0.parquet").write_bytes(b"rows")
            if subtask in manifests:
                write_manifest(layout.manifest(subtask, 0), build_manifest(data, schema=None))
        write_committed(layout, {"stage": "scan", "parallelism": 3, "committed_at": 1.0,
                                 "subtasks": {str(s): {"attempt": 0} for s in range(3)}})
    plan = consumer_plan(root)
    plan["inputs"]["rows"]["mode"] = "blocking"
    plan.update(store_prefix="p1.", upstreams=["scan"])
    atomic_write_json(StageLayout.of_plan(plan).plan, plan)
    files = StageContext(plan, 0, 0, "local-a").exchange_files("rows")
    assert files == [str(StageLayout(root, "d", "r", "p1.scan").data(0, 0) / "part-0.parquet")]
    lost = StageContext(plan, 2, 0, "local-a")
    with pytest.raises(PartitionError) as error:
        lost.exchange_files("rows")
    assert error.value.stage == "p1.scan"
    lost._record_failure(error.value)
    failure = read_json(StageLayout(root, "d", "r", "p1.enrich").failure(2, 0))
    assert failure["kind"] == "partition" and failure["stage"] == "scan" and failure["subtask"] == 2
