"""Authoring API: declare a pipeline of stages inside a DAG; it compiles to one task per stage."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from airflow_provider_speculative.core.graph import (
    ExchangeSpec,
    PipelineError,
    PipelineGraph,
    SourceSpec,
    StageSpec,
)
from airflow_provider_speculative.core.paths import source_root_problem
from airflow_provider_speculative.sinks.base import Sink
from airflow_provider_speculative.sinks.parquet import clashing_sink_paths


class Stage:
    """Handle of a declared stage; pass it to :func:`all_to_all` or :func:`pointwise` to consume it."""

    def __init__(self, pipeline: Pipeline, spec: StageSpec, sink: Sink | None, operator_kwargs: dict[str, Any]):
        self.pipeline = pipeline
        self.spec = spec
        self.sink = sink
        self.operator_kwargs = operator_kwargs
        self.task: Any = None

    @property
    def name(self) -> str:
        """The stage name (its Airflow task id too, unless its pipeline is a TaskGroup)."""
        return self.spec.name

    @property
    def task_id(self) -> str:
        """The Airflow task id of the stage: its name, or ``<pipeline>.<stage>`` in a pipeline that is a TaskGroup."""
        if self.task is None:
            raise PipelineError(f"pipeline {self.pipeline.name!r}, stage {self.name!r}: not compiled yet; its task "
                                "exists once the pipeline's with-block ends (or compile() is called)")
        return str(self.task.task_id)


def parquet_source(path: str) -> SourceSpec:
    """A Parquet dataset (absolute directory, file or glob) whose files are split across the stage's subtasks."""
    # Checked (empty, relative) when the stage graph is validated, where the error can name the stage.
    return SourceSpec(path=os.fspath(path) if isinstance(path, str | os.PathLike) else path, format="parquet")


def _upstream_name(upstream: Stage | str) -> str:
    return upstream.name if isinstance(upstream, Stage) else str(upstream)


def _origin(upstream: Stage | str) -> tuple[int, str] | None:
    """Which Pipeline object a stage handle belongs to (None for a stage named by string)."""
    return (id(upstream.pipeline), upstream.pipeline.name) if isinstance(upstream, Stage) else None


def all_to_all(upstream: Stage | str, key: str | list[str] | tuple[str, ...], mode: str = "blocking") -> ExchangeSpec:
    """Read every upstream subtask's output, hash-partitioned on ``key``; each consumer reads a range."""
    # None, '' or [''] are kept as given: graph validation rejects them naming the stage and input.
    keys = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, list | tuple) else key
    return ExchangeSpec(upstream=_upstream_name(upstream), distribution="all_to_all", key=keys, mode=mode,  # type: ignore[arg-type]
                        origin=_origin(upstream))


def pointwise(upstream: Stage | str, mode: str = "blocking") -> ExchangeSpec:
    """Subtask i reads upstream subtask i's output (equal parallelism)."""
    return ExchangeSpec(upstream=_upstream_name(upstream), distribution="pointwise", mode=mode,  # type: ignore[arg-type]
                        origin=_origin(upstream))


def broadcast(input: Stage | str | SourceSpec) -> ExchangeSpec | SourceSpec:
    """Every subtask reads all of ``input``: an upstream stage's whole output, or every file of a source.

    For a small side of a join next to a hash-partitioned input (a dimension table). Its size is checked
    against ``broadcast_max_bytes`` when the consumer is planned.
    """
    if isinstance(input, SourceSpec):
        return dataclasses.replace(input, broadcast=True)
    if isinstance(input, ExchangeSpec):
        raise PipelineError(f"broadcast() takes a stage or a source, not {input.distribution}({input.upstream!r}); "
                            f"write broadcast({input.upstream!r})")
    return ExchangeSpec(upstream=_upstream_name(input), distribution="broadcast", origin=_origin(input))


# What Airflow accepts as a TaskGroup's group_id (airflow.sdk validate_group_key), checked at declaration.
_GROUP_ID = re.compile(r"[\w-]{1,200}")


