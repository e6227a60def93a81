"""kill -9 of the triggerer mid-stage with the store on S3, through a real Airflow deployment (issue 41, item 4).

A deployment of its own (PostgreSQL + LocalExecutor, api-server, scheduler, dag-processor, triggerer) with
``store_path = s3://…`` on the suite's S3 endpoint runs ``e2e_q1_s3`` (tests/integration/e2e_dags/e2e_q1.py,
on the suite's Connect servers). Its scan attempts are held at the fault-injection barrier (an object of the
store they poll by name) while the triggerer, with every process of its group, is killed and started again.
The restarted triggerer must rebuild the scan's controller from the objects alone and reconnect to both
running attempts; the run then succeeds with one attempt per subtask and DuckDB's Q1.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.devtools.faults import fault_env
from airflow_provider_speculative.devtools.localcluster import connection_definitions, targets_json
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.roots import forget_stores, open_store
from tests import services
from tests.integration.airflow_cluster import (
    LINEITEM,
    AirflowCluster,
    PostgresDatabase,
    describe,
    kill_leftovers,
    processes_mentioning,
    wait_until,
)
from tests.integration.connect_runner import ConnectPool
from tests.integration.q1 import assert_q1_equal, duckdb_q1, output_decimal_scales, read_q1_output
from tests.processes import group_processes

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(1800)]

HERE = Path(__file__).resolve().parent
DAG = "e2e_q1_s3"
SCANS = 2
BUCKET = "speculative-e2e"
RUN_TIMEOUT = 900


@pytest.fixture(scope="module")
def s3_deployment(tmp_path_factory: pytest.TempPathFactory,
                  shared_connect_pool: ConnectPool) -> Iterator[tuple[AirflowCluster, StoreBackend, Path]]:
    """A deployment whose store is an S3 prefix; yields it, the store's backend and the source directory."""
    server = services.s3()
    server.create_bucket(BUCKET)
    root_url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    root = tmp_path_factory.mktemp("e2e-s3")
    data = root / "lineitem"
    data.mkdir()
    for part in sorted(LINEITEM.glob("lineitem.*.parquet"))[:SCANS]:
        (data / part.name).symlink_to(part)
    db = PostgresDatabase()
    db.create_migrated()
    cluster = AirflowCluster(root, db.url, dags_folder=HERE / "e2e_dags", data=data, extra_env={
        **server.environment(),
        "AIRFLOW__SPECULATIVE__STORE_PATH": root_url,
        "AIRFLOW__SPECULATIVE__EXPERIMENTAL_S3_STORE": "true",
        # The REST API hands out admin tokens without credentials (polling, triggering).
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
        "AIRFLOW__CORE__PARALLELISM": "8",
        # The scan attempts of e2e_q1_s3 wait at the barrier until the test writes their release objects.
        **fault_env({f"{DAG}/scan": {"barrier": True}}),
        **connection_definitions(list(shared_connect_pool.servers)),
        "SPECULATIVE_E2E_CONNECT_TARGETS": targets_json(list(shared_connect_pool.servers)),
    })
    with pytest.MonkeyPatch.context() as env:
        # This process reads the store with the same endpoint and keys as the deployment.
        for name, value in server.environment().items():
            env.setenv(name, value)
        forget_stores()
        try:
            cluster.start_all()
            cluster.wait_healthy()
            cluster.wait_dag(DAG)
            cluster.unpause(DAG)
            yield cluster, open_store(root_url), data
        except BaseException:
            print(f"\n{cluster.diagnostics()}")
            raise
        finally:
            cluster.shutdown()
            kill_leftovers(root_url)
            db.drop()
            forget_stores()


def read(store: StoreBackend, layout: StageLayout, path: Path) -> dict[str, Any]:
    """A JSON object of the stage run by name, or {} while it does not exist."""
    return store.read_json(layout.name(path)) or {}


def journal_events(layout: StageLayout, name: str) -> list[dict[str, Any]]:
    """The journal records called ``name``."""
    return [e for e in layout.store.read_journal(layout.name(layout.journal)) if e["event"] == name]


def test_kill_9_triggerer_mid_stage_with_the_store_on_s3(s3_deployment) -> None:
    cluster, store, data = s3_deployment
    ds = "2026-03-05"
    run_id = cluster.trigger(DAG, f"{ds}T00:00:00+00:00")
    scan = StageLayout.over(store, DAG, run_id, "scan")
    aggregate = StageLayout.over(store, DAG, run_id, "aggregate")

    def held() -> dict[int, dict[str, Any]] | None:
        cluster.check_alive()
        found = {}
        for subtask in range(SCANS):
            status = read(store, scan, scan.status(subtask, 0))
            assert status.get("state") not in ("FINISHED", "FAILED", "CANCELED"), f"scan {subtask}/0: {status}"
            if read(store, scan, scan.heartbeat(subtask, 0)).get("phase") != "BARRIER" or not status.get("pgid"):
                return None
            found[subtask] = status
        return found

    attempts = wait_until(held, RUN_TIMEOUT, "both scan attempts to wait at the barrier", interval=1)
    wait_until(lambda: read(store, aggregate, aggregate.dir / "task.json").get("state") == "waiting", 120,
               "the aggregate to wait in the triggerer for the scan's commit", interval=0.5)

    killed_at, since = time.time(), datetime.now(UTC)
    victims = cluster.kill("triggerer")
    print("\nkill -9 triggerer (process group):\n" + "\n".join(victims))
    assert victims, "no triggerer process was killed"
    for subtask, status in attempts.items():
        assert group_processes(status["pgid"]), f"scan attempt {subtask}/0 died with the triggerer"
    cluster.start("triggerer")
    cluster.wait_component_restarted("triggerer", since)
    restored = wait_until(lambda: [e for e in journal_events(scan, "restored") if e["at"] > killed_at], 300,
                          "the restarted triggerer to restore the scan controller from the store", interval=1)
    assert restored[0]["attempts"] == SCANS and restored[0]["admitted"] == {}, restored
    for subtask in range(SCANS):
        store.replace(scan.name(scan.barrier_release(subtask)), b"go")

    final = cluster.wait_runs_finished(DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']}\n{cluster.diagnostics()}"
    for layout, parallelism in ((scan, SCANS), (aggregate, 1)):
        for subtask in range(parallelism):
            assert layout.attempt_numbers(subtask) == [0], f"{layout.stage} {subtask}: attempts relaunched"
            assert read(store, layout, layout.status(subtask, 0)).get("state") == "FINISHED"
        committed = read(store, layout, layout.committed)
        assert {k: v["attempt"] for k, v in committed["subtasks"].items()} == {str(s): 0 for s in range(parallelism)}
    for subtask in range(SCANS):
        assert read(store, scan, scan.status(subtask, 0))["end_at"] > killed_at
    assert [e.get("by") for e in journal_events(scan, "finalize_done")] == ["triggerer"]
    assert cluster.task_instances(DAG, run_id)["scan"]["try_number"] == 1
    output = cluster.output / DAG / ds
    assert_q1_equal(read_q1_output(output), duckdb_q1(data), scales=output_decimal_scales(output))
    left = processes_mentioning(store.url + "/" + DAG)
    assert not left, describe(left)
