"""A real deployment across hosts: the CeleryExecutor, Celery workers on two hosts, Spark Connect on three more.

The hosts are network namespaces on one bridge (tests/hosts.py): the root namespace (10.213.0.1) runs
the api-server, scheduler, dag-processor and triggerer on PostgreSQL, with Redis as the Celery broker
(its own DB number) and the result backend in the same PostgreSQL database; ``h1`` and ``h2`` each run
``airflow celery worker --queues default`` in their own network and UTS namespace (hostname
``sph-h1`` / ``sph-h2``); ``h3``, ``h4`` and ``h5`` each run one Spark Connect server, the targets of
the attempts. A worker reaches PostgreSQL and Redis through the root's bridge address (TCP forwarders)
and the api-server's Execution API on that address; the store is the shared filesystem.

The Q3 example (``dags/tpch_q3.py``, six stages) runs with ``start_in_triggerer = False``, so every
stage task is planned by a Celery worker before it defers to its controller in the triggerer (by
default stage tasks start in the triggerer and only the sink stage visits a worker). The run must
succeed, equal DuckDB's Q3, have its stage tasks executed on both worker hosts (the hostname a task
records is its process's UTS hostname, which only a worker on that host has) and its attempts on the
Spark hosts' addresses.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.devtools.localcluster import (
    LocalCluster,
    ServerInfo,
    connection_definitions,
    targets_json,
)
from tests import hosts, services
from tests.integration.airflow_cluster import (
    AIRFLOW,
    REPO,
    AirflowCluster,
    PostgresDatabase,
    tail,
    wait_until,
)
from tests.integration.q3 import duckdb_q3, q3_difference, read_q3_output

pytestmark = [pytest.mark.hosts, pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(900)]

TPCH = REPO / ".data" / "tpch"
DAG_ID = "tpch_q3"
STAGES = ("scan_customer", "scan_orders", "scan_lineitem", "join_orders", "join_lineitem", "top")
LOGICAL_DATE = "2026-01-01T00:00:00+00:00"
DS = "2026-01-01"
# A Redis DB of this test's own: flushed before and after, so no stale Celery message can reach its workers.
REDIS_DB = 7
WORKER_HOSTS = ("h1", "h2")
SPARK_HOSTS = ("h3", "h4", "h5")


class BridgeCluster(AirflowCluster):
    """The deployment with its api-server on the root's bridge address, where workers on other hosts reach it."""

    def __init__(self, root: Path, db_url: str, **kwargs: Any) -> None:
        super().__init__(root, db_url, **kwargs)
        self.base_url = f"http://{hosts.ROOT_ADDRESS}:{self.api_port}"
        self.env.update({
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__HOST": hosts.ROOT_ADDRESS,
            # A task's supervisor on a worker host reports to the Execution API: 127.0.0.1 there is the host itself.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
        })

    def _args(self, name: str) -> list[str]:
        if name == "api-server":
            return ["api-server", "--host", hosts.ROOT_ADDRESS, "--port", str(self.api_port), "--workers", "1"]
        return super()._args(name)


@dataclass
class CeleryWorker:
    """``airflow celery worker`` on one host, in a process group of its own, logging to a file."""

    host: hosts.Host
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def name(self) -> str:
        """The Celery node name (``--celery-hostname``; %h is the host's UTS hostname)."""
        return f"worker-{self.host.name}@{self.host.netns}"

    def ready(self) -> bool:
        """The worker connected to the broker and consumes (Celery logs ``<name> ready.``)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"celery worker on {self.host.name} exited {self.proc.returncode}:\n{tail(self.log)}")
        return self.log.exists() and f"{self.name} ready." in self.log.read_text(errors="replace")


def stop_workers(workers: list[CeleryWorker], grace: float = 20.0) -> None:
    """SIGTERM every worker at once (Celery's warm shutdown), SIGKILL each group still there after ``grace``."""
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=30)


