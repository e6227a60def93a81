"""SparkStageOperator: plans a stage run, defers once to the controller trigger, then finalizes."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_speculative.backends.controller import StageController, wipe_stage_attempts
from airflow_provider_speculative.backends.local import LocalBackend
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.plugin.links import SparkHistoryLink, StageViewLink
from airflow_provider_speculative.settings import airflow_config, store_root
from airflow_provider_speculative.sinks.base import AttemptResult, FinalizationContext, Sink
from airflow_provider_speculative.store.files import append_jsonl, atomic_write_json, read_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import (
    admitted_results,
    broken_admissions,
    read_committed,
    remove_attempt_output,
    write_committed,
)
from airflow_provider_speculative.triggers.controller import StageControllerTrigger


class SparkStageOperator(BaseOperator):
    """One stage of a speculative pipeline: N subtasks, each attempt a Spark submission.

    Built by :class:`~airflow_provider_speculative.pipeline.Pipeline`; not usually instantiated by hand.
    """

    template_fields = ("sink_args",)
    operator_extra_links = (StageViewLink(), SparkHistoryLink())
    ui_color = "#f4a460"

    def __init__(self, *, graph: PipelineGraph, stage: str, sink: Sink | None = None,
                 force_rerun: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.graph = graph
        self.stage = stage
        self.sink = sink
        self.sink_args = sink.describe() if sink is not None else None
        self.force_rerun = force_rerun

    # -- planning (worker) ------------------------------------------------------------------

    def _config(self) -> SpeculativeConfig:
        spec = self.graph.stages[self.stage]
        return (airflow_config()
                .with_overrides(self.graph.config, f"pipeline {self.graph.name!r}")
                .with_overrides(spec.config, f"stage {self.stage!r}"))

    def _layout(self, config: SpeculativeConfig, dag_id: str, run_id: str, stage: str | None = None) -> StageLayout:
        return StageLayout(store_root(config), dag_id, run_id, stage or self.stage)

    def _commands(self, config: SpeculativeConfig, application: str) -> dict[str, list[str]]:
        """Build each target's spark-submit command line with SparkSubmitHook (connection resolved here)."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        spec = self.graph.stages[self.stage]
        commands = {}
        for target in config.targets:
            hook = SparkSubmitHook(conn_id=target.conn_id, conf={**target.conf, **spec.spark_conf},
                                   name=f"{self.dag_id}.{self.stage}")
            cmd = hook._build_spark_submit_command(application)
            if cmd and os.sep not in cmd[0] and not shutil.which(cmd[0]):
                # Workers started from a venv without activating it: use the venv's spark-submit.
                local = Path(sys.executable).parent / cmd[0]
                if local.exists():
                    cmd[0] = str(local)
            commands[target.name] = cmd
        return commands

    def _speculation_blocker(self) -> str | None:
        spec = self.graph.stages[self.stage]
        for name, source in spec.inputs.items():
            if isinstance(source, SourceSpec) and not source.supports_concurrent_attempts:
                return f"source {name!r} cannot take concurrent attempts"
        if self.sink is not None and not self.sink.supports_concurrent_attempts:
            return (f"sink {type(self.sink).__name__} does not implement SupportsConcurrentExecutionAttempts")
        return None

    def execute(self, context: Any) -> Any:
        """Resolve the plan, write plan.json, and defer to the stage controller."""
        config = self._config()
        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        layout = self._layout(config, dag_id, run_id)
        spec = self.graph.stages[self.stage]
        application = str(Path(spec.application).resolve()) if not spec.application.startswith(("s3", "hdfs", "gs")) \
            else spec.application
        if not application.startswith(("s3", "hdfs", "gs")) and not Path(application).is_file():
            raise FileNotFoundError(f"stage {self.stage!r}: application {application} does not exist")
        source_files = {name: _list_files(src) for name, src in spec.inputs.items() if isinstance(src, SourceSpec)}
        upstream = {name: read_committed(self._layout(config, dag_id, run_id, name))
                    for name in self.graph.upstreams(self.stage)}
        logical_date = context.get("logical_date")
        plan = plan_stage(
            self.graph, self.stage, config, source_files=source_files, upstream_committed=upstream,
            sink=self._rendered_sink().to_json() if self.sink else None,
            speculation_blocker=self._speculation_blocker(),
            context={"dag_id": dag_id, "run_id": run_id, "store_root": str(layout.root),
                     "logical_date": logical_date.isoformat() if logical_date else None,
                     "application": application, "commands": self._commands(config, application),
                     "env": {}, "try_number": context["ti"].try_number})
        previous = read_json(layout.plan)
        conf = (context.get("dag_run").conf or {}) if context.get("dag_run") is not None else {}
        force = self.force_rerun or bool(conf.get("speculative_force_rerun"))
        if force or (previous and previous.get("fingerprint") != plan["fingerprint"]):
            if previous:
                StageController(previous).kill_all("full rerun forced" if force else "stage replanned")
            wipe_stage_attempts(layout)
        elif previous:
            # A retried or cleared task reruns only subtasks without a valid committed result.
            backend = LocalBackend(layout)
            for subtask, attempt, reason in broken_admissions(layout, plan["parallelism"]):
                backend.invalidate(subtask, attempt, f"committed output no longer valid: {reason}")
                journal(layout, "invalidate", subtask=subtask, attempt=attempt, reason=reason)
        atomic_write_json(layout.plan, plan)
        self.log.info("stage %s: %d subtasks, speculation %s, plan %s", self.stage, plan["parallelism"],
                      "blocked: " + plan["speculation_blocker"] if plan["speculation_blocker"] else
                      ("enabled" if config.enabled else "disabled"), layout.plan)
        self.defer(trigger=StageControllerTrigger(plan_path=str(layout.plan), deferred_at=time.time()),
                   method_name="execute_complete")

    def _rendered_sink(self) -> Sink:
        assert self.sink is not None
        return type(self.sink)(**(self.sink_args or {}))

    # -- finalize (worker) ------------------------------------------------------------------

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Finalize-on-master: commit exactly the admitted attempt of every subtask, then clean losers."""
        plan = read_json(event["plan_path"])
        layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
        summary = event.get("summary", {})
        if event["status"] != "success":
            causes = "\n  ".join(event.get("causes") or ["(none recorded)"])
            raise RuntimeError(f"stage {self.stage!r} failed: {event.get('reason')}\n  {causes}")
        admitted = {int(k): v for k, v in event["admitted"].items()}
        record = admitted_results(layout, admitted)
        sink_result = None
        journal(layout, "finalize_started", admitted=event["admitted"], try_number=context["ti"].try_number)
        if plan["output"].get("sink"):
            sink = Sink.from_json(plan["output"]["sink"])
            ctx = FinalizationContext(
                parallelism=plan["parallelism"], dag_id=plan["dag_id"], run_id=plan["run_id"], stage=plan["stage"],
                logical_date=plan.get("logical_date"),
                attempts={s: AttemptResult(subtask=s, attempt=a, data_dir=layout.data(s, a),
                                           files=record["subtasks"][str(s)]["files"],
                                           records=record["subtasks"][str(s)]["records"],
                                           sink_info=record["subtasks"][str(s)]["sink"])
                          for s, a in admitted.items()})
            sink_result = sink.finalize_global(ctx)
        record.update(fingerprint=plan["fingerprint"], committed_at=time.time(), sink=sink_result,
                      summary=summary)
        write_committed(layout, record)
        journal(layout, "finalize_done", sink=sink_result)
        removed = self._remove_losers(layout, plan["parallelism"], admitted)
        self._emit_metrics(plan, summary)
        self.log.info("stage %s committed %d subtasks (removed %d losing outputs); speculation %s; "
                      "numSlowExecutionVertices=%s numEffectiveSpeculativeExecutions=%s",
                      self.stage, len(admitted), removed, summary.get("speculation"),
                      summary.get("numSlowExecutionVertices"), summary.get("numEffectiveSpeculativeExecutions"))
        return {"stage": self.stage, "committed": str(layout.committed), "sink": sink_result, **summary}

    @staticmethod
    def _remove_losers(layout: StageLayout, parallelism: int, admitted: dict[int, int]) -> int:
        removed = 0
        for subtask in range(parallelism):
            for number in layout.attempt_numbers(subtask):
                if admitted.get(subtask) != number:
                    removed += remove_attempt_output(layout, subtask, number)
        return removed

    @staticmethod
    def _emit_metrics(plan: dict[str, Any], summary: dict[str, Any]) -> None:
        from airflow.sdk.observability.stats import Stats

        tags = {"dag_id": plan["dag_id"], "stage": plan["stage"]}
        prefix = f"speculative.{plan['dag_id']}.{plan['stage']}"
        for name in ("numSlowExecutionVertices", "numEffectiveSpeculativeExecutions"):
            if summary.get(name) is not None:
                Stats.gauge(f"{prefix}.{name}", summary[name], tags=tags)


def journal(layout: StageLayout, event: str, **fields: Any) -> None:
    """Record a finalize step next to the controller's decisions."""
    append_jsonl(layout.journal, {"at": time.time(), "event": event, **fields})


def _list_files(source: SourceSpec) -> list[tuple[str, int]]:
    """List a source's data files (a directory, a file or a glob) with their sizes."""
    path = source.path
    if any(ch in path for ch in "*?["):
        candidates = [Path(p) for p in glob.glob(path, recursive=True)]
    elif Path(path).is_dir():
        candidates = list(Path(path).rglob(f"*.{source.format}"))
    else:
        candidates = [Path(path)]
    files = [(str(p.resolve()), p.stat().st_size) for p in candidates
             if p.is_file() and not p.name.startswith((".", "_"))]
    if not files:
        raise FileNotFoundError(f"source {path!r} has no {source.format} files")
    return sorted(files)
