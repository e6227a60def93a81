"""A Spark standalone cluster on loopback for tests: one master and N workers, each worker its own node.

Linux routes all of 127.0.0.0/8 to the loopback interface, so worker *i* binds its own address
(127.0.0.2, 127.0.0.3, ...): executors report that address as their host, which makes "node" mean
something even on one machine. Each worker also offers one unit of a custom resource named after its
node (``core.placement``), so a target whose conf asks for that resource has its executors on exactly
that worker. The command lines are plain functions so docker/docker-compose.yml can be checked against
them (tests/unit/test_docker_compose.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.placement import (
    standalone_discovery_script,
    standalone_pin_conf,
    standalone_worker_conf,
)
from airflow_provider_speculative.devtools.localcluster import SAFETY_NET_CONF

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Ports this project may use on the test machine: masters/workers 7100-7199, web UIs 8100-8199.
RPC_PORTS = range(7100, 7200)
UI_PORTS = range(8100, 8200)


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (spark-class needs SPARK_HOME)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> str:
    """The ``spark-class`` launcher of that distribution."""
    return str(spark_home() / "bin" / "spark-class")


def master_command(launcher: str, host: str, port: int, webui_port: int) -> list[str]:
    """Command line of a standalone master."""
    return [launcher, MASTER_CLASS, "--host", host, "--port", str(port), "--webui-port", str(webui_port)]


def worker_command(launcher: str, master_url: str, host: str, port: int, webui_port: int, work_dir: str,
                   properties_file: str, cores: int = 1, memory: str = "1g") -> list[str]:
    """Command line of a standalone worker (its node resource comes from ``properties_file``)."""
    return [launcher, WORKER_CLASS, master_url, "--host", host, "--port", str(port), "--webui-port", str(webui_port),
            "--cores", str(cores), "--memory", memory, "--work-dir", work_dir, "--properties-file", properties_file]


def connect_server_command(submit: str, master_url: str, node: str, host: str, port: int,
                           driver_host: str, jars: str | None = None) -> list[str]:
    """Command line of a Spark Connect server whose executors are pinned to ``node`` (one server per worker).

    The server is the driver of one long-running application; ``driver_host`` is the address its
    executors connect back to. ``jars`` (comma-separated) go on the server's and its executors' class path.
    """
    conf = {"spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port),
            "spark.driver.host": driver_host, "spark.driver.bindAddress": host, **standalone_pin_conf(node),
            **SAFETY_NET_CONF}
    return [submit, "--class", CONNECT_CLASS, "--master", master_url, "--name", f"connect-{node}",
            *(["--jars", jars] if jars else []),
            *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")], "spark-internal"]


def worker_properties(node: str, discovery_script: str, amount: int = 1) -> str:
    """The worker's properties file: ``amount`` units of ``node``'s resource, found by ``discovery_script``."""
    conf = standalone_worker_conf(node, discovery_script, amount)
    return "".join(f"{key} {value}\n" for key, value in conf.items())


def process_env(host: str) -> dict[str, str]:
    """Environment of a cluster JVM: bound to ``host`` only (never the machine's public address)."""
    return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host,
            # Executors run the stage's Python: the venv's, with pyspark and this package.
            "PYSPARK_PYTHON": sys.executable}


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, candidates: range, host: str = "127.0.0.1", avoid: set[int] | None = None) -> list[int]:
    """``count`` ports of ``candidates`` nothing listens on (checked by binding)."""
    avoid = avoid or set()
    found = [p for p in candidates if p not in avoid and _port_free(host, p)][:count]
    if len(found) < count:
        raise RuntimeError(f"fewer than {count} free ports in {candidates}")
    return found