def start_worker(host: hosts.Host, cluster: AirflowCluster, env: dict[str, str]) -> CeleryWorker:
    """A Celery worker on ``host`` serving the default queue, one task at a time."""
    log = cluster.logs / f"celery-worker-{host.name}.log"
    # Every worker shares AIRFLOW_HOME (a shared filesystem): its pid file must be its own.
    argv = [AIRFLOW, "celery", "worker", "--queues", "default", "--concurrency", "1",
            "--celery-hostname", f"worker-{host.name}@%h", "--pid", str(cluster.home / f"worker-{host.name}.pid"),
            "--skip-serve-logs", "--without-gossip"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(host.command(argv, own_hostname=True), env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cluster.home)
    return CeleryWorker(host, proc, log)


def _redis_flush() -> None:
    import redis

    redis.Redis(host="127.0.0.1", port=services.redis().port, db=REDIS_DB, socket_timeout=5).flushdb()


def _skip_reason() -> str | None:
    reason = hosts.unavailable_reason()
    if reason:
        return f"hosts tests need network namespaces: {reason}"
    if not all(sorted((TPCH / table).glob("*.parquet")) for table in ("customer", "orders", "lineitem")):
        return f"TPC-H customer, orders and lineitem missing under {TPCH}: run `make data-q3` first (`make test` does)"
    try:
        import airflow.providers.celery  # noqa: F401
    except ImportError:
        return "apache-airflow-providers-celery is not installed (pip install -e '.[test]')"
    return None


@dataclass
class Deployment:
    """What the test reads: the Airflow deployment, its database, the workers and the Spark servers."""

    cluster: BridgeCluster
    db: PostgresDatabase
    workers: list[CeleryWorker]
    servers: list[ServerInfo]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Five hosts, three Spark Connect servers, Airflow with the CeleryExecutor and two workers; all torn down."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        network = stack.enter_context(hosts.HostNetwork(len(WORKER_HOSTS) + len(SPARK_HOSTS)))
        # Workers dial the root's services on the bridge address (127.0.0.1 inside a host is the host).
        pg_server, redis_server = services.postgres(), services.redis()
        stack.enter_context(network.forward(redis_server.port))
        stack.enter_context(network.forward(pg_server.port))

        # The servers' addresses and ports are known before they run (one per host, the same ports on each):
        # Airflow's targets are defined from them, and the JVMs start while Airflow starts.
        spark_dir = tmp_path / "spark"
        spark_hosts = [network[name] for name in SPARK_HOSTS]
        planned = [ServerInfo(name=h.name, port=15002, ui_port=4040, master="local[1]", host=h.address)
                   for h in spark_hosts]
        started: dict[str, Any] = {}

        def start_spark() -> None:
            try:
                # No warm-up rounds: on 2 cores three servers warming up at once took 80-150 s, more than the
                # cold first attempts cost the run.
                started["servers"] = hosts.start_connect_servers(network, spark_dir, hosts=spark_hosts,
                                                                 warm_up=False)
            except BaseException as exc:  # re-raised by the fixture
                started["error"] = exc

        spark_thread = threading.Thread(target=start_spark, name="spark-servers", daemon=True)
        spark_thread.start()
        # Stop whatever did start (the pid files record it), also if starting failed half-way.
        stack.callback(lambda: LocalCluster(spark_dir).stop() if spark_dir.exists() else None)
        stack.callback(spark_thread.join, 300)

        _redis_flush()
        stack.callback(_redis_flush)
        db = PostgresDatabase()
        db.create_migrated()
        stack.callback(db.drop)
        # Workers dial PostgreSQL on the bridge address (the forwarder); the root components use loopback.
        bridge_db = f"{pg_server.user}@{hosts.ROOT_ADDRESS}:{pg_server.port}/{db.name}"
        runtime = tmp_path / "rt"
        runtime.mkdir(mode=0o700)
        extra = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": redis_server.url(REDIS_DB, host=hosts.ROOT_ADDRESS),
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql://{bridge_db}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            # Stage tasks are planned on the workers (the default starts them in the triggerer: no worker run).
            "AIRFLOW__SPECULATIVE__START_IN_TRIGGERER": "False",
            "SPECULATIVE_EXAMPLE_TPCH": str(TPCH),
            # This checkout's package and tests, whatever the venv's editable install points at.
            "PYTHONPATH": str(REPO),
            # The run's own fork servers (warm attempt starts), stopped with it.
            "XDG_RUNTIME_DIR": str(runtime),
        }
        extra.update(connection_definitions(planned))
        extra["AIRFLOW__SPECULATIVE__TARGETS"] = targets_json(planned)
        cluster = BridgeCluster(tmp_path, db.url, dags_folder=REPO / "dags", data=TPCH / "lineitem", extra_env=extra)
        stack.callback(_stop_fork_servers, runtime)
        stack.callback(cluster.shutdown)
        cluster.start_all()
        worker_env = {**cluster.env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{bridge_db}"}
        workers: list[CeleryWorker] = []
        stack.callback(stop_workers, workers)
        for name in WORKER_HOSTS:
            workers.append(start_worker(network[name], cluster, worker_env))
        cluster.wait_healthy()
        for worker in workers:
            wait_until(worker.ready, 180, f"the Celery worker on {worker.host.name} to be ready", interval=1,
                       on_timeout=functools.partial(tail, worker.log))
        spark_thread.join(timeout=300)
        if "error" in started:
            raise started["error"]
        servers: list[ServerInfo] = started["servers"]
        assert [(s.host, s.port) for s in servers] == [(s.host, s.port) for s in planned], servers
        yield Deployment(cluster, db, workers, servers)


def _stop_fork_servers(runtime: Path) -> None:
    from airflow_provider_speculative.backends import forkserver

    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        forkserver.stop_servers()
    finally:
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved


def _task_instances(db: PostgresDatabase, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's task instances as the metadata DB records them (hostname: where the task process ran)."""
    import psycopg2

    with contextlib.closing(psycopg2.connect(db.dsn, connect_timeout=5)) as conn, conn.cursor() as cur:
        cur.execute("SELECT task_id, state, hostname, queue, try_number FROM task_instance "
                    "WHERE dag_id = %s AND run_id = %s", (DAG_ID, run_id))
        return {row[0]: dict(zip(("task_id", "state", "hostname", "queue", "try_number"), row, strict=True))
                for row in cur.fetchall()}


def test_q3_example_runs_with_celery_workers_on_two_hosts_and_spark_on_three(deployment: Deployment,
                                                                              tmp_path: Path) -> None:
    try:
        run_and_check(deployment, tmp_path)
    except BaseException:  # also pytest-timeout's failure: print what makes it diagnosable
        print(f"\n{deployment.cluster.diagnostics()}")
        for worker in deployment.workers:
            print(f"===== {worker.log.name}\n{tail(worker.log, 80)}")
        raise


def run_and_check(deployment: Deployment, tmp_path: Path) -> None:
    """Trigger the Q3 example, wait for its run; check the result, where its tasks and attempts ran."""
    cluster = deployment.cluster
    cluster.wait_dag(DAG_ID)
    cluster.unpause(DAG_ID)
    run_id = cluster.trigger(DAG_ID, LOGICAL_DATE)

    def finished() -> dict[str, Any] | None:
        cluster.check_alive()
        for worker in deployment.workers:
            worker.ready()  # fails at once if a worker died
        run = cluster.dag_runs(DAG_ID)[run_id]
        return run if run["state"] in ("success", "failed") else None

    final = wait_until(finished, 600, f"run {run_id} of {DAG_ID} to finish", interval=1)
    assert final["state"] == "success", f"{DAG_ID} run {run_id} is {final['state']}"

    problem = q3_difference(read_q3_output(tmp_path / "output" / DAG_ID / DS), duckdb_q3(TPCH))
    assert problem is None, problem

    # Every stage task ran on a Celery worker host: the hostname it recorded is that host's UTS name.
    tis = _task_instances(deployment.db, run_id)
    assert sorted(tis) == sorted(STAGES), tis
    worker_hostnames = {w.host.netns for w in deployment.workers}
    assert all(ti["state"] == "success" and ti["queue"] == "default" for ti in tis.values()), tis
    assert {ti["hostname"] for ti in tis.values()} == worker_hostnames, tis
    # ... executed by the Celery worker of that host: its log names the task's workload (by its log path).
    for worker in deployment.workers:
        executed = worker.log.read_text(errors="replace")
        for task_id in (t for t, ti in tis.items() if ti["hostname"] == worker.host.netns):
            assert "Executing workload in Celery: " in executed and f"run_id={run_id}/task_id={task_id}/" in executed, (
                f"{task_id} recorded host {worker.host.netns}, but its worker did not execute it:\n{tail(worker.log)}")

    # Every attempt ran on a Spark host (its node is the server's address), never in the root namespace.
    spark_addresses = {s.host for s in deployment.servers}
    report = run_report(cluster.store, DAG_ID, run_id)
    assert [s["stage"] for s in report["stages"]] and {s["stage"] for s in report["stages"]} == set(STAGES)
    nodes = {a["node"] for stage in report["stages"] for sub in stage["subtasks"] for a in sub["attempts"]}
    assert nodes <= spark_addresses and len(nodes) >= 2, (nodes, spark_addresses)
    for stage in report["stages"]:
        assert stage["committed"], f"stage {stage['stage']} not committed"
    print(f"\n{DAG_ID} on Celery: tasks by host {json.dumps({t: ti['hostname'] for t, ti in sorted(tis.items())})}; "
          f"attempt nodes {sorted(nodes)}")
