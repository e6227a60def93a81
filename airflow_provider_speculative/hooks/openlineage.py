"""OpenLineage properties for the attempts' Spark sessions, as the apache-spark provider injects them.

With Airflow's OpenLineage provider installed and enabled, ``[openlineage] spark_inject_parent_job_info``
adds the parent job (the stage's Airflow task run and its DAG run as root), so the OpenLineage Spark
integration nests each attempt's Spark run under the task; ``spark_inject_transport_info`` adds the
transport, so Spark sends its events where Airflow does. Both options are the provider's own and off by
default. The properties reach an attempt through its environment (``core.contract.EXTRA_CONF_ENV``),
never through plan.json: a transport may carry an API key.

The parent is injected only for a task run that reports itself: OpenLineage enabled and the task's events
not turned off by ``[openlineage] emission_policy``. Airflow's listener reports its worker runs and
``control/lineage_events.py`` what ends in the triggerer, with the same job name and run ids
(:func:`task_run_ids`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from airflow_provider_speculative.core.plan import StagePlan

log = logging.getLogger(__name__)

# The operator of every stage task, as ``[openlineage] emission_policy`` rules name it.
STAGE_OPERATOR = "airflow_provider_speculative.operators.stage.SparkStageOperator"


@dataclass(frozen=True)
class TaskRunIds:
    """A stage task try as Airflow's OpenLineage provider names it: job ``<dag_id>.<task_id>``, run ids, parent."""

    namespace: str
    dag_id: str
    job_name: str
    run_id: str
    dag_run_id: str


def task_run_ids(plan: StagePlan, namespace: str, adapter: Any) -> TaskRunIds | None:
    """The task try's and its DAG run's OpenLineage run ids, as the listener computes them; None for an old plan."""
    task_id = plan.get("task_id")
    when = plan.get("logical_date") or plan.get("run_after")
    if not task_id or not when:  # a plan from before these were recorded: no run to name
        return None
    moment = datetime.fromisoformat(str(when))
    dag_id = plan["dag_id"]
    return TaskRunIds(
        namespace=namespace, dag_id=dag_id, job_name=f"{dag_id}.{task_id}",
        run_id=str(adapter.build_task_instance_run_id(dag_id=dag_id, task_id=task_id,
                                                      try_number=plan.get("try_number", 1), logical_date=moment,
                                                      map_index=-1)),
        dag_run_id=str(adapter.build_dag_run_id(dag_id=dag_id, logical_date=moment,
                                                clear_number=plan.get("clear_number", 0))))


_prepared = threading.Event()


def prepare_openlineage() -> threading.Thread | None:
    """Import Airflow's OpenLineage provider and read its configuration in a background thread, once per process.

    Called when a stage task starts planning: the first :func:`openlineage_spark_conf` of a fresh triggerer
    or ``airflow dags test`` process would otherwise pay the import before the stage's first wave. Returns
    the thread it started, or None if an earlier call did.
    """
    if _prepared.is_set():
        return None
    _prepared.set()

    def run() -> None:
        try:
            from airflow.providers.openlineage import conf as ol_conf
        except ImportError:  # the optional extra is not installed: nothing to prepare
            return
        with contextlib.suppress(Exception):  # only a head start: the stage's own call reports problems
            if not ol_conf.is_disabled():
                _adapter()

    thread = threading.Thread(target=run, name="openlineage-prepare", daemon=True)
    thread.start()
    return thread


def openlineage_adapter(plan: StagePlan) -> Any | None:
    """Airflow's ``OpenLineageAdapter`` (one per process) when this task's events are emitted; else None.

    None when the provider is not installed, ``[openlineage]`` is disabled or has no transport, or an
    ``emission_policy`` rule turns this task's (or this operator's) events off, as the listener would.
    """
    try:
        from airflow.providers.openlineage import conf as ol_conf
    except ImportError:  # the optional extra is not installed
        return None
    if ol_conf.is_disabled() or not _task_events_emitted(plan["dag_id"], str(plan.get("task_id") or "")):
        return None
    return _adapter()


@cache
def _adapter() -> Any:
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    return OpenLineageAdapter()


def _task_events_emitted(dag_id: str, task_id: str) -> bool:
    """``[openlineage] emission_policy`` for the stage task (configuration rules: DAG, task, operator, global)."""
    try:
        from airflow.providers.openlineage.utils.emission_policy import resolve_task_emission_policy
    except ImportError:  # a provider without emission policies emits every task's events
        return True
    operator = type("SparkStageOperator", (), {"__module__": STAGE_OPERATOR.rsplit(".", 1)[0]})()
    return bool(resolve_task_emission_policy(operator, dag_id, task_id).emit)


def openlineage_spark_conf(plan: StagePlan) -> dict[str, str]:
    """The ``spark.openlineage.*`` properties for this stage run's attempts; empty when none are asked for."""
    adapter = openlineage_adapter(plan)
    if adapter is None:  # no events for this task: no parent that would never report
        return {}
    from airflow.providers.openlineage import conf as ol_conf

    props: dict[str, Any] = {}
    if ol_conf.spark_inject_parent_job_info():
        props.update(parent_job_properties(plan, ol_conf.namespace(), adapter))
    if ol_conf.spark_inject_transport_info():
        from airflow.providers.openlineage.utils.spark import inject_transport_information_into_spark_properties

        try:  # the provider's own reading of its transport (http only, as for spark-submit)
            props = inject_transport_information_into_spark_properties(props, None)  # type: ignore[arg-type]
        except Exception:  # a transport the provider cannot describe must not stop the stage
            log.warning("stage %s: OpenLineage transport not passed to Spark", plan["stage"], exc_info=True)
    return {str(k): str(v) for k, v in props.items()}


def parent_job_properties(plan: StagePlan, namespace: str, adapter: Any) -> dict[str, str]:
    """Parent (the task run) and root (the DAG run) of the attempts' Spark runs, with OpenLineage's run ids."""
    ids = task_run_ids(plan, namespace, adapter)
    if ids is None:
        return {}
    return {
        "spark.openlineage.parentJobNamespace": namespace,
        "spark.openlineage.parentJobName": ids.job_name,
        "spark.openlineage.parentRunId": ids.run_id,
        "spark.openlineage.rootParentJobNamespace": namespace,
        "spark.openlineage.rootParentJobName": ids.dag_id,
        "spark.openlineage.rootParentRunId": ids.dag_run_id,
    }
