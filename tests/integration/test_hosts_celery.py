"""A real deployment across hosts: the CeleryExecutor, Celery workers on two hosts, Spark Connect on three more.

The hosts are network namespaces on one bridge (tests/hosts.py): the root namespace (10.213.0.1) runs
the api-server, scheduler, dag-processor and triggerer on PostgreSQL, with Redis as the Celery broker
(its own DB number) and the result backend in the same PostgreSQL database; ``h1`` and ``h2`` each run
``airflow celery worker --queues default`` in their own network and UTS namespace (hostname
``sph-h1`` / ``sph-h2``); ``h3``, ``h4`` and ``h5`` each run one Spark Connect server, the targets of
the attempts. A worker reaches PostgreSQL and Redis through the root's bridge address (TCP forwarders)
and the api-server's Execution API on that address; the store is the shared filesystem.

The Q3 example (``dags/tpch_q3.py``, six stages) runs on the default path: stage tasks start in the
triggerer, and only the sink stage ``top`` visits a worker. The triggerer runs on a host of its own,
``h6``; while ``scan_lineitem`` runs, with subtask 0's first attempt held (fault injection, on ``h6``
only), the test kills ``h6`` (every process on it at once, as a lost machine) and starts a triggerer on
``h7``. Airflow gives the dead triggerer's triggers to the new one once its heartbeat is older than the
health-check threshold; the controller there reattaches from the store. The run must succeed, equal
DuckDB's Q3, commit each subtask once, relaunch only the attempts lost with ``h6`` (from ``h7``), run
``top`` on a worker host (the hostname a task records is its process's UTS hostname, which only a
worker on that host has) and every attempt on the Spark hosts' addresses.
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
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.devtools.faults import fault_env
from airflow_provider_speculative.devtools.localcluster import (
    LocalCluster,
    ServerInfo,
    connection_definitions,
    targets_json,
)
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests import hosts, services
from tests.integration.airflow_cluster import (
    AIRFLOW,
    COMPONENTS,
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
# The triggerer runs on the first; the test kills that host and starts a triggerer on the second.
TRIGGERER_HOSTS = ("h6", "h7")
HELD_STAGE = "scan_lineitem"
# Long enough that only the kill ends the held attempt; the test never waits for it.
HOLD_SECONDS = 600


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


@dataclass
class HostTriggerer:
    """``airflow triggerer`` on one host (its own network and UTS namespace), logging to a file."""

    host: hosts.Host
    proc: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        """Fail at once, with its log, if the triggerer exited."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the triggerer on {self.host.name} exited {self.proc.returncode}:\n{tail(self.log)}")