class Pipeline:
    """A stage graph inside a DAG. Use as a context manager, or call :meth:`compile` yourself.

    ``config`` overrides ``[speculative]`` options for every stage of this pipeline; ``spark_conf`` is
    Spark configuration for every stage (a stage's own ``spark_conf`` wins per key). ``task_group=True``
    compiles the pipeline into an Airflow TaskGroup named like the pipeline: its stages' task ids become
    ``<pipeline>.<stage>`` (the graph view shows the group), so several pipelines of one DAG may name
    their stages alike. The default keeps one task per stage named like the stage.
    """

    def __init__(self, name: str, *, config: dict[str, Any] | None = None, dag: Any = None,
                 default_max_parallelism: int = 32, spark_conf: dict[str, str] | None = None,
                 task_group: bool = False) -> None:
        if not isinstance(name, str) or not name.strip() or name != name.strip() or "/" in name or "\0" in name:
            raise PipelineError(f"Pipeline name must be a non-empty string without surrounding spaces, '/' or NUL, "
                                f"got {name!r}")
        if not isinstance(task_group, bool):
            raise PipelineError(f"pipeline {name!r}: task_group must be True or False, got {task_group!r}")
        if task_group and not _GROUP_ID.fullmatch(name):
            raise PipelineError(f"pipeline {name!r}: with task_group=True the name is the TaskGroup's group_id, which "
                                "Airflow allows only letters, digits, '_' and '-' (at most 200)")
        for what, value in (("config", config), ("spark_conf", spark_conf)):
            if value is not None and not isinstance(value, dict):
                raise PipelineError(f"pipeline {name!r}: {what} must be a dict of option -> value, got "
                                    f"{type(value).__name__} {str(value)[:80]!r}")
        self.name = name
        self.config = dict(config or {})
        self.spark_conf = {str(k): str(v) for k, v in (spark_conf or {}).items()}
        self.dag = dag
        self.default_max_parallelism = default_max_parallelism
        self.stages: dict[str, Stage] = {}
        self.compiled = False
        self.task_group = task_group
        # The TaskGroup the stages are in once compiled with task_group=True: ``upstream >> p.group >> downstream``.
        self.group: Any = None

    def stage(
        self,
        name: str,
        *,
        application: str,
        parallelism: int | str,
        inputs: dict[str, SourceSpec | ExchangeSpec | Stage] | None = None,
        sink: Sink | None = None,
        max_parallelism: int | None = None,
        deterministic: bool = True,
        config: dict[str, Any] | None = None,
        application_args: list[str] | tuple[str, ...] = (),
        spark_conf: dict[str, str] | None = None,
        min_parallelism: int | None = None,
        splittable_skew: bool = False,
        **operator_kwargs: Any,
    ) -> Stage:
        """Declare a stage; ``operator_kwargs`` go to its SparkStageOperator (retries, pool, ...).

        ``parallelism="auto"`` decides the subtask count at plan time from the bytes the stage reads
        (``data_volume_per_subtask``), within [``min_parallelism``, ``max_parallelism``].
        """
        if self.compiled:
            raise PipelineError(f"pipeline {self.name!r} is already compiled; declare stages inside it")
        if name in self.stages:
            raise PipelineError(f"pipeline {self.name!r}: duplicate stage name {name!r}")
        resolved: dict[str, SourceSpec | ExchangeSpec] = {}
        for input_name, given in (inputs or {}).items():
            if isinstance(given, Stage):
                raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: input {input_name!r} is a stage; "
                                    "wrap it in all_to_all(stage, key=...) or pointwise(stage)")
            if not isinstance(given, SourceSpec | ExchangeSpec):
                raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: input {input_name!r} must be a "
                                    f"source, all_to_all(...) or pointwise(...), got {type(given).__name__}")
            if isinstance(given, ExchangeSpec) and given.origin is not None and given.origin[0] != id(self):
                # Bound by name it would silently read this pipeline's stage of the same name.
                raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: input {input_name!r} reads stage "
                                    f"{given.upstream!r} of another pipeline ({given.origin[1]!r}); a stage reads "
                                    f"only stages of its own pipeline (across DAGs: StageOutputSensor and assets)")
            resolved[input_name] = given
        if sink is not None and not isinstance(sink, Sink):
            raise PipelineError(
                f"pipeline {self.name!r}, stage {name!r}: sink must be a Sink, got {type(sink).__name__}")
        if sink is not None:
            sink.validate(f"pipeline {self.name!r}, stage {name!r}, sink {type(sink).__name__}")
        if not isinstance(deterministic, bool):
            # "no" would be truthy: consumers of a non-deterministic stage would silently not rerun with it.
            raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: deterministic must be True or False, "
                                f"got {deterministic!r}")
        if not isinstance(application_args, list | tuple):
            raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: application_args must be a list of "
                                f"strings, got {application_args!r}; pass e.g. "
                                f"{application_args.split() if isinstance(application_args, str) else ['--x', '1']}")
        declared = max_parallelism is not None
        if max_parallelism is None:
            default = parallelism if isinstance(parallelism, int) and not isinstance(parallelism, bool) else 1
            max_parallelism = max(self.default_max_parallelism, default)
        if isinstance(application, os.PathLike):
            application = os.fspath(application)
        spec = StageSpec(name=name, application=application, parallelism=parallelism, inputs=resolved,
                         max_parallelism=max_parallelism, max_parallelism_declared=declared,
                         deterministic=deterministic, config=dict(config or {}),
                         application_args=tuple(application_args),
                         spark_conf={**self.spark_conf, **{str(k): str(v) for k, v in (spark_conf or {}).items()}},
                         min_parallelism=min_parallelism, splittable_skew=splittable_skew)
        handle = Stage(self, spec, sink, operator_kwargs)
        self.stages[name] = handle
        return handle

    def graph(self) -> PipelineGraph:
        """The validated stage graph."""
        self._check_upstream_names()
        graph = PipelineGraph(name=self.name, stages={n: s.spec for n, s in self.stages.items()}, config=self.config)
        graph.align_copartitioned()
        graph.validate()
        for name, handle in self.stages.items():
            if handle.sink is not None and graph.consumers(name):
                consumers = ", ".join(sorted({c for c, _, _ in graph.consumers(name)}))
                raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: a stage with a sink is final and "
                                    f"cannot be read by other stages (read by: {consumers})")
            for input_name, src in handle.spec.inputs.items():
                problem = source_root_problem(src.path) if isinstance(src, SourceSpec) else None
                if problem:
                    raise PipelineError(f"pipeline {self.name!r}, stage {name!r}, input {input_name!r}: {problem}")
        clash = clashing_sink_paths({n: h.sink for n, h in self.stages.items() if h.sink is not None})
        if clash:
            # Found now rather than at the second commit, after all the compute.
            raise PipelineError(f"pipeline {self.name!r}: {clash}")
        return graph

    def _check_upstream_names(self) -> None:
        """Refuse an input naming a stage by its task id in the group: stages read their pipeline's stages by name."""
        for name, handle in self.stages.items():
            for input_name, given in handle.spec.inputs.items():
                if not isinstance(given, ExchangeSpec) or given.upstream in self.stages:
                    continue
                head, _, tail = given.upstream.rpartition(".")
                if tail in self.stages and (head == self.name or head.endswith("." + self.name)):
                    raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: input {input_name!r} names stage "
                                        f"{given.upstream!r}, a task id; a stage reads stages of its own pipeline by "
                                        f"their names ({tail!r}), across pipelines through StageOutputSensor or assets")

    def _open_group(self) -> Any:
        """The TaskGroup of a pipeline compiled with ``task_group=True`` (in the DAG and group being defined)."""
        from airflow.sdk import TaskGroup

        kwargs: dict[str, Any] = {"dag": self.dag} if self.dag is not None else {}
        try:
            return TaskGroup(group_id=self.name, tooltip=f"speculative pipeline {self.name}", **kwargs)
        except RuntimeError as exc:  # no DAG: "TaskGroup can only be used inside a dag"
            raise PipelineError(f"pipeline {self.name!r}: task_group=True needs a DAG; declare the pipeline inside "
                                f"`with DAG(...)` or pass dag=... ({exc})") from None
        except Exception as exc:  # a task or group of that id in the DAG already (DuplicateTaskIdFound)
            raise PipelineError(f"pipeline {self.name!r}: cannot be the task group {self.name!r}: {exc}") from None

    def compile(self) -> dict[str, Any]:
        """Validate and create one SparkStageOperator per stage, wired like the stage edges.

        With ``task_group=True`` the operators are created in a TaskGroup named like the pipeline, and every
        stage's store directory is keyed by its task id (``<dag>/<run>/<pipeline>.<stage>/``): two grouped
        pipelines of one DAG with a stage of the same name must not share a directory, and the task id is
        already unique in the DAG and what the UI and ``rerun`` are asked about. The stage name the
        application, plan, journal and metrics see stays the bare name.
        """
        from airflow_provider_speculative.operators.stage import SparkStageOperator

        graph = self.graph()
        group = self._open_group() if self.task_group else None
        if group is not None:
            graph = dataclasses.replace(graph, store_prefix=group.child_id(""))
        tasks: dict[str, Any] = {}
        for name in graph.topological_order():
            handle = self.stages[name]
            kwargs = dict(handle.operator_kwargs)
            if self.dag is not None:
                kwargs.setdefault("dag", self.dag)
            if group is not None:
                kwargs["task_group"] = group
            if graph.hybrid_only(name):
                # FLIP-235: the consumer's task starts while its producers still run (the edge stays for
                # the graph view and ordering); its controller waits for admitted partitions and fails,
                # naming the input, if a producer fails. "always" is the only rule not gated on upstreams.
                kwargs.setdefault("trigger_rule", "always")
            handle.task = SparkStageOperator(task_id=name, graph=graph, stage=name, sink=handle.sink, **kwargs)
            if group is not None and handle.task.task_id != graph.store_key(name):
                # The store key must be the task id: the UI and rerun find a stage's directory by it.
                raise PipelineError(f"pipeline {self.name!r}, stage {name!r}: task id {handle.task.task_id!r} is not "
                                    f"the store key {graph.store_key(name)!r}")
            tasks[name] = handle.task
            for upstream in graph.upstreams(name):
                tasks[upstream] >> handle.task
        self.group = group
        self.compiled = True
        return tasks

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.compile()
