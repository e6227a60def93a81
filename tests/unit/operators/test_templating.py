"""application, application_args, spark_conf and source paths are templated per DAG run, and checked once rendered."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_speculative import Pipeline, parquet_source
from airflow_provider_speculative.core.graph import RenderedStage, render_stage
from airflow_provider_speculative.exceptions import PipelineError
from airflow_provider_speculative.store.files import read_json
from tests.unit.triggers.test_stage_trigger import _events, _trigger

FIELDS = ("application", "application_args", "spark_conf", "source_paths")


def _daily(env: Path, source: str | None = None, application: str | None = None) -> Any:
    """A daily pipeline: source /…/data/<ds>, the day as an application argument and a Spark conf value."""
    day = env / "data" / "2026-01-01"
    day.parent.mkdir(exist_ok=True)
    if not day.exists():
        shutil.copytree(env / "src", day)
    with DAG("d", schedule=None), Pipeline("p") as pipeline:
        pipeline.stage("scan", application=application or str(env / "app.py"), parallelism=2,
                       inputs={"rows": parquet_source(source or f"{env}/data/{{{{ ds }}}}")},
                       application_args=["--day", "{{ ds }}"], spark_conf={"spark.app.tag": "day-{{ ds_nodash }}"})
    return pipeline.stages["scan"].task


def _render(op: Any, value: Any) -> Any:
    """What Airflow renders a template field to for the 2026-01-01 run (Jinja with the run's context)."""
    return op.render_template(value, {"ds": "2026-01-01", "ds_nodash": "20260101"})


def test_the_fields_are_operator_templates_that_the_triggerer_renders(env: Path) -> None:
    op = _daily(env)
    assert set(FIELDS) <= set(op.template_fields)
    trigger = _trigger(op)
    kwargs = op.start_trigger_args.trigger_kwargs
    # Airflow's rule (BaseTrigger): operator template fields that are trigger kwargs and trigger attributes.
    assert [f for f in op.template_fields if f in kwargs and hasattr(trigger, f)] == ["sink_args", *FIELDS]
    assert kwargs["source_paths"] == {"rows": f"{env}/data/{{{{ ds }}}}"}


def test_a_stage_started_in_the_triggerer_plans_on_the_rendered_values(env: Path) -> None:
    op = _daily(env)
    trigger = _trigger(op)
    for field in FIELDS:
        setattr(trigger, field, _render(op, getattr(trigger, field)))  # as the triggerer does before run()
    planner = trigger._planner()
    planner.start()
    plan = planner.plan({})
    assert plan["application_args"] == ["--day", "2026-01-01"]
    assert {f["path"] for sub in plan["subtasks"] for f in sub["inputs"]["rows"]["files"]} == {
        str(env / "data" / "2026-01-01" / f"part-{i}.parquet") for i in range(2)}
    command = plan["targets"]["local-a"]["command"]
    assert "spark.app.tag=day-20260101" in command and command[-1] == str(env / "app.py")


def test_dag_test_renders_on_the_worker_before_planning(env: Path) -> None:
    op = _daily(env)
    for field in FIELDS:
        setattr(op, field, _render(op, getattr(op, field)))  # BaseOperator.render_template_fields before execute
    context = {"dag": SimpleNamespace(dag_id="d"), "run_id": "r2", "ti": SimpleNamespace(try_number=1),
               "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    plan = read_json(deferred.value.trigger.plan_path)
    assert plan["application_args"] == ["--day", "2026-01-01"]
    assert "2026-01-01" in plan["subtasks"][0]["inputs"]["rows"]["files"][0]["path"]


def test_a_path_that_renders_empty_or_relative_fails_the_plan_naming_the_input(env: Path) -> None:
    op = _daily(env, source="{{ params.root }}/rows")  # starts with an expression: judged once rendered
    trigger = _trigger(op)
    trigger.source_paths = {"rows": "/rows"[1:]}  # rendered relative: 'rows'
    (event,) = asyncio.run(_events(trigger))
    assert event.payload["status"] == "plan_failed"
    assert "pipeline 'p', stage 'scan', input 'rows': source path 'rows' is relative" in event.payload["reason"]
    assert "rendered from '{{ params.root }}/rows'" in event.payload["reason"]


@pytest.mark.parametrize(("change", "message"), [
    ({"source_paths": {"rows": ""}},
     r"input 'rows': source path is '' \(rendered from .*\); a template rendered empty"),
    ({"source_paths": {"rows": "/data/{{ ds }}"}}, r"input 'rows': source path '/data/\{\{ ds \}\}' still holds a "
                                                   r"template after rendering"),
    ({"application": " "}, r"application is ' ' \(rendered from .*app.py'\); a template rendered empty"),
    ({"application_args": "--day 1"}, r"application_args rendered to '--day 1', not a list"),
    ({"application": "/apps/report.sql"}, r"application '/apps/report.sql' is not a .py file .* \(rendered from"),
    ({"source_paths": {"rows": "/proc/self"}}, r"input 'rows': source path '/proc/self' lies in the system "
                                               r"directory /proc, which holds no datasets \(rendered from"),
])
def test_render_stage_refuses_what_parse_time_would_naming_the_template(env: Path, change: dict[str, Any],
                                                                        message: str) -> None:
    op = _daily(env)
    declared = RenderedStage.of(op.graph.stages["scan"])
    rendered = RenderedStage(**{**declared.__dict__, **change})
    with pytest.raises(PipelineError, match=rf"pipeline 'p', stage 'scan'.*{message}"):
        render_stage(op.graph, "scan", rendered)


def test_parse_time_judges_the_fixed_part_of_a_templated_source_path(env: Path) -> None:
    with pytest.raises(PipelineError, match=r"source path 'data/\{\{ ds \}\}' is relative"):
        _daily(env, source="data/{{ ds }}")
    assert _daily(env, source="{{ var.value.root }}/rows") is not None  # judged when rendered


def test_a_templated_application_plans_on_the_worker_once_rendered(env: Path) -> None:
    """The worker path checks the application before it waits for producers: the rendered one, not the template."""
    op = _daily(env, application=f"{env}/{{{{ params.app }}}}.py")
    op.application = str(env / "app.py")  # as Airflow renders it with params.app = "app"
    for field in ("application_args", "spark_conf", "source_paths"):
        setattr(op, field, _render(op, getattr(op, field)))
    context = {"dag": SimpleNamespace(dag_id="d"), "run_id": "r3", "ti": SimpleNamespace(try_number=1),
               "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert read_json(deferred.value.trigger.plan_path)["application"] == str(env / "app.py")
