"""Test DAGs of ``test_e2e_recovery.py``: the example's Q1 applications, small (2 scan subtasks, 1 aggregate).

- ``e2e_q1``: ``@daily`` from 2026-01-01 (no catchup, up to 3 active runs) for backfills, and
  ``e2e_q1_worker``, triggered by hand: both on the suite's Spark Connect servers; every other DAG runs
  one spark-submit per attempt.
- ``e2e_q1_barrier``: the same pipeline, triggered by hand, whose scan attempts are held by fault injection
  (``barrier``, set by the test: ``tests/integration/dag_faults.py``, ``E2E_Q1``; a scan attempt that
  computed its output waits, heartbeat phase ``BARRIER``, before writing its manifest until
  ``<stage dir>/barrier.release.<subtask>`` exists), so that a test can kill Airflow components while scan
  attempts (their Spark drivers) are running, for as long as it needs, and then let them finish.

Every stage task retries once, 5 s after a failure. ``e2e_q1`` is the default path (stages start and commit
in the triggerer). In ``e2e_q1_worker`` both stages finalize on a worker
(``commit_in_triggerer=False``), and every stage task runs
:func:`hold_before_finalize` first: a test can ask it (through control files) to stop a task after its
stage controller decided the stage, just before finalize, so that the worker process executing the task
can be killed at a known point. In ``e2e_q1_barrier`` both stages start in the triggerer and are committed there
(the default), so killing the triggerer mid-stage tests that path's restart. ``e2e_q1_commit``
(fault injection ``hold_commit``) holds that trigger after it wrote ``committed.json`` and before its
event ends the task (``<stage dir>/commit.held``, until ``commit.release`` exists): the triggerer can be
killed between the two.
``e2e_q1_publish`` records its sink's asset event through the api-server and holds its aggregate's trigger
after that, before its event (the same control files), so the triggerer can be killed there.
``e2e_q1_eager`` is the default pipeline with its scan's source path and arguments templated (cleared with
its downstream by a test), and
``e2e_q1_broken`` one whose scan fails at plan (a missing application), so its waiting aggregate fails.
Paths come from ``SPECULATIVE_EXAMPLE_DATA``, ``SPECULATIVE_EXAMPLE_OUTPUT`` and ``SPECULATIVE_E2E_CONTROL``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source
from airflow_provider_speculative.store.layout import StageLayout

APPS = Path(__file__).resolve().parents[3] / "dags" / "apps"
HOLD_TIMEOUT = 900.0


def hold_before_finalize(context: Any) -> None:
    """Pause a stage task that resumes from its controller's event until the test releases it.

    Active only when ``$SPECULATIVE_E2E_CONTROL/hold.<dag_id>.<task_id>.<ds>`` exists, only when the stage's
    journal already says ``stage_complete`` (the task resumes for finalize, it does not plan), and only once:
    ``held.<...>`` records this process (pid, try number); the task then waits until the hold file is removed.
    """
    control = os.environ.get("SPECULATIVE_E2E_CONTROL")
    if not control:
        return
    ti = context["ti"]
    name = f"{ti.dag_id}.{ti.task_id}.{context['ds']}"
    hold, held = Path(control) / f"hold.{name}", Path(control) / f"held.{name}"
    if not hold.exists() or held.exists():
        return
    layout = StageLayout(Path(os.environ["AIRFLOW__SPECULATIVE__STORE_PATH"]), ti.dag_id, context["run_id"],
                         ti.task_id)
    try:
        events = [json.loads(line).get("event") for line in layout.journal.read_text().splitlines() if line]
    except OSError:
        return
    if "stage_complete" not in events:
        return
    tmp = held.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "try_number": ti.try_number,
                               "at": time.time()}))
    tmp.rename(held)
    deadline = time.monotonic() + HOLD_TIMEOUT
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def q1_dag(dag_id: str, *, schedule: str | None, scan_config: dict[str, Any] | None = None,
           commit_in_triggerer: bool = True, scan_application: str = "q1_scan.py", templated: bool = False,
           aggregate_config: dict[str, Any] | None = None, connect: bool = False) -> DAG:
    """The 2-stage Q1 pipeline as DAG ``dag_id``, sink ``$SPECULATIVE_EXAMPLE_OUTPUT/<dag_id>/<ds>``.

    ``templated``: the scan's source path comes from a DAG param and its application arguments name the run
    (``{{ params.lineitem }}``, ``{{ run_id }}``): Airflow's triggerer renders them for a stage started there.
    ``connect``: attempts run on the suite's Spark Connect servers (``$SPECULATIVE_E2E_CONNECT_TARGETS``)
    instead of one spark-submit each.
    """
    pipeline_config: dict[str, Any] = {"check_interval": "500ms"}
    if connect:
        pipeline_config["targets"] = json.loads(os.environ["SPECULATIVE_E2E_CONNECT_TARGETS"])
    default_args = {"retries": 1, "retry_delay": timedelta(seconds=5)}
    with DAG(dag_id=dag_id, schedule=schedule, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
             max_active_runs=3, default_args=default_args, tags=["speculative", "e2e"],
             params={"lineitem": os.environ["SPECULATIVE_EXAMPLE_DATA"]}) as dag, \
            Pipeline(dag_id, config=pipeline_config,
                          spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
        source = "{{ params.lineitem }}" if templated else os.environ["SPECULATIVE_EXAMPLE_DATA"]
        scan = pipeline.stage("scan", application=str(APPS / scan_application), parallelism=2,
                              inputs={"lineitem": parquet_source(source)},
                              application_args=["--run", "{{ run_id }}"] if templated else (),
                              config=scan_config, pre_execute=hold_before_finalize,
                              commit_in_triggerer=commit_in_triggerer)
        pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                       inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
                       sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + f"/{dag_id}/{{{{ ds }}}}"),
                       config=aggregate_config, pre_execute=hold_before_finalize,
                       commit_in_triggerer=commit_in_triggerer)
    return dag


# On Connect: their tests (a backfill, a killed worker before finalize) are about Airflow, not the Spark driver.
e2e_q1 = q1_dag("e2e_q1", schedule="@daily", connect=True)
e2e_q1_worker = q1_dag("e2e_q1_worker", schedule=None, commit_in_triggerer=False, connect=True)
# Fault injection (dag_faults.E2E_Q1) holds e2e_q1_barrier's scan attempts and e2e_q1_commit's scan trigger.
e2e_q1_barrier = q1_dag("e2e_q1_barrier", schedule=None)
e2e_q1_commit = q1_dag("e2e_q1_commit", schedule=None)
# Its sink stage records the asset event through the api-server (connection e2e_asset_api, added by the test)
# and holds after that (dag_faults.E2E_Q1), before the event that ends the task.
e2e_q1_publish = q1_dag("e2e_q1_publish", schedule=None, aggregate_config={"asset_events_conn_id": "e2e_asset_api"})
e2e_q1_eager = q1_dag("e2e_q1_eager", schedule=None, templated=True)
# Its scan cannot plan (the application does not exist): the aggregate, waiting in the triggerer, must fail.
e2e_q1_broken = q1_dag("e2e_q1_broken", schedule=None, scan_application="no_such_scan.py")
# test_e2e_s3.py's deployment, whose store is on S3, holds its scan attempts at the barrier.
e2e_q1_s3 = q1_dag("e2e_q1_s3", schedule=None, connect=True)
