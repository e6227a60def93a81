"""SpeculativeSparkSubmitOperator: argument mapping, parse-time refusals, and the unmodified-application wrapper.

The wrapper runs against a fake Spark session and JVM gateway in a temporary store (no Spark).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG, TaskGroup
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_speculative import ParquetSink, SpeculativeSparkSubmitOperator, parquet_source
from airflow_provider_speculative.core.config import Target
from airflow_provider_speculative.core.spark_submit import (
    REFUSED_ARGUMENTS,
    connection_targets,
    parse_wrapper_args,
    wrapper_args,
)
from airflow_provider_speculative.exceptions import PipelineError
from airflow_provider_speculative.operators.spark_submit import wrapper_application
from airflow_provider_speculative.runtime import context as context_module
from airflow_provider_speculative.runtime import unmodified
from airflow_provider_speculative.runtime.session import OpenedSession
from airflow_provider_speculative.store.files import atomic_write_json, read_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import FakeTI


def _context() -> dict[str, Any]:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": "r1", "ti": FakeTI(),
            "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}


def _plan(op: Any) -> dict[str, Any]:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context())
    plan = read_json(deferred.value.trigger.plan_path)
    assert plan is not None
    return plan


def _script(env: Path, body: str, name: str = "job.py") -> Path:
    path = env / name
    path.write_text(body)
    return path


# -- argument mapping ---------------------------------------------------------------------------


def test_the_main_arguments_map_onto_one_unspeculated_subtask_of_the_wrapper(env: Path) -> None:
    app = _script(env, "print('hi')\n")
    op = SpeculativeSparkSubmitOperator(
        task_id="job", application=str(app), application_args=["--day", "2026-01-01"],
        conf={"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "512m"}, name="nightly",
        files="/etc/a.txt", py_files=["/lib/a.zip", "/lib/b.py"], jars="/jars/x.jar", packages="g:a:1",
        driver_memory="1g", executor_memory="2g", executor_cores=2, num_executors=3, total_executor_cores=6,
        verbose=True, retries=2)
    assert (op.application, op.application_args, op.name, op.retries) == \
        (str(app), ["--day", "2026-01-01"], "nightly", 2)
    assert {"application", "application_args", "spark_conf", "name"} <= set(op.template_fields)
    # Deferrable from the start: planned, run and committed by the stage's start trigger, whose on_kill and
    # deadline stop the spark-submit (control/kill.py) as for every stage.
    assert op.start_from_trigger and op.start_trigger_args.trigger_cls.endswith(".StageStartTrigger")
    stage = op.graph.stages["job"]
    assert stage.application == wrapper_application() and stage.parallelism == 1 and not stage.inputs
    assert parse_wrapper_args(stage.application_args) == unmodified.UnmodifiedApplication(
        application=str(app), java_class=None, name="nightly", args=("--day", "2026-01-01"),
        task_try="{{ ti.try_number }}")
    assert op.spark_conf == {
        "spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g",  # the argument wins over conf
        "spark.files": "/etc/a.txt", "spark.submit.pyFiles": "/lib/a.zip,/lib/b.py", "spark.jars": "/jars/x.jar",
        "spark.jars.packages": "g:a:1", "spark.executor.memory": "2g", "spark.executor.cores": "2",
        "spark.executor.instances": "3", "spark.cores.max": "6", "spark.logConf": "true"}
    assert stage.config["enabled"] is False

    plan = _plan(op)
    assert plan["parallelism"] == 1 and plan["config"]["enabled"] is False
    assert set(plan["targets"]) == {"local-a", "local-b"}  # the deployment's targets on spark_default
    for target in plan["targets"].values():
        command = target["command"]
        assert command[-1] == wrapper_application()
        assert "spark.executor.instances=3" in command and "spark.jars=/jars/x.jar" in command


def test_a_jar_main_class_is_added_to_the_driver_jars(env: Path) -> None:
    op = SpeculativeSparkSubmitOperator(task_id="jar", application="/apps/etl.jar", java_class="com.acme.Etl",
                                        jars="/jars/dep.jar", application_args=["a", 1])
    assert op.spark_conf["spark.jars"] == "/apps/etl.jar,/jars/dep.jar"
    assert parse_wrapper_args(op.graph.stages["jar"].application_args) == unmodified.UnmodifiedApplication(
        application="/apps/etl.jar", java_class="com.acme.Etl", name=None, args=("a", "1"),
        task_try="{{ ti.try_number }}")


def test_the_rendered_arguments_are_what_the_wrapper_runs(env: Path) -> None:
    app = _script(env, "print('hi')\n")
    op = SpeculativeSparkSubmitOperator(task_id="job", application=str(env / "{{ params.app }}"),
                                        application_args=["--day", "{{ ds }}"], name="n-{{ ds }}",
                                        conf={"spark.app.tag": "t-{{ ds_nodash }}"})
    context = {"ds": "2026-01-01", "ds_nodash": "20260101", "params": {"app": app.name}, "ti": FakeTI(3)}
    op.render_template_fields(context)  # what Airflow does on a worker before execute
    plan = _plan(op)
    assert parse_wrapper_args(plan["application_args"]) == unmodified.UnmodifiedApplication(
        application=str(app), java_class=None, name="n-2026-01-01", args=("--day", "2026-01-01"), task_try="3")
    assert "spark.app.tag=t-20260101" in plan["targets"]["local-a"]["command"]


def test_each_task_try_runs_the_application_again_and_a_replan_of_the_same_try_keeps_it(env: Path) -> None:
    app = _script(env, "print('hi')\n")

    def planned(try_number: int) -> tuple[dict[str, Any], StageLayout]:
        op = SpeculativeSparkSubmitOperator(task_id="job", application=str(app))
        op.render_template_fields({"ti": FakeTI(try_number)})
        plan = _plan(op)
        return plan, StageLayout.of_plan(plan)  # type: ignore[arg-type]

    first, layout = planned(1)
    atomic_write_json(layout.claim(0, 0), {"target": "local-a", "created_at": 1.0})
    layout.attempt_dir(0, 0).mkdir(parents=True, exist_ok=True)
    atomic_write_json(layout.manifest(0, 0), {"version": 1, "files": [], "bytes": 0})
    atomic_write_json(layout.admitted(0), {"attempt": 0, "at": 1.0})

    again, _ = planned(1)  # the same try planned again (a triggerer taking the stage over): the attempt stays
    assert again["fingerprint"] == first["fingerprint"] and read_json(layout.admitted(0)) is not None
    retried, _ = planned(2)  # a retry or a clear: the application runs again, nothing of try 1 is reused
    assert retried["fingerprint"] != first["fingerprint"]
    assert read_json(layout.admitted(0)) is None and not layout.attempt_dir(0, 0).exists()


def test_conn_id_chooses_the_deployment_targets_on_that_connection_or_one_of_its_own() -> None:
    targets = (Target("a", conn_id="spark_default", slots=3), Target("b", conn_id="other"),
               Target("yarn", conn_id="spark_default"))
    assert [t["name"] for t in connection_targets("t", "spark_default", targets)] == ["a", "yarn"]
    assert connection_targets("t", "spark_default", targets)[0]["slots"] == 3
    assert connection_targets("t", "spark_yarn", targets) == [
        {"name": "spark_yarn", "conn_id": "spark_yarn", "slots": 2, "conf": {}}]
    # A target already named like the connection keeps its own name and slots.
    assert connection_targets("t", "yarn", targets)[0]["name"] == "yarn-submit"


def test_in_a_task_group_the_store_directory_is_the_task_id(env: Path) -> None:
    app = _script(env, "print('hi')\n")
    with DAG("d", schedule=None), TaskGroup("grp"):
        op = SpeculativeSparkSubmitOperator(task_id="job", application=str(app))
    assert op.task_id == "grp.job" and op.graph.store_key("job") == "grp.job"
    assert op.start_trigger_args.trigger_kwargs["graph"]["store_prefix"] == "grp."
    plan = _plan(op)
    assert plan["stage"] == "job" and Path(plan["store_root"], "d", "r1", "grp.job", "plan.json").exists()


def test_split_by_file_runs_a_stage_context_application_with_speculation(env: Path) -> None:
    app = _script(env, "from airflow_provider_speculative.runtime import StageContext\n", "split.py")
    op = SpeculativeSparkSubmitOperator(task_id="split", application=str(app), application_args=["x"],
                                        inputs=parquet_source(str(env / "src")), sink=ParquetSink(str(env / "out")),
                                        executor_memory="1g", parallelism=2)
    stage = op.graph.stages["split"]
    assert (stage.application, stage.application_args, stage.parallelism) == (str(app), ("x",), 2)
    assert stage.config["enabled"] is True and set(stage.inputs) == {"input"}
    plan = _plan(op)
    assert plan["parallelism"] == 2 and plan["config"]["enabled"] is True and plan["speculation_blocker"] is None
    assert plan["targets"]["local-a"]["command"][-1] == str(app)
    off = SpeculativeSparkSubmitOperator(task_id="off", application=str(app), inputs={"rows": str(env / "src")},
                                         sink=ParquetSink(str(env / "out2")), speculation=False)
    assert off.graph.stages["off"].config["enabled"] is False and off.graph.stages["off"].parallelism == "auto"


# -- parse-time refusals ------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "argument", "says"), [
    ({"env_vars": {"AWS_SECRET_ACCESS_KEY": "x"}}, "env_vars", "plan.json"),
    ({"deploy_mode": "cluster"}, "deploy_mode", "connection's extra"),
    ({"keytab": "/k"}, "keytab", "connection's extra"),
    ({"application": "/apps/job.py", "java_class": "com.A"}, "application", "not a .jar"),
    ({"application": "/apps/etl.jar"}, "application", "needs java_class"),
    ({"application": "hdfs://nn/job.py"}, "application", "local path"),
    ({"application": ""}, "application", ".py file or a jar"),
    ({"speculation": True}, "speculation", "speculation is impossible"),
    ({"speculative_config": {"enabled": True}}, "speculative_config", "speculation is impossible"),
    ({"speculative_config": {"targets": []}}, "speculative_config", "chosen by conn_id"),
    ({"parallelism": 4}, "parallelism", "one subtask"),
    ({"executor_cores": 0}, "executor_cores", "positive integer"),
    ({"driver_memory": ""}, "driver_memory", "non-empty string"),
    ({"conf": [("a", "b")]}, "conf", "dict"),
    ({"application_args": "--day 1"}, "application_args", "list"),
    ({"verbose": "yes"}, "verbose", "True or False"),
    ({"conn_id": ""}, "conn_id", "spark connection"),
])
def test_arguments_that_cannot_be_honoured_are_refused_naming_task_and_argument(
        env: Path, kwargs: dict[str, Any], argument: str, says: str) -> None:
    given = {"application": str(_script(env, "print('hi')\n")), **kwargs}
    with pytest.raises(PipelineError) as refused:
        SpeculativeSparkSubmitOperator(task_id="my_job", **given)
    message = str(refused.value)
    assert message.startswith(f"SpeculativeSparkSubmitOperator 'my_job': argument {argument!r}: ")
    assert says in message


def test_every_refused_argument_says_why() -> None:
    assert all(len(reason) > 20 for reason in REFUSED_ARGUMENTS.values())


@pytest.mark.parametrize(("kwargs", "argument", "says"), [
    ({"application": "/apps/etl.jar", "java_class": "com.A"}, "java_class", "write it twice"),
    ({"sink": None}, "sink", "needs both inputs"),
    ({"name": "n"}, "name", "named by the provider"),
])
def test_an_unmodified_application_is_never_split_or_speculated(
        env: Path, kwargs: dict[str, Any], argument: str, says: str) -> None:
    given = {"application": str(_script(env, "from x import StageContext\n")),
             "inputs": parquet_source(str(env / "src")), "sink": ParquetSink(str(env / "out")), **kwargs}
    with pytest.raises(PipelineError, match=rf"'my_job': argument {argument!r}: .*{says}"):
        SpeculativeSparkSubmitOperator(task_id="my_job", **given)


def test_a_split_script_without_stage_context_is_refused_at_parse(env: Path) -> None:
    plain = _script(env, "from pyspark.sql import SparkSession\nSparkSession.builder.getOrCreate()\n")
    with pytest.raises(PipelineError, match=r"'my_job': argument 'application': .*does not use StageContext"):
        SpeculativeSparkSubmitOperator(task_id="my_job", application=str(plain),
                                       inputs=parquet_source(str(env / "src")), sink=ParquetSink(str(env / "out")))


# -- the wrapper --------------------------------------------------------------------------------


class _FakeSpark:
    """The attempt's session as StageContext sees it, and a JVM gateway holding one main class."""

    def __init__(self) -> None:
        self.stopped = False
        self.main_args: list[str] | None = None
        self.sparkContext = SimpleNamespace(
            master="local[1]",
            statusTracker=lambda: SimpleNamespace(getActiveStageIds=lambda: [], getStageInfo=lambda _: None),
            _gateway=SimpleNamespace(new_array=lambda _type, n: [None] * n),
            _jvm=SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(String=str)),
                                 com=SimpleNamespace(acme=SimpleNamespace(Etl=SimpleNamespace(main=self._main)))))

    def _main(self, args: list[str]) -> None:
        if args and args[0] == "fail":
            raise RuntimeError("java.lang.IllegalStateException: bad input")
        self.main_args = list(args)

    def stop(self) -> None:
        self.stopped = True


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@pytest.fixture
def fake_spark(monkeypatch: pytest.MonkeyPatch) -> _FakeSpark:
    """Every session the attempt opens is this fake; ``os._exit`` raises ``_Exited`` instead of ending pytest."""
    spark = _FakeSpark()
    opened: list[str] = []

    def open_session(name: str, conf: dict[str, str], tag: str, local_store: bool = True) -> OpenedSession:
        opened.append(os.environ.get("SPECULATIVE_EXTRA_SPARK_CONF") or "")
        return OpenedSession(spark, "local-1234", remote=False)  # type: ignore[arg-type]

    def exit_(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(context_module, "open_session", open_session)
    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.delenv("SPECULATIVE_EXTRA_SPARK_CONF", raising=False)
    spark.opened = opened  # type: ignore[attr-defined]
    return spark


def _attempt(env: Path, op: Any, *, speculative: bool = False, attempt: int = 0) -> tuple[list[str], StageLayout]:
    """Plan ``op`` and claim one attempt of it as the controller would; the wrapper's argv and the stage layout."""
    plan = _plan(op)
    layout = StageLayout.of_plan(plan)  # type: ignore[arg-type]
    atomic_write_json(layout.claim(0, attempt), {"target": "local-a", "speculative": speculative, "created_at": 1.0})
    return ["--plan", str(layout.plan), "--subtask", "0", "--attempt", str(attempt), "--target", "local-a"], layout


def test_the_wrapper_runs_the_script_and_commits_an_empty_manifest(env: Path, fake_spark: _FakeSpark) -> None:
    out = env / "own_output"
    app = _script(env, "import sys, pathlib\n"
                       f"pathlib.Path({str(out)!r}).mkdir()\n"
                       f"pathlib.Path({str(out)!r}, 'args.txt').write_text(' '.join(sys.argv[1:]))\n"
                       "assert __name__ == '__main__'\n")
    op = SpeculativeSparkSubmitOperator(task_id="job", application=str(app), application_args=["--day", "x y"],
                                        name="nightly")
    argv, layout = _attempt(env, op)

    unmodified.main(argv)

    assert (out / "args.txt").read_text() == "--day x y"  # sys.argv was the application's own arguments
    manifest = read_json(layout.manifest(0, 0))
    assert manifest["files"] == [] and manifest["records"] == 0 and manifest["bytes"] == 0
    assert manifest["unmodified_application"] == str(app)
    assert read_json(layout.heartbeat(0, 0))["phase"] == "FINISHED"
    assert read_json(layout.heartbeat(0, 0))["app_id"] == "local-1234"  # reaches the app-id XCom as for stages
    assert fake_spark.stopped
    assert '"spark.app.name": "nightly"' in fake_spark.opened[0]  # type: ignore[attr-defined]

    # The stage commits exactly that attempt and leaves the application's own output where it wrote it.
    atomic_write_json(layout.admitted(0), {"attempt": 0, "at": 1.0})
    result = op.execute_complete(_context(), {"status": "success", "plan_path": str(layout.plan),
                                              "admitted": {"0": 0}, "summary": {}})
    committed = read_json(layout.committed)
    assert {k: v["attempt"] for k, v in committed["subtasks"].items()} == {"0": 0}
    assert committed["subtasks"]["0"]["bytes"] == 0 and result["committed"] == str(layout.committed)
    assert (out / "args.txt").exists()


def test_the_wrapper_calls_a_jar_main_with_the_arguments(env: Path, fake_spark: _FakeSpark) -> None:
    op = SpeculativeSparkSubmitOperator(task_id="jar", application=str(env / "etl.jar"), java_class="com.acme.Etl",
                                        application_args=["in", "out"])
    argv, layout = _attempt(env, op)
    unmodified.main(argv)
    assert fake_spark.main_args == ["in", "out"]
    assert read_json(layout.manifest(0, 0))["files"] == []


@pytest.mark.parametrize(("body", "code", "error"), [
    ("import sys\nsys.exit(7)\n", 7, "exited with code 7"),
    ("import sys\nsys.exit(6)\n", 1, "exited with code 6 (the attempt exits 1"),  # 6 means a lost node
    ("raise ValueError('no rows for 2026-01-01')\n", 1, "ValueError: no rows for 2026-01-01"),
])
def test_a_failing_application_fails_the_attempt_with_its_exit_code(
        env: Path, fake_spark: _FakeSpark, body: str, code: int, error: str) -> None:
    op = SpeculativeSparkSubmitOperator(task_id="job", application=str(_script(env, body)))
    argv, layout = _attempt(env, op)
    with pytest.raises(_Exited) as exited:
        unmodified.main(argv)
    assert exited.value.code == code
    assert error in read_json(layout.failure(0, 0))["error"]
    assert read_json(layout.manifest(0, 0)) is None and fake_spark.stopped


def test_a_failing_jar_main_fails_the_attempt(env: Path, fake_spark: _FakeSpark) -> None:
    op = SpeculativeSparkSubmitOperator(task_id="jar", application=str(env / "etl.jar"), java_class="com.acme.Etl",
                                        application_args=["fail"])
    argv, layout = _attempt(env, op)
    with pytest.raises(_Exited) as exited:
        unmodified.main(argv)
    assert exited.value.code == 1 and "bad input" in read_json(layout.failure(0, 0))["error"]


def test_a_speculative_copy_of_an_unmodified_application_never_runs(env: Path, fake_spark: _FakeSpark) -> None:
    marker = env / "ran"
    app = _script(env, f"open({str(marker)!r}, 'w').close()\n")
    op = SpeculativeSparkSubmitOperator(task_id="job", application=str(app))
    argv, layout = _attempt(env, op, speculative=True, attempt=1)
    with pytest.raises(_Exited) as exited:
        unmodified.main(argv)
    assert exited.value.code == 1 and not marker.exists()
    assert fake_spark.opened == []  # type: ignore[attr-defined]  # not even a Spark session
    assert "speculative copy" in read_json(layout.failure(0, 1))["error"]
    assert read_json(layout.manifest(0, 1)) is None


def test_an_unmodified_application_does_not_run_on_spark_connect(
        env: Path, fake_spark: _FakeSpark, monkeypatch: pytest.MonkeyPatch) -> None:
    op = SpeculativeSparkSubmitOperator(task_id="job", application=str(_script(env, "print(1)\n")))
    argv, layout = _attempt(env, op)
    monkeypatch.setenv("SPECULATIVE_SPARK_REMOTE", "sc://localhost:15002")
    with pytest.raises(_Exited):
        unmodified.main(argv)
    assert "use a 'spark' connection" in read_json(layout.failure(0, 0))["error"]


def test_wrapper_arguments_round_trip_and_refuse_others() -> None:
    args = wrapper_args("/a.py", None, None, ["--", "x"])
    assert parse_wrapper_args(args).args == ("--", "x")
    with pytest.raises(ValueError, match="not the arguments of an unmodified application"):
        parse_wrapper_args(["--day", "1"])


def test_the_operator_is_registered_with_the_provider() -> None:
    from airflow_provider_speculative import get_provider_info

    modules = [m for entry in get_provider_info()["operators"] for m in entry["python-modules"]]
    assert "airflow_provider_speculative.operators.spark_submit" in modules
