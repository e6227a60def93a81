"""Lost hosts and partitions with real hosts: Spark Connect servers in network namespaces (tests/hosts.py).

Three hosts: ``h1`` (10.213.0.11) and ``h2`` (10.213.0.12) each run one Spark Connect server bound to
its own address; ``h3`` runs no Spark. Unless a test says otherwise the controller and
the attempts' Connect clients run in the root namespace (10.213.0.1); the store is the shared
filesystem. TPC-H Q1 (scan, 4 subtasks, then aggregate) runs through the controller without Airflow
(connect_runner.py) while the test takes ``h1`` away: its
network namespace killed, or its link down and up again. The scan's attempts on ``h1`` are held
after writing their output (fault injection: the work is done on the node, the node is lost before
the attempt reports it), so the fault hits them mid-attempt whatever the machine's speed.
Another puts ``h2`` behind a slow, lossy link (300 ms, 5 %: netem, or tests/linkshaper.py where the
kernel has no netem). (A real Airflow triggerer killed on one host and started on another is
test_hosts_celery.py's.) Outcomes are asserted on the store (journal, summary, committed.json)
and against DuckDB; the module takes ~3 minutes (one set of hosts, servers started once).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.devtools.localcluster import LocalCluster, ServerInfo
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, parquet_source
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests import hosts, services
from tests.integration.connect_runner import ConnectPool, committed_table, run_pipeline
from tests.integration.q1 import assert_q1_equal, duckdb_q1
from tests.processes import processes_mentioning, wait_for

pytestmark = [pytest.mark.hosts, pytest.mark.spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
APPS = REPO / "dags" / "apps"
SCAN_PARALLELISM = 4
# Long enough that an attempt held on h1 is still held when the fault comes; it never runs out.
HOLD_SECONDS = 600


class HostPool:
    """The module's hosts and their servers; :meth:`ready` restarts what a previous test took away."""

    def __init__(self, network: hosts.HostNetwork, directory: Path) -> None:
        self.network = network
        self.directory = directory
        self.servers: dict[str, ServerInfo] = {}
        # h1 and h2 run Spark; h3 runs none (a host that only reaches the root services).
        self.spark_hosts = network.hosts[:2]

    def ready(self) -> ConnectPool:
        """Every host reachable, unshaped, and h1/h2 running their servers: the pool of their targets."""
        for host in self.network.hosts:
            self.network.heal(host)
            self.network.unshape(host)
        for host in self.network.hosts[2:]:
            hosts.kill_namespace(host.netns)
        dead = [h for h in self.spark_hosts
                if h.name not in self.servers or LocalCluster.process(self.servers[h.name]) is None]
        if dead:
            for host in dead:
                hosts.kill_namespace(host.netns)  # the server's leftovers (Python workers)
            for info in hosts.start_connect_servers(self.network, self.directory, hosts=dead):
                self.servers[info.name] = info
        return ConnectPool(tuple(self.servers[h.name] for h in self.spark_hosts), slots=2)


@pytest.fixture(scope="module")
def host_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostPool]:
    """Four namespace hosts (two with a Connect server each), shared by the module's tests; always torn down."""
    reason = hosts.unavailable_reason()
    if reason:
        pytest.skip(f"hosts tests need network namespaces: {reason}")
    with hosts.HostNetwork(3) as network:
        pool = HostPool(network, tmp_path_factory.mktemp("host-servers"))
        yield pool
        LocalCluster(pool.directory).stop_servers(list(pool.servers.values()), grace=5)
    assert not any(line.startswith(hosts.PREFIX) for line in _ip_lines("netns", "list")), "namespaces left"


def _ip_lines(*args: str) -> list[str]:
    import subprocess

    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout.splitlines()


@pytest.fixture
def pool(host_pool: HostPool) -> ConnectPool:
    """The hosts' pool, every server up and every link healed."""
    return host_pool.ready()


