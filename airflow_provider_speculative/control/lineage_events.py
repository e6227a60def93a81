"""OpenLineage events of the stage task tries that end in the triggerer, where Airflow's listener never runs.

Which events: ``core.lineage.provider_events`` (the listener reports every worker run of a task, this
module the tries that end in the triggerer). Content: Airflow's ``OpenLineageAdapter`` builds and emits
them (namespace, job facets, secrets redaction), with the job name, run id and parent (the DAG run) the
listener gives the same task try (``hooks/openlineage.py`` ``task_run_ids``), so the attempts' injected
parent run id is a run that reports. Datasets are the stage's lineage from the run's plans
(``control/lineage.py``); a committed stage's output carries its schema and output statistics (rows,
bytes, files) from committed.json, the same facets the operator gives the listener on a worker.

Emission runs in a daemon thread, waited for at most :data:`EMIT_TIMEOUT`, and never raises: a lineage backend that is
down or slow costs a stage one log line, never its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_provider_speculative.control.lineage import lineage_of_stage
from airflow_provider_speculative.core.lineage import (
    LineageDataset,
    LineageEvent,
    OutputStats,
    error_text,
    output_stats,
    provider_events,
)
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.hooks.openlineage import openlineage_adapter, task_run_ids
from airflow_provider_speculative.sinks.base import Sink
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import read_committed

log = logging.getLogger(__name__)

# Seconds the trigger waits for its events before it ends the task; a slower send goes on in its thread.
EMIT_TIMEOUT = 5.0
# A failure to emit is logged with at most this many characters of its message.
LOGGED_ERROR_LIMIT = 300


@dataclass(frozen=True)
class TaskEnd:
    """How one stage task try ended, as the trigger that decided it knows it."""

    ran_on_worker: bool  # a worker ran the task before it deferred (the listener sent its START)
    ended_in_triggerer: bool  # the trigger ended the task (no worker run follows, no listener event)
    succeeded: bool
    started_at: float  # epoch seconds: when the controller started the stage
    error: str | None = None
    dag_run_conf: dict[str, Any] = field(default_factory=dict)  # may name an OpenLineage parent of the DAG run
    nominal_start: str | None = None  # the DAG run's data interval, as the listener's nominalTime facet
    nominal_end: str | None = None

    def events(self) -> tuple[LineageEvent, ...]:
        """The events this provider emits for this end (core/lineage.py)."""
        return provider_events(ran_on_worker=self.ran_on_worker, ended_in_triggerer=self.ended_in_triggerer,
                               succeeded=self.succeeded)


def operator_lineage(root: Path | StoreBackend, dag_id: str, run_id: str, stage: str, sink: Sink | None) -> Any:
    """The stage's ``OperatorLineage``: datasets from the run's plans, output facets when it is committed.

    ``stage`` is the store key. Raises NotFoundError when the stage was never planned.
    """
    from airflow.providers.openlineage.extractors import OperatorLineage

    inputs, outputs = lineage_of_stage(root, dag_id, run_id, stage, sink)
    try:
        stats: OutputStats | None = output_stats(read_committed(StageLayout.at(root, dag_id, run_id, stage)))
    except StoreError:  # not committed (a failed try): datasets without statistics
        stats = None
    return OperatorLineage(inputs=[_input(d) for d in inputs], outputs=[_output(d, stats) for d in outputs])


def _input(dataset: LineageDataset) -> Any:
    from openlineage.client.event_v2 import InputDataset

    return InputDataset(namespace=dataset.namespace, name=dataset.name)


def _output(dataset: LineageDataset, stats: OutputStats | None) -> Any:
    """An output dataset with the schema and output statistics facets of what was committed."""
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset, schema_dataset

    if stats is None:
        return OutputDataset(namespace=dataset.namespace, name=dataset.name)
    facets: dict[str, Any] = {}
    if stats.fields:
        facets["schema"] = schema_dataset.SchemaDatasetFacet(
            fields=[schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in stats.fields])
    output_facets: dict[str, Any] = {}
    if stats.rows is not None or stats.bytes is not None:
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=stats.rows, size=stats.bytes, fileCount=stats.files)
    return OutputDataset(namespace=dataset.namespace, name=dataset.name, facets=facets, outputFacets=output_facets)


def emit_task_end(plan: StagePlan, end: TaskEnd, *, sink: Sink | None = None, adapter: Any | None = None,
                  logger: Any = log) -> list[str]:
    """Emit the events :meth:`TaskEnd.events` gives through Airflow's adapter; the types emitted. Never raises.

    ``sink`` is the stage's declared sink (its dataset is the one its asset names); ``adapter`` is Airflow's
    ``OpenLineageAdapter`` for this task, by default the process's one (None when disabled: nothing sent).
    """
    events = end.events()
    if not events:
        return []
    try:
        adapter = adapter if adapter is not None else openlineage_adapter(plan)
        if adapter is None:
            return []
        sent = _emit(plan, end, events, sink, adapter)
    except Exception as exc:  # one line, no traceback: a transport's error may quote its configuration
        logger.warning("stage %s: OpenLineage events not emitted: %s: %s", plan.get("stage"), type(exc).__name__,
                       error_text(str(exc), LOGGED_ERROR_LIMIT))
        return []
    if sent:
        logger.info("stage %s: OpenLineage %s emitted (this task try ended in the triggerer)", plan.get("stage"),
                    " and ".join(sent))
    return sent


def _emit(plan: StagePlan, end: TaskEnd, events: tuple[LineageEvent, ...], sink: Sink | None,
          adapter: Any) -> list[str]:
    from airflow.providers.openlineage import conf as ol_conf
    from airflow.providers.openlineage.utils.utils import get_task_parent_run_facet

    namespace = ol_conf.namespace()
    ids = task_run_ids(plan, namespace, adapter)
    if ids is None:  # a plan without its task id: no run id the listener would use
        return []
    layout = StageLayout.of_plan(plan)
    lineage = operator_lineage(layout.store, plan["dag_id"], plan["run_id"], layout.stage, sink)
    parent = get_task_parent_run_facet(parent_run_id=ids.dag_run_id, parent_job_name=ids.dag_id,
                                       parent_job_namespace=namespace, dr_conf=end.dag_run_conf)
    common: dict[str, Any] = {"run_id": ids.run_id, "job_name": ids.job_name, "job_description": None,
                              "nominal_start_time": end.nominal_start, "nominal_end_time": end.nominal_end,
                              "owners": None, "tags": None, "task": lineage, "run_facets": dict(parent)}
    sent = []
    for event in events:
        if event is LineageEvent.START:
            adapter.start_task(event_time=_iso(end.started_at), **common)
        elif event is LineageEvent.COMPLETE:
            adapter.complete_task(end_time=_iso(time.time()), **common)
        else:
            adapter.fail_task(end_time=_iso(time.time()), error=error_text(end.error or "stage failed"), **common)
        sent.append(event.value)
    return sent


async def report_task_end(plan: StagePlan, end: TaskEnd, *, sink: Sink | None = None,
                          timeout: float = EMIT_TIMEOUT, logger: Any = log) -> None:
    """:func:`emit_task_end` off the event loop, waited for at most ``timeout`` seconds; never raises.

    It runs in a daemon thread of its own, not the loop's default executor: a backend that hangs holds
    neither the triggerer's shared threads nor its shutdown.
    """
    if not end.events():
        return
    try:
        await asyncio.wait_for(_in_daemon_thread(lambda: emit_task_end(plan, end, sink=sink, logger=logger)),
                               timeout)
    except TimeoutError:
        logger.warning("stage %s: OpenLineage events not sent within %g s; the task ends without waiting for them",
                       plan.get("stage"), timeout)
    except Exception as exc:  # emit_task_end does not raise; a thread that cannot start must not fail the stage
        logger.warning("stage %s: OpenLineage events not emitted: %s", plan.get("stage"), type(exc).__name__)


async def _in_daemon_thread(work: Callable[[], object]) -> None:
    """Run ``work`` in a new daemon thread and wait for it (a cancelled wait leaves the thread to finish)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            work()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed while the thread still worked
                loop.call_soon_threadsafe(finish)

    threading.Thread(target=run, name="openlineage-emit", daemon=True).start()
    await done


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()
