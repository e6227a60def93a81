"""OpenLineage properties for the attempts' Spark sessions, as the apache-spark provider injects them.

With Airflow's OpenLineage provider installed and enabled, ``[openlineage] spark_inject_parent_job_info``
adds the parent job (the stage's Airflow task run and its DAG run as root), so the OpenLineage Spark
integration nests each attempt's Spark run under the task; ``spark_inject_transport_info`` adds the
transport, so Spark sends its events where Airflow does. Both options are the provider's own and off by
default. The properties reach an attempt through its environment (``core.contract.EXTRA_CONF_ENV``),
never through plan.json: a transport may carry an API key.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from airflow_provider_speculative.core.plan import StagePlan

log = logging.getLogger(__name__)


def openlineage_spark_conf(plan: StagePlan) -> dict[str, str]:
    """The ``spark.openlineage.*`` properties for this stage run's attempts; empty when none are asked for."""
    try:
        from airflow.providers.openlineage import conf as ol_conf
        from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter
    except ImportError:  # the optional extra is not installed
        return {}
    if ol_conf.is_disabled():
        return {}
    props: dict[str, Any] = {}
    if ol_conf.spark_inject_parent_job_info():
        props.update(parent_job_properties(plan, ol_conf.namespace(), OpenLineageAdapter))
    if ol_conf.spark_inject_transport_info():
        from airflow.providers.openlineage.utils.spark import inject_transport_information_into_spark_properties

        try:  # the provider's own reading of its transport (http only, as for spark-submit)
            props = inject_transport_information_into_spark_properties(props, None)  # type: ignore[arg-type]
        except Exception:  # a transport the provider cannot describe must not stop the stage
            log.warning("stage %s: OpenLineage transport not passed to Spark", plan["stage"], exc_info=True)
    return {str(k): str(v) for k, v in props.items()}


def parent_job_properties(plan: StagePlan, namespace: str, adapter: Any) -> dict[str, str]:
    """Parent (the task run) and root (the DAG run) of the attempts' Spark runs, with OpenLineage's run ids."""
    task_id = plan.get("task_id")
    when = plan.get("logical_date") or plan.get("run_after")
    if not task_id or not when:  # a plan from before these were recorded: no parent to name
        return {}
    moment = datetime.fromisoformat(str(when))
    return {
        "spark.openlineage.parentJobNamespace": namespace,
        "spark.openlineage.parentJobName": f"{plan['dag_id']}.{task_id}",
        "spark.openlineage.parentRunId": str(adapter.build_task_instance_run_id(
            dag_id=plan["dag_id"], task_id=task_id, try_number=plan.get("try_number", 1), logical_date=moment,
            map_index=-1)),
        "spark.openlineage.rootParentJobNamespace": namespace,
        "spark.openlineage.rootParentJobName": plan["dag_id"],
        "spark.openlineage.rootParentRunId": str(adapter.build_dag_run_id(
            dag_id=plan["dag_id"], logical_date=moment, clear_number=plan.get("clear_number", 0))),
    }