def _q1_graph(data: Path, name: str, parallelism: int = SCAN_PARALLELISM, config: dict[str, Any] | None = None) -> Any:
    pipeline = Pipeline(name, config=config, spark_conf={"spark.sql.shuffle.partitions": "2"})
    scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=parallelism,
                          inputs={"lineitem": parquet_source(str(data))})
    pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                   inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])})
    return pipeline.graph()


def _claims(layout: StageLayout) -> list[tuple[int, int, dict[str, Any]]]:
    """(subtask, attempt, claim) of every attempt claimed so far."""
    found = []
    for subtask in range(SCAN_PARALLELISM):
        for attempt in layout.attempt_numbers(subtask):
            claim = read_json(layout.claim(subtask, attempt))
            if claim:
                found.append((subtask, attempt, claim))
    return found


def _held_on(layout: StageLayout, target: str) -> list[tuple[int, int]]:
    """Attempts on ``target`` that are running their injected hold (output written, not reported)."""
    held = []
    for subtask, attempt, claim in _claims(layout):
        log = layout.log(subtask, attempt)
        if claim.get("target") == target and log.exists() and "fault injection: slowing" in log.read_text(
                errors="replace"):
            held.append((subtask, attempt))
    return held


def _q1_of(root: Path, dag_id: str) -> dict[tuple[str, str], dict[str, float]]:
    rows = committed_table(root, dag_id, "run1", "aggregate").to_pylist()
    return {(r["l_returnflag"], r["l_linestatus"]): {k: float(v) for k, v in r.items()
                                                     if k not in ("l_returnflag", "l_linestatus")} for r in rows}


def _assert_one_output_per_subtask(layout: StageLayout) -> None:
    """committed.json names one attempt per subtask, and only that attempt's output is left in the store."""
    committed = read_json(layout.committed)
    assert committed is not None, f"no committed.json under {layout.dir}"
    assert sorted(int(s) for s in committed["subtasks"]) == list(range(SCAN_PARALLELISM))
    for subtask, part in committed["subtasks"].items():
        with_output = [a for a in layout.attempt_numbers(int(subtask)) if layout.manifest(int(subtask), a).exists()]
        assert with_output == [part["attempt"]], (subtask, with_output, part)


@contextlib.contextmanager
def _running(pool: ConnectPool, graph: Any, root: Path,
             faults: dict[str, dict[str, Any]]) -> Iterator[concurrent.futures.Future[None]]:
    """Run the pipeline in a thread, injecting ``faults``, while the body strikes; the body waits for the future."""
    with injected(faults), concurrent.futures.ThreadPoolExecutor(1) as executor:
        future = executor.submit(run_pipeline, pool, graph, root, "run1", 300, enabled=False,
                                 max_failures_per_stage=0)
        yield future
        future.result(timeout=360)


@contextlib.contextmanager
def _held_on_h1(pool: ConnectPool, tpch_data: Path, root: Path,
                dag_id: str) -> Iterator[tuple[concurrent.futures.Future[None], StageLayout, list[tuple[int, int]]]]:
    """Run the Q1 pipeline ``dag_id`` and yield (its future, the scan's layout, the attempts held on h1)."""
    layout = StageLayout(root, dag_id, "run1", "scan")
    # Attempts on h1 hold after writing their output: the fault lands while they run there.
    hold = {f"{dag_id}/scan": {"targets": {"h1": {"delay": HOLD_SECONDS}}}}
    with _running(pool, _q1_graph(tpch_data, dag_id), root, hold) as future:
        held = wait_for(lambda: _held_on(layout, "h1") or future.done(), 240, "an attempt held on h1")
        assert not future.done(), future.exception()
        yield future, layout, held