@dataclass
class ClusterProcess:
    """One JVM of the cluster: its role, address, log and process."""

    role: str
    node: str
    host: str
    port: int
    webui_port: int
    command: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        """Start the JVM in its own process group (spark-class execs java, so the pid is the JVM's)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)

    def signal(self, signum: int) -> None:
        """Signal the whole process group (the worker's executors are in it too)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; wait until the group is gone."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=timeout)
        # Executors the worker started share its group; make sure none outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class StandaloneCluster:
    """A master on 127.0.0.1 and workers on 127.0.0.2, 127.0.0.3, ...; ``nodes`` are the workers' hosts."""

    base_dir: Path
    master_host: str = "127.0.0.1"
    cores: int = 1
    memory: str = "1g"
    master: ClusterProcess | None = None
    workers: dict[str, ClusterProcess] = field(default_factory=dict)
    _next_worker: int = 0

    # -- addresses -----------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://host:port`` of the master (what a ``spark`` connection's host is set to)."""
        assert self.master is not None
        return f"spark://{self.master.host}:{self.master.port}"

    @property
    def webui_url(self) -> str:
        """The master's web UI (its ``/json/`` describes workers and applications)."""
        assert self.master is not None
        return f"http://{self.master.host}:{self.master.webui_port}"

    @property
    def nodes(self) -> list[str]:
        """Node names of the started workers (their hosts), in start order."""
        return list(self.workers)

    def _used_ports(self) -> set[int]:
        procs = ([self.master] if self.master else []) + list(self.workers.values())
        return {p.port for p in procs} | {p.webui_port for p in procs}

    # -- life cycle ----------------------------------------------------------------------------

    def start(self, workers: int = 2, timeout: float = 180.0) -> StandaloneCluster:
        """Start the master and ``workers`` workers; return once the master lists them all ALIVE."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        port, = free_ports(1, RPC_PORTS, self.master_host)
        ui, = free_ports(1, UI_PORTS, self.master_host)
        self.master = ClusterProcess("master", "master", self.master_host, port, ui,
                                     master_command(spark_class(), self.master_host, port, ui),
                                     self.base_dir / "master.log")
        self.master.start(process_env(self.master_host))
        for _ in range(workers):
            self.add_worker(wait=False)
        self.wait_alive(self.nodes, timeout)
        return self

    def add_worker(self, wait: bool = True, timeout: float = 180.0) -> str:
        """Start one more worker on the next loopback address; return its node name."""
        assert self.master is not None, "start the master first"
        self._next_worker += 1
        host = f"127.0.0.{self._next_worker + 1}"
        node = host
        work = self.base_dir / f"worker-{node}"
        work.mkdir(parents=True, exist_ok=True)
        script = work / "discover-node.sh"
        script.write_text(standalone_discovery_script(node))
        script.chmod(0o755)
        props = work / "worker.conf"
        props.write_text(worker_properties(node, str(script)))
        port, = free_ports(1, RPC_PORTS, host, self._used_ports())
        ui, = free_ports(1, UI_PORTS, host, self._used_ports() | {port})
        worker = ClusterProcess("worker", node, host, port, ui,
                                worker_command(spark_class(), self.master_url, host, port, ui, str(work / "work"),
                                               str(props), self.cores, self.memory),
                                work / "worker.log")
        self.workers[node] = worker
        worker.start(process_env(host))
        if wait:
            self.wait_alive([node], timeout)
        return node

    def kill_worker(self, node: str) -> float:
        """SIGKILL a worker and its executors (a machine lost); return when it happened (time.time())."""
        self.workers[node].signal(signal.SIGKILL)
        killed_at = time.time()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.workers[node].proc.wait(timeout=30)  # type: ignore[union-attr]
        return killed_at

    def stop(self) -> None:
        """Stop every worker, then the master; no JVM of the cluster is left."""
        for worker in self.workers.values():
            worker.stop()
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation ---------------------------------------------------------------------------

    def _bound_webui_port(self) -> int | None:
        """The port the master's web UI really bound, from its log (Spark moves on when the chosen one is taken)."""
        assert self.master is not None
        try:
            text = self.master.log.read_text(errors="replace")
        except OSError:
            return None
        found = re.findall(r"MasterWebUI.*started at https?://[^\s:/]+:(\d+)", text)
        return int(found[-1]) if found else None

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` document (workers with state, resources; applications).

        Raises ``OSError`` until the master's UI is up and serving its JSON: the port chosen for it can be
        taken between the check and the JVM's bind, and then another process's page answers there.
        """
        assert self.master is not None
        bound = self._bound_webui_port()
        if bound is None:
            raise OSError("the master has not logged its web UI address yet")
        if bound != self.master.webui_port:
            self.master.webui_port = bound
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as response:
            body = response.read()
        try:
            return json.loads(body)
        except ValueError as err:
            raise OSError(f"{self.webui_url}/json/ did not answer JSON: {body[:80]!r}") from err

    def worker_states(self) -> dict[str, str]:
        """Node -> the master's state of its newest registration (ALIVE, DEAD, ...)."""
        try:
            workers = self.state().get("workers", [])
        except OSError:
            return {}
        # A restarted worker registers again under a new id; the newest registration wins.
        out: dict[str, str] = {}
        for worker in sorted(workers, key=lambda w: w.get("id", "")):
            out[worker["host"]] = worker["state"]
        return out

    def wait_alive(self, nodes: list[str], timeout: float) -> None:
        """Poll the master until every node in ``nodes`` is ALIVE (fail naming the logs otherwise)."""
        self._wait(lambda states: all(states.get(n) == "ALIVE" for n in nodes), timeout, f"workers {nodes} ALIVE")

    def wait_dead(self, node: str, timeout: float) -> float:
        """Poll the master until it reports ``node`` DEAD; return when it saw that (time.time())."""
        self._wait(lambda states: states.get(node) == "DEAD", timeout, f"worker {node} DEAD")
        return time.time()

    def _wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.worker_states()):
                return
            for proc in [self.master, *self.workers.values()]:
                if proc is not None and proc.proc is not None and proc.proc.poll() is not None \
                        and proc.role == "master":
                    raise RuntimeError(f"the Spark master exited ({proc.proc.returncode}); see {proc.log}")
            time.sleep(0.5)
        logs = ", ".join(str(p.log) for p in [self.master, *self.workers.values()] if p is not None)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; logs: {logs}")