def start_triggerer(host: hosts.Host, cluster: AirflowCluster, env: dict[str, str],
                    runtime: Path) -> HostTriggerer:
    """A triggerer on ``host`` with fork servers of its own (``runtime``): its attempts run on that host."""
    runtime.mkdir(mode=0o700, exist_ok=True)
    log = cluster.logs / f"triggerer-{host.name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(host.command([AIRFLOW, "triggerer"], own_hostname=True),
                                env={**env, "XDG_RUNTIME_DIR": str(runtime)}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cluster.home)
    return HostTriggerer(host, proc, log)


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
    network: hosts.HostNetwork
    # Starts the triggerer on a host (the fault rules only on the first).
    start_triggerer: Any
    triggerers: list[HostTriggerer]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Seven hosts: two Celery workers, three Spark Connect servers, two triggerer hosts; all torn down."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        network = stack.enter_context(hosts.HostNetwork(len(WORKER_HOSTS) + len(SPARK_HOSTS) + len(TRIGGERER_HOSTS)))
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
            # The triggerer on h7 takes over the dead one's triggers once its heartbeat is this old (s).
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
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
        for component in COMPONENTS:
            if component != "triggerer":  # it runs on a host of its own
                cluster.start(component)
        worker_env = {**cluster.env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{bridge_db}"}
        workers: list[CeleryWorker] = []
        stack.callback(stop_workers, workers)
        for name in WORKER_HOSTS:
            workers.append(start_worker(network[name], cluster, worker_env))
        triggerers: list[HostTriggerer] = []
        held = {f"{DAG_ID}/{HELD_STAGE}": {"attempts": [{"subtask": 0, "attempt": 0, "delay": HOLD_SECONDS}]}}

        def start_triggerer_on(name: str) -> HostTriggerer:
            faults = fault_env(held) if name == TRIGGERER_HOSTS[0] else {}
            triggerer = start_triggerer(network[name], cluster, {**worker_env, **faults}, runtime / name)
            triggerers.append(triggerer)
            stack.callback(_stop_fork_servers, runtime / name)
            return triggerer

        stack.callback(lambda: [network.kill(t.host) for t in triggerers])
        start_triggerer_on(TRIGGERER_HOSTS[0])
        cluster.wait_healthy()
        for worker in workers:
            wait_until(worker.ready, 180, f"the Celery worker on {worker.host.name} to be ready", interval=1,
                       on_timeout=functools.partial(tail, worker.log))
        spark_thread.join(timeout=300)
        if "error" in started:
            raise started["error"]
        servers: list[ServerInfo] = started["servers"]
        assert [(s.host, s.port) for s in servers] == [(s.host, s.port) for s in planned], servers
        yield Deployment(cluster, db, workers, servers, network, start_triggerer_on, triggerers)


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


def test_q3_on_celery_hosts_survives_its_triggerer_host_killed_mid_stage(deployment: Deployment,
                                                                         tmp_path: Path) -> None:
    try:
        run_and_check(deployment, tmp_path)
    except BaseException:  # also pytest-timeout's failure: print what makes it diagnosable
        print(f"\n{deployment.cluster.diagnostics()}")
        for process in [*deployment.workers, *deployment.triggerers]:
            print(f"===== {process.log.name}\n{tail(process.log, 80)}")
        raise


def run_and_check(deployment: Deployment, tmp_path: Path) -> None:
    """Trigger Q3, kill the triggerer's host mid-stage, start one on another host; check the whole outcome."""
    cluster = deployment.cluster
    first_host, second_host = (deployment.network[name] for name in TRIGGERER_HOSTS)
    cluster.wait_dag(DAG_ID)
    cluster.unpause(DAG_ID)
    run_id = cluster.trigger(DAG_ID, LOGICAL_DATE)
    layouts = {stage: StageLayout(cluster.store, DAG_ID, run_id, stage) for stage in STAGES}
    held = layouts[HELD_STAGE]

    def alive() -> None:
        cluster.check_alive()
        for worker in deployment.workers:
            worker.ready()  # fails at once if a worker died
        deployment.triggerers[-1].check_alive()

    def holding() -> bool:
        alive()
        if cluster.dag_runs(DAG_ID)[run_id]["state"] in ("success", "failed"):
            raise AssertionError(f"run {run_id} ended before {HELD_STAGE}'s held attempt ran")
        log = held.log(0, 0)
        return log.exists() and "fault injection: slowing" in log.read_text(errors="replace")

    wait_until(holding, 300, f"{HELD_STAGE} subtask 0's first attempt to be held on {first_host.name}",
               interval=0.2)
    # What each stage had launched and admitted when the triggerer's machine was lost.
    admitted_before = {stage: {s for s in range(_parallelism(layout)) if layout.admitted(s).exists()}
                       for stage, layout in layouts.items() if layout.plan.exists()}
    deployment.network.kill(first_host)  # the triggerer, its trigger runner, attempts and fork servers
    assert deployment.triggerers[0].proc.wait(timeout=30) != 0
    launched_before = {stage: _launches(layouts[stage]) for stage in admitted_before}
    deployment.start_triggerer(second_host.name)

    def finished() -> dict[str, Any] | None:
        alive()
        run = cluster.dag_runs(DAG_ID)[run_id]
        return run if run["state"] in ("success", "failed") else None

    final = wait_until(finished, 600, f"run {run_id} of {DAG_ID} to finish", interval=1)
    assert final["state"] == "success", f"{DAG_ID} run {run_id} is {final['state']}"

    problem = q3_difference(read_q3_output(tmp_path / "output" / DAG_ID / DS), duckdb_q3(TPCH))
    assert problem is None, problem

    # The held attempt was lost with h6; its replacement was launched and admitted from h7.
    assert read_json(held.status(0, 0))["host"] == first_host.netns
    winner = read_json(held.admitted(0))["attempt"]
    assert winner > 0 and read_json(held.status(0, winner))["host"] == second_host.netns, winner
    restored = [e for e in read_jsonl(held.journal) if e.get("event") == Event.RESTORED]
    assert restored, f"{HELD_STAGE}'s controller on {second_host.name} did not restore from the store"
    for stage, layout in layouts.items():
        committed = read_json(layout.committed)
        assert committed is not None, f"{stage} has no committed.json"
        for subtask, part in committed["subtasks"].items():
            with_output = [a for a in layout.attempt_numbers(int(subtask)) if layout.manifest(int(subtask), a).exists()]
            assert with_output == [part["attempt"]], (stage, subtask, with_output, part)
        # Reattached, not restarted: nothing admitted before the loss was launched again after it.
        if stage in admitted_before:
            again = [k for k in _launches(layout) if k not in launched_before[stage] and k[0] in admitted_before[stage]]
            assert not again, (stage, again)
    assert hosts.namespace_pids(first_host.netns) == []

    # Stage tasks started in the triggerer; only the sink stage `top` visited a worker, on a worker host.
    tis = _task_instances(deployment.db, run_id)
    assert sorted(tis) == sorted(STAGES), tis
    assert all(ti["state"] == "success" for ti in tis.values()), tis
    worker_hostnames = {w.host.netns for w in deployment.workers}
    assert tis["top"]["hostname"] in worker_hostnames, tis
    executed = "".join(w.log.read_text(errors="replace") for w in deployment.workers)
    assert f"run_id={run_id}/task_id=top/" in executed, "no Celery worker executed top"
    for task_id in STAGES[:-1]:
        assert f"run_id={run_id}/task_id={task_id}/" not in executed, f"{task_id} visited a worker"

    # Every attempt ran on a Spark host (its node is the server's address), never in the root namespace.
    spark_addresses = {s.host for s in deployment.servers}
    report = run_report(cluster.store, DAG_ID, run_id)
    assert {s["stage"] for s in report["stages"]} == set(STAGES)
    nodes = {a["node"] for stage in report["stages"] for sub in stage["subtasks"] for a in sub["attempts"]}
    assert nodes <= spark_addresses and len(nodes) >= 2, (nodes, spark_addresses)
    print(f"\n{DAG_ID} on Celery, triggerer {first_host.name} killed, {second_host.name} took over: "
          f"tasks by host {json.dumps({t: ti['hostname'] for t, ti in sorted(tis.items())})}; "
          f"attempt nodes {sorted(nodes)}; {HELD_STAGE} subtask 0 admitted attempt {winner}")


def _parallelism(layout: StageLayout) -> int:
    """The planned stage's subtask count."""
    return int(read_json(layout.plan)["parallelism"])


def _launches(layout: StageLayout) -> set[tuple[int, int]]:
    """(subtask, attempt) of every launch the stage's journal records."""
    if not layout.journal.exists():
        return set()
    return {(e["subtask"], e["attempt"]) for e in read_jsonl(layout.journal) if e.get("event") == Event.LAUNCH}