def _h1_attempts_counted_lost(layout: StageLayout, held: list[tuple[int, int]], root: Path) -> dict[str, Any]:
    """The held attempts were cancelled as lost with h1 and counted as lost; returns the scan's status report."""
    journal = read_jsonl(layout.journal)
    lost = [e for e in journal if e.get("event") == "cancel" and "target h1 lost" in (e.get("reason") or "")]
    assert {(e["subtask"], e["attempt"]) for e in lost} >= set(held), lost
    assert read_json(layout.summary)["target_lost_attempts"] >= len(held)
    return next(s for s in run_report(root, layout.dag_id, "run1")["stages"] if s["stage"] == "scan")


def _server_running_jobs(info: ServerInfo) -> list[dict[str, Any]]:
    url = f"http://{info.host}:{info.ui_port}/api/v1/applications/{info.app_id}/jobs?status=running"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _ping_redis_from(host: hosts.Host, address: str, port: int) -> str:
    """What Redis answers PING with, asked from ``host`` at ``address:port`` (or the error)."""
    probe = ("import socket\n"
             "try:\n"
             f"    s = socket.create_connection(({address!r}, {port}), timeout=2)\n"
             "    s.sendall(b'PING\\r\\n'); print(s.recv(16).decode().strip())\n"
             "except OSError as exc:\n"
             "    print(type(exc).__name__)\n")
    done = subprocess.run(host.command([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


def test_a_host_reaches_root_services_only_through_the_bridge(host_pool: HostPool) -> None:
    port = services.redis().port
    network = host_pool.network
    h3 = network["h3"]
    # Its own loopback has no Redis: 127.0.0.1 inside a host is the host.
    assert _ping_redis_from(h3, "127.0.0.1", port) == "ConnectionRefusedError"
    with network.forward(port):
        assert _ping_redis_from(h3, hosts.ROOT_ADDRESS, port) == "+PONG"
    routes = subprocess.run(h3.command(["ip", "-o", "addr", "show"]), capture_output=True, text=True).stdout
    assert "10.213.0.13/24" in routes and " lo " in routes


def test_slow_lossy_host_completes_correctly_and_speculation_works_around_it(
        pool: ConnectPool, host_pool: HostPool, tpch_data: Path, tmp_path: Path) -> None:
    network = host_pool.network
    h2 = network["h2"]
    port, how = network.shape(h2, 15002, delay_ms=300, loss_percent=5)
    servers = tuple(dataclasses.replace(s, port=port) if s.name == "h2" else s for s in pool.servers)
    shaped = ConnectPool(servers, slots=pool.slots)
    run_pipeline(shaped, _q1_graph(tpch_data, "hosts_slow", parallelism=8, config={"enabled": True}), tmp_path,
                 "run1", timeout=400)

    layout = StageLayout(tmp_path, "hosts_slow", "run1", "scan")
    scan = next(s for s in run_report(tmp_path, "hosts_slow", "run1")["stages"] if s["stage"] == "scan")
    summary = read_json(layout.summary)
    journal = read_jsonl(layout.journal)
    attempts = [a for sub in scan["subtasks"] for a in sub["attempts"]]
    # The controller measured the host behind the slow link as slower...
    speeds = summary["target_speeds"]
    assert speeds["h2"]["slowness"] > speeds["h1"]["slowness"], (how, speeds)
    # ... and kept work off it: the fast host committed more subtasks, no copy ever went to the slow
    # one, and the slow host was blocked (by its address: the node is the host), or work waited for
    # the fast host, or a copy there won. Which of these acts first depends on timing, not the outcome.
    committed_on = [a["target"] for a in attempts if a["admitted"]]
    assert committed_on.count("h1") > committed_on.count("h2"), (how, committed_on)
    assert all(a["target"] == "h1" for a in attempts if a["speculative"]), attempts
    holds = [e for e in journal if e.get("event") == "launch" and "for faster target h1" in (e.get("reason") or "")]
    copies_won = [a for a in attempts if a["speculative"] and a["admitted"]]
    blocked = [e["node"] for e in journal if e.get("event") == "block_node"]
    assert "10.213.0.11" not in blocked, blocked
    assert holds or copies_won or "10.213.0.12" in blocked, (how, journal)
    assert {a["node"] for a in attempts} == {"10.213.0.11", "10.213.0.12"}
    assert_q1_equal(_q1_of(tmp_path, "hosts_slow"), duckdb_q1(tpch_data))


def test_partitioned_host_is_fenced_and_its_attempts_never_commit_after_heal(
        pool: ConnectPool, host_pool: HostPool, tpch_data: Path, tmp_path: Path) -> None:
    network = host_pool.network
    h1 = network["h1"]
    with _held_on_h1(pool, tpch_data, tmp_path, "hosts_partition") as (future, layout, held):
        network.partition(h1)
        # Heal once every subtask that was on h1 runs again on h2: h1 is back while the stage still runs.
        wait_for(lambda: all(any(c.get("target") == "h2" and a > attempt for _, a, c in _claims(layout)
                                 if _ == subtask) for subtask, attempt in held) or future.done(),
                 120, "the partitioned attempts relaunched on h2")
        network.heal(h1)

    # Fenced: none of them reported after the heal, none is committed, their clients are gone.
    scan = _h1_attempts_counted_lost(layout, held, tmp_path)
    attempts = {(sub["subtask"], a["attempt"]): a for sub in scan["subtasks"] for a in sub["attempts"]}
    for key in held:
        assert attempts[key]["state"] == "CANCELED" and not attempts[key]["admitted"], attempts[key]
        # Fenced on the server too: once healed, the attempt's session there was released, so nothing
        # can ever run in it again (a straggling client gets SESSION_CLOSED).
        cancel = read_json(layout.attempt_dir(*key) / "connect-cancel.json")
        assert cancel["released_at"] and not cancel.get("gave_up_at"), cancel
    _assert_one_output_per_subtask(layout)
    assert not processes_mentioning(str(tmp_path)), "a client of ours outlived the stage"
    # Node identity: every attempt ran on a host's address, never on a loopback label.
    assert {a["node"] for a in attempts.values()} <= {"10.213.0.11", "10.213.0.12"}, attempts
    # Nothing of ours is left running on the healed host's server.
    h1_server = next(s for s in pool.servers if s.name == "h1")
    wait_for(lambda: not _server_running_jobs(h1_server), 60, "no job running on h1's server after the heal")
    assert_q1_equal(_q1_of(tmp_path, "hosts_partition"), duckdb_q1(tpch_data))


# Last: it takes h1's server away (the next module run starts a fresh one).
def test_killed_host_reruns_its_attempts_elsewhere_as_lost_not_failed(
        pool: ConnectPool, host_pool: HostPool, tpch_data: Path, tmp_path: Path) -> None:
    network = host_pool.network
    h1 = network["h1"]
    with _held_on_h1(pool, tpch_data, tmp_path, "hosts_kill") as (_, layout, held):
        network.kill(h1)  # the machine is gone: its server and everything it ran

    # The stage succeeded with max_failures_per_stage = 0: the lost attempts were not failures.
    scan = _h1_attempts_counted_lost(layout, held, tmp_path)
    by_subtask = {sub["subtask"]: sub for sub in scan["subtasks"]}
    for subtask, attempt in held:
        sub = by_subtask[subtask]
        assert not next(a for a in sub["attempts"] if a["attempt"] == attempt)["admitted"]
        winner = next(a for a in sub["attempts"] if a["admitted"])
        assert (winner["target"], winner["node"]) == ("h2", "10.213.0.12"), winner
        # Its server is gone, and so is its session: nothing left to interrupt, no minute of waiting for it.
        assert read_json(layout.attempt_dir(subtask, attempt) / "connect-cancel.json")["server_gone_at"]
    _assert_one_output_per_subtask(layout)
    assert hosts.namespace_pids(h1.netns) == []
    assert not processes_mentioning(str(tmp_path)), "a client of ours outlived the stage"
    assert_q1_equal(_q1_of(tmp_path, "hosts_kill"), duckdb_q1(tpch_data))
