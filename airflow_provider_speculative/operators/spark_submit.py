"""SpeculativeSparkSubmitOperator: SparkSubmitOperator's arguments run as one stage, deferrable from the start."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

from airflow_provider_speculative.control.spark_submit import stage_context_problem
from airflow_provider_speculative.core.graph import ExchangeSpec, RenderedStage, SourceSpec
from airflow_provider_speculative.core.spark_submit import (
    CONF_OF_ARGUMENT,
    REFUSED_ARGUMENTS,
    TRY_TEMPLATE,
    check_application,
    check_application_args,
    check_name,
    check_refused,
    connection_targets,
    refuse,
    submit_conf,
    wrapper_args,
)
from airflow_provider_speculative.operators.stage import SparkStageOperator
from airflow_provider_speculative.sinks.base import Sink

WRAPPER_MODULE = "airflow_provider_speculative.runtime.unmodified"


def wrapper_application() -> str:
    """The path of the attempt wrapper of unmodified applications (``runtime/unmodified.py``), without importing it."""
    spec = importlib.util.find_spec(WRAPPER_MODULE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{WRAPPER_MODULE} is not installed")
    return spec.origin


class SpeculativeSparkSubmitOperator(SparkStageOperator):
    """A drop-in for SparkSubmitOperator's main arguments that runs as a stage: deferrable from the start.

    Without ``inputs`` and ``sink`` the application is run **unmodified**, as spark-submit runs it: a
    .py file (its ``SparkSession.builder.getOrCreate()`` gets the attempt's session) or a jar's
    ``java_class``. It writes its own output, so it runs as one subtask and speculation is impossible:
    two copies would write twice. Its attempt commits no output of the provider's, so nothing it wrote
    is ever moved or deleted. It needs a ``spark`` connection (``conn_id``): a jar's main class and the
    driver and executor settings need spark-submit, not a Spark Connect server.

    With ``inputs`` (``parquet_source(...)`` or a path) and a ``sink`` (``ParquetSink``) the same operator
    splits the input by file across ``parallelism`` subtasks (default ``"auto"``) with speculation on
    (``speculation=False`` turns it off). The application must then be a PySpark script using
    ``StageContext`` (``ctx.read(...)``, ``ctx.write(df)``): an unmodified application or a jar is refused
    when the DAG is parsed. ``conn_id`` may then also name a ``spark_connect`` connection.

    ``files``, ``py_files``, ``archives``, ``jars``, ``driver_class_path``, ``packages``,
    ``exclude_packages``, ``repositories``, ``driver_memory``, ``executor_memory``, ``executor_cores``,
    ``num_executors``, ``total_executor_cores`` and ``yarn_queue`` become the Spark properties spark-submit
    reads for the option of the same meaning (``spark.files``, ``spark.submit.pyFiles``, ...), merged into
    ``conf`` (the argument wins); ``verbose`` sets ``spark.logConf``; ``name`` names the attempt's Spark
    application. ``application``, ``application_args``, ``name`` and ``conf`` (with the properties above)
    are templated. Arguments that cannot be honoured (``env_vars``, ``keytab``, ``deploy_mode``, ...) are
    refused when the DAG is parsed, naming the task and the argument. ``speculative_config`` overrides
    ``[speculative]`` options for this stage. Other keyword arguments go to the stage's operator
    (``retries``, ``execution_timeout``, ``pool``, ``outlets``, ``commit_in_triggerer``, ...).
    """

    # ``task_try`` renders to the task's try number: each try plans afresh (core/spark_submit.py TRY_TEMPLATE).
    template_fields: tuple[str, ...] = (*SparkStageOperator.template_fields, "name",  # type: ignore[assignment]
                                        "task_try")
    ui_color = "#f0c080"

    def __init__(self, *, task_id: str, application: str = "", application_args: list[Any] | None = None,
                 conf: dict[str, Any] | None = None, conn_id: str = "spark_default", name: str | None = None,
                 java_class: str | None = None, files: str | None = None, py_files: str | None = None,
                 archives: str | None = None, jars: str | None = None, driver_class_path: str | None = None,
                 packages: str | None = None, exclude_packages: str | None = None, repositories: str | None = None,
                 driver_memory: str | None = None, executor_memory: str | None = None,
                 executor_cores: int | None = None, num_executors: int | None = None,
                 total_executor_cores: int | None = None, yarn_queue: str | None = None, verbose: bool = False,
                 inputs: Any = None, sink: Sink | None = None, parallelism: int | str | None = None,
                 speculation: bool | None = None, speculative_config: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        check_refused(task_id, {k: kwargs.pop(k) for k in list(kwargs) if k in REFUSED_ARGUMENTS})
        split = inputs is not None or sink is not None
        check_application(task_id, application, java_class, split=split)
        args = check_application_args(task_id, application_args)
        app_name = check_name(task_id, name)
        arguments = {"files": files, "py_files": py_files, "archives": archives, "jars": jars,
                     "driver_class_path": driver_class_path, "packages": packages,
                     "exclude_packages": exclude_packages, "repositories": repositories,
                     "driver_memory": driver_memory, "executor_memory": executor_memory,
                     "executor_cores": executor_cores, "num_executors": num_executors,
                     "total_executor_cores": total_executor_cores, "yarn_queue": yarn_queue}
        assert set(arguments) == set(CONF_OF_ARGUMENT)
        spark_conf = submit_conf(task_id, conf, arguments, application=application, java_class=java_class,
                                 verbose=verbose)
        config = _stage_config(task_id, conn_id, speculative_config, split, speculation)
        if split:
            stage_application, stage_args = application, args
            if app_name is not None:
                raise refuse(task_id, "name", "the attempts of a split stage are named by the provider "
                             "(<dag>.<task>[subtask]#attempt); name applies to an unmodified application")
            problem = stage_context_problem(application)
            if problem:
                raise refuse(task_id, "application", problem)
            stage_inputs = _split_inputs(task_id, inputs, sink)
            stage_parallelism: int | str = "auto" if parallelism is None else parallelism
        else:
            if parallelism not in (None, 1):
                raise refuse(task_id, "parallelism", f"is {parallelism!r}; an unmodified application runs as one "
                             "subtask (pass inputs and a sink, with a StageContext application, to split it)")
            stage_application = wrapper_application()
            stage_args = wrapper_args(application, java_class, app_name, args)
            stage_inputs, stage_parallelism = {}, 1
        from airflow_provider_speculative.pipeline import Pipeline

        pipeline = Pipeline(task_id)
        pipeline.stage(task_id, application=stage_application, parallelism=stage_parallelism, inputs=stage_inputs,
                       sink=sink, config=config, application_args=stage_args, spark_conf=spark_conf)
        super().__init__(task_id=task_id, graph=pipeline.graph(), stage=task_id, sink=sink, **kwargs)
        if self.task_id != task_id:
            # In a TaskGroup: the store directory is keyed by the task id, as a grouped pipeline's stages are.
            self.graph = dataclasses.replace(self.graph, store_prefix=self.task_id[: -len(task_id)])
            if self.start_from_trigger:
                self._start_in_triggerer()
        self.split = split
        self.conn_id = conn_id
        self.java_class = java_class
        self.name = app_name
        self.application = application
        self.application_args = args
        self.task_try = TRY_TEMPLATE

    def _rendered_stage(self) -> RenderedStage:
        """The stage's fields from the rendered arguments: the wrapper runs an unmodified application."""
        if self.split:
            return super()._rendered_stage()
        check_application(self.task_id, self.application, self.java_class, split=False)
        name = check_name(self.task_id, self.name)
        args = check_application_args(self.task_id, self.application_args)
        return RenderedStage.rendered(wrapper_application(),
                                      wrapper_args(self.application, self.java_class, name, args, str(self.task_try)),
                                      self.spark_conf, self.source_paths)


def _stage_config(task_id: str, conn_id: Any, overrides: Any, split: bool,
                  speculation: bool | None) -> dict[str, Any]:
    """The stage's ``[speculative]`` overrides: the connection's targets, and speculation off unless split."""
    from airflow_provider_speculative.settings import airflow_config

    if overrides is not None and not isinstance(overrides, dict):
        raise refuse(task_id, "speculative_config", f"must be a dict of [speculative] option -> value, got "
                     f"{type(overrides).__name__}")
    config = dict(overrides or {})
    if "targets" in config:
        raise refuse(task_id, "speculative_config", "'targets' is chosen by conn_id; size a connection's slots in "
                     "[speculative] targets")
    if speculation is not None and not isinstance(speculation, bool):
        raise refuse(task_id, "speculation", f"must be True or False, got {speculation!r}")
    if not split:
        if speculation or config.get("enabled"):
            argument = "speculation" if speculation else "speculative_config"
            raise refuse(task_id, argument, "an unmodified application writes its own output, so two copies of "
                         "it would write twice: speculation is impossible for it (pass inputs and a sink, with a "
                         "StageContext application, to speculate)")
        config["enabled"] = False
    elif speculation is not None:
        config["enabled"] = speculation
    else:
        config.setdefault("enabled", True)
    config["targets"] = connection_targets(task_id, conn_id, airflow_config().targets)
    return config


def _split_inputs(task_id: str, inputs: Any, sink: Any) -> dict[str, SourceSpec | ExchangeSpec | Any]:
    """The sources a split stage reads (a source or a path is named ``input``); both inputs and a sink are required."""
    if inputs is None or sink is None:
        missing = "sink" if sink is None else "inputs"
        raise refuse(task_id, missing, "speculation over an input split by file needs both inputs "
                     "(parquet_source(...)) and a sink (ParquetSink(...)); pass neither to run the application "
                     "unmodified")
    given = inputs if isinstance(inputs, dict) else {"input": inputs}
    out: dict[str, SourceSpec | ExchangeSpec | Any] = {}
    for input_name, value in given.items():
        if isinstance(value, str):
            from airflow_provider_speculative.pipeline import parquet_source

            value = parquet_source(value)
        if isinstance(value, ExchangeSpec) or not isinstance(value, SourceSpec):
            raise refuse(task_id, "inputs", f"input {input_name!r} must be parquet_source(<absolute directory, file "
                         f"or glob>) or such a path, got {type(value).__name__}")
        out[str(input_name)] = value
    return out
