"""A local pool of Spark Connect servers (one JVM each) to use as ``spark_connect`` targets.

``airflow speculative local-cluster start|stop|status`` and the demo use it. Each server is a
``spark-submit --class SparkConnectServer`` started in its own process group, bound to its host's
address (127.0.0.1 unless the server is given another: one server per host of a multi-host pool),
with its log and a JSON pid file under ``$AIRFLOW_HOME/speculative-local-cluster/``. ``stop`` only
kills a process whose pid file it wrote *and* that still is that server (same start time, same
command line): a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from airflow_provider_speculative.backends.commitjar import find_commit_jar, with_commit_jar
from airflow_provider_speculative.backends.identity import same_process, start_ticks
from airflow_provider_speculative.backends.scratch import submit_env
from airflow_provider_speculative.exceptions import SpeculativeError

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_BASE_PORT = 15002
DEFAULT_UI_BASE_PORT = 4050
DEFAULT_CORES = 2
LOOPBACK = "127.0.0.1"
START_TIMEOUT = 180.0
_UI_STARTED = re.compile(r"Successfully started service 'SparkUI' on port (\d+)")
# A server's name is also its temporary directory's: nothing that could leave the pool's directory.
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
# The file that marks a server's temporary directory as made by ``start`` (and so removable by the pool).
TEMP_MARKER = ".speculative-local-cluster-tmp"

# Server-side safety net (static confs, set at server start). With reattachable execution a query
# whose client vanished (a killed attempt, a lost triggerer) keeps running until its response stream
# ends (senderMaxStreamDuration, default 2m), then until it counts as detached (detachedTimeout, 5m),
# checked every maintenanceInterval (30s): ~7 minutes of cluster time measured here. With these values
# it is abandoned and interrupted within ~45 s. The provider interrupts a cancelled attempt's
# operations itself; this bounds what is left when it cannot. A client reattaches every 20 s instead
# of every 2 minutes (one cheap RPC). docs/clusters.md asks users to set the same on their servers.
SAFETY_NET_CONF = {
    "spark.connect.execute.reattachable.senderMaxStreamDuration": "20s",
    "spark.connect.execute.manager.detachedTimeout": "20s",
    "spark.connect.execute.manager.maintenanceInterval": "5s",
}


# Seconds a new server's warm-up query (devtools/warmup.py) may take before it is given up.
WARM_UP_TIMEOUT = 180.0


class LocalClusterError(SpeculativeError):
    """The local Connect pool cannot be started or stopped (port taken, Java missing, server died)."""


@dataclass
class ServerInfo:
    """One server of the pool, as recorded in its pid file."""

    name: str
    port: int
    ui_port: int
    pid: int = 0
    create_time: float = 0.0
    start_ticks: int | None = None
    log: str = ""
    master: str = "local[2]"
    started_at: float = 0.0
    ready_at: float | None = None
    app_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The address the server binds and clients dial; also its driver's host (the node its work runs on).
    host: str = LOOPBACK

    @property
    def node(self) -> str | None:
        """The node label of the server's target: its host, or None on loopback (the target's name then).

        Servers on one loopback host are told apart by name; a server on its own host is that host, so
        the blocklist and the speed history name the machine, as an attempt's executors would.
        """
        return None if self.host == LOOPBACK else self.host

    @property
    def conn_id(self) -> str:
        """The Airflow connection id the printed definitions use for this server."""
        return "spark_connect_" + self.name.replace("-", "_")

    @property
    def url(self) -> str:
        """The server's ``sc://`` URL."""
        return f"sc://{self.host}:{self.port}"


def cluster_dir(home: str | Path | None = None) -> Path:
    """Where pid files and logs live: ``$AIRFLOW_HOME/speculative-local-cluster`` unless ``home`` is given."""
    if home is not None:
        return Path(home)
    airflow_home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return Path(airflow_home) / "speculative-local-cluster"


def server_names(count: int) -> list[str]:
    """``local-a``, ``local-b``, ... (the example's target names)."""
    if not 1 <= count <= 26:
        raise LocalClusterError(f"--servers must be between 1 and 26, not {count}")
    return [f"local-{letter}" for letter in string.ascii_lowercase[:count]]


def spark_submit() -> str:
    """The ``spark-submit`` next to this Python (the venv's), else the one on PATH."""
    local = Path(sys.executable).parent / "spark-submit"
    if local.exists():
        return str(local)
    found = shutil.which("spark-submit")
    if not found:
        raise LocalClusterError("spark-submit not found next to this Python nor on PATH (pip install pyspark)")
    return found


def check_java(env: dict[str, str] | None = None) -> str:
    """The java binary Spark will use, or a :class:`LocalClusterError` saying how to provide one."""
    environ: Mapping[str, str] = os.environ if env is None else env
    java_home = environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise LocalClusterError(f"JAVA_HOME={java_home} has no executable bin/java: point JAVA_HOME "
                                    "at a Java 17+ installation or unset it to use java from PATH")
        return str(java)
    found = shutil.which("java", path=environ.get("PATH"))
    if not found:
        raise LocalClusterError("Java not found: java is not on PATH and JAVA_HOME is not set; "
                                "Spark needs Java 17+ (e.g. apt-get install openjdk-17-jre-headless)")
    return found


def port_owner(port: int) -> str | None:
    """A description of what listens on TCP ``port`` of 127.0.0.1 (None when the port is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return None
        except OSError:
            pass
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(conn.pid)
                    return f"pid {conn.pid} ({' '.join(proc.cmdline())[:160]})"
                return f"pid {conn.pid}"
    return "another process (owner unknown)"


def free_base_port(count: int = 2, attempts: int = 50) -> int:
    """A port p with p .. p + count - 1 all free on 127.0.0.1, for a pool of ``count`` servers (tests, benchmarks)."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + count <= 65000 and all(port_owner(port + i) is None for i in range(count)):
            return port
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def server_command(info: ServerInfo, conf: dict[str, str] | None = None) -> list[str]:
    """The spark-submit command line of one server (bound to its host only, fixed gRPC and UI ports, the safety net)."""
    cmd = [spark_submit(), "--class", CONNECT_CLASS, "--master", info.master, "--name", f"speculative-{info.name}",
           "--conf", f"spark.connect.grpc.binding.port={info.port}",
           "--conf", f"spark.connect.grpc.binding.address={info.host}",
           "--conf", f"spark.ui.port={info.ui_port}",
           "--conf", f"spark.driver.host={info.host}", "--conf", f"spark.driver.bindAddress={info.host}"]
    for key, value in {**SAFETY_NET_CONF, **(conf or {})}.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, "spark-internal"]


class LocalCluster:
    """Start, stop and list the pool's servers; all state is in ``directory``."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.dir = cluster_dir(directory)
        # The servers this object launched, by name: their exit is read from the child itself, because
        # /proc/<pid>/cmdline reads empty while a launcher execs the next program (ip -> bash -> java).
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def pid_file(self, name: str) -> Path:
        """The JSON pid file of server ``name``."""
        return self.dir / f"{name}.json"

    def recorded(self) -> list[ServerInfo]:
        """Every server with a pid file, by name."""
        out = []
        for path in sorted(self.dir.glob("local-*.json")):
            with contextlib.suppress(OSError, ValueError, TypeError):
                out.append(ServerInfo(**json.loads(path.read_text())))
        return out

    def _write(self, info: ServerInfo) -> None:
        tmp = self.pid_file(info.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(info), indent=2))
        tmp.replace(self.pid_file(info.name))

    @staticmethod
    def process(info: ServerInfo) -> psutil.Process | None:
        """The server's live process if the pid is still that server (not a recycled pid), else None."""
        if not info.pid:
            return None
        try:
            proc = psutil.Process(info.pid)
            recorded = {"start_ticks": info.start_ticks, "create_time": info.create_time}
            if not same_process(info.pid, recorded, proc.create_time()) or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            return None
        if CONNECT_CLASS not in cmdline or f"spark.connect.grpc.binding.port={info.port}" not in cmdline:
            return None
        return proc

    def start(self, servers: int = 2, base_port: int = DEFAULT_BASE_PORT, ui_base_port: int = DEFAULT_UI_BASE_PORT,
              cores: int = DEFAULT_CORES, conf: dict[str, str] | None = None,
              timeout: float = START_TIMEOUT, warm_up: bool = True,
              warm_up_store: str | None = None,
              warm_up_rounds: int | None = None) -> tuple[list[ServerInfo], list[ServerInfo]]:
        """Start the servers not already running; wait until each accepts clients. Returns (started, running).

        With ``warm_up`` each new server then runs ``warm_up_rounds`` rounds of one small query
        (devtools/warmup.py; default its ``ROUNDS``), so the first attempts do not pay the driver's warm-up;
        the outcome is in ``extra["warm_up"]``. ``warm_up_store`` (an ``s3://`` store root the servers serve)
        adds rounds that write and read there. No rounds at all is no warm-up (``extra["warm_up"]`` "skipped").
        """
        if warm_up_rounds is not None and warm_up_rounds < 0:
            raise LocalClusterError(f"warm-up rounds {warm_up_rounds}: expected 0 or more")
        self.dir.mkdir(parents=True, exist_ok=True)
        check_java()
        started: list[ServerInfo] = []
        already: list[ServerInfo] = []
        existing = {s.name: s for s in self.recorded()}
        for index, name in enumerate(server_names(servers)):
            old = existing.get(name)
            if old is not None and self.process(old) is not None:
                already.append(old)
                continue
            info = ServerInfo(name=name, port=base_port + index, ui_port=ui_base_port + index,
                              master=f"local[{cores}]", log=str(self.dir / f"{name}.log"))
            for port, what in ((info.port, "gRPC"), (info.ui_port, "Spark UI")):
                owner = port_owner(port)
                if owner is not None:
                    self.stop_servers(started)
                    raise LocalClusterError(f"cannot start {name}: its {what} port {port} on 127.0.0.1 is already "
                                            f"in use by {owner}; choose other ports with --base-port / "
                                            "--ui-base-port or stop that process")
            started.append(self._launch_or_stop(info, conf, started))
        return self._ready(started, timeout, warm_up, warm_up_store, warm_up_rounds), already

    def start_servers(self, servers: list[ServerInfo], conf: dict[str, str] | None = None,
                      timeout: float = START_TIMEOUT, warm_up: bool = True,
                      launcher: Callable[[ServerInfo], list[str]] | None = None) -> list[ServerInfo]:
        """Start these servers as given (each on its own ``host``, e.g. one per machine); wait until ready.

        ``launcher(server)`` is a command prefix (e.g. ``ip netns exec <ns>`` or ``ssh <host>``): the
        pid recorded is the process it starts, so it must exec the server (not fork and return).
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        check_java()
        started: list[ServerInfo] = []
        for info in servers:
            info.log = info.log or str(self.dir / f"{info.name}.log")
            started.append(self._launch_or_stop(info, conf, started, launcher(info) if launcher else []))
        return self._ready(started, timeout, warm_up)

    def _ready(self, started: list[ServerInfo], timeout: float, warm_up: bool,
               warm_up_store: str | None = None, warm_up_rounds: int | None = None) -> list[ServerInfo]:
        try:
            for info in started:
                self._wait_ready(info, timeout)
        except LocalClusterError:
            self.stop_servers(started)
            raise
        if warm_up and (warm_up_rounds != 0 or warm_up_store):
            self._warm_up(started, warm_up_store, warm_up_rounds)
        elif warm_up:
            for info in started:
                info.extra["warm_up"] = "skipped"
                self._write(info)
        return started

    def _warm_up(self, servers: list[ServerInfo], store: str | None = None, rounds: int | None = None) -> None:
        # All servers at once (one client process each); a failed warm-up is reported, never fatal:
        # the server accepted clients, and an attempt would show the same error in its own log.
        began = time.time()
        clients = {info.name: subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_speculative.devtools.warmup", f"{info.url}/",
             *(["--rounds", str(rounds)] if rounds is not None else []), *(["--store", store] if store else [])],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            for info in servers}
        for info in servers:
            proc = clients[info.name]
            try:
                out, err = proc.communicate(timeout=max(1.0, WARM_UP_TIMEOUT - (time.time() - began)))
                info.extra["warm_up"] = (round(time.time() - began, 2) if proc.returncode == 0 else
                                         f"failed ({proc.returncode}): {err.decode(errors='replace')[-300:]}")
                if proc.returncode == 0 and store:
                    info.extra["warm_up_store_objects"] = _store_objects(out)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                info.extra["warm_up"] = f"did not finish within {WARM_UP_TIMEOUT:.0f}s"
            self._write(info)

    def temp_dir(self, name: str) -> Path:
        """Server ``name``'s temporary directory (its JVM's ``java.io.tmpdir``), below this pool's directory.

        Spark keeps a driver's scratch space there (``spark-*``: copies of ``spark.jars``, ``blockmgr-*``,
        Connect's ``artifacts-*``) unless ``spark.local.dir`` says otherwise, and deletes it only on a clean
        shutdown. Being the pool's own, it is removed whenever its server is known to be gone.
        """
        if not _SERVER_NAME.fullmatch(name):
            raise LocalClusterError(f"server name {name!r}: expected letters, digits, '.', '_' or '-'")
        return self.dir / "tmp" / name

    def _clear_temp_dir(self, name: str) -> bool:
        """Remove a server's temporary directory if ``start`` made it (its marker); False if one is left there.

        Only ever called once the server ``name`` is not running (never started, stopped or killed). A
        directory without the marker (``--directory`` pointed at one that was there before) is never touched.
        """
        tmp = self.temp_dir(name)
        if (tmp / TEMP_MARKER).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
        return not os.path.lexists(tmp)

    def _launch_or_stop(self, info: ServerInfo, conf: dict[str, str] | None, started: list[ServerInfo],
                        prefix: list[str] | None = None) -> ServerInfo:
        """Launch ``info``; if it cannot be, stop the servers of this start launched before it, then raise."""
        try:
            return self._launch(info, conf, prefix)
        except LocalClusterError:
            self.stop_servers(started)
            raise

    def _launch(self, info: ServerInfo, conf: dict[str, str] | None, prefix: list[str] | None = None) -> ServerInfo:
        # A killed server's scratch space (up to the size of its spark.jars, e.g. the AWS SDK bundle) goes
        # before the next one starts; the new JVM's own goes to a fresh directory of the pool.
        tmp = self.temp_dir(info.name)
        if not self._clear_temp_dir(info.name):
            raise LocalClusterError(f"cannot start {info.name}: {tmp} exists and was not made by local-cluster "
                                    "(no marker); move it away or choose another --directory")
        tmp.mkdir(parents=True)
        (tmp / TEMP_MARKER).write_text(f"{info.name}\n")
        # The servers' Python workers (UDFs) must be this venv's Python; bind only the server's own host.
        # SPARK_SUBMIT_OPTS reaches the driver's JVM (the server) and keeps any options the caller set.
        env = {**submit_env(tmp, os.environ), "SPARK_LOCAL_IP": info.host, "PYSPARK_PYTHON": sys.executable}
        # The provider's commit protocol on the server's class path: exchanges are then written without
        # Hadoop's _temporary/ moves ([speculative] exchange_commit). Without a JDK here, Hadoop's committer.
        conf = with_commit_jar(conf or {}, find_commit_jar())
        with open(info.log, "ab") as log:
            proc = subprocess.Popen([*(prefix or []), *server_command(info, conf)], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    close_fds=True)
        self._children[info.name] = proc
        info.pid = proc.pid
        info.create_time = psutil.Process(proc.pid).create_time()
        info.start_ticks = start_ticks(proc.pid)
        info.started_at = time.time()
        self._write(info)
        return info

    def _wait_ready(self, info: ServerInfo, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        child = self._children.get(info.name)
        while time.monotonic() < deadline:
            code = child.poll() if child is not None else (None if self.process(info) else "unknown")
            if code is not None:
                raise LocalClusterError(f"Connect server {info.name} (port {info.port}) exited during start-up "
                                        f"(exit code {code}); last lines of {info.log}:\n{_tail(info.log)}")
            if _accepts(info.port, info.host) and _log_has(info.log, "Spark Connect server started"):
                info.ui_port = _actual_ui_port(info.log) or info.ui_port
                info.ready_at = info.ready_at or time.time()
                info.app_id = application_id(info.ui_port, info.host)
                # The REST API may lag the gRPC service by a moment; the app id is informative only.
                if info.app_id or time.time() - info.ready_at > 30:
                    self._write(info)
                    return
            time.sleep(0.25)
        raise LocalClusterError(f"Connect server {info.name} did not accept clients on port {info.port} within "
                                f"{timeout:.0f}s; see {info.log}")

    def _own_child(self, info: ServerInfo) -> psutil.Process | None:
        # A server this object launched that is still running, even while its cmdline does not name it yet.
        child = self._children.get(info.name)
        if child is None or child.poll() is not None:
            return None
        try:
            return psutil.Process(child.pid)
        except psutil.Error:
            return None

    def stop(self) -> list[tuple[ServerInfo, str]]:
        """Stop every recorded server; returns (server, what happened) pairs."""
        return self.stop_servers(self.recorded())

    def stop_servers(self, servers: list[ServerInfo], grace: float = 15.0) -> list[tuple[ServerInfo, str]]:
        """Stop these servers (only processes that still are them), SIGTERM then SIGKILL after ``grace``."""
        out: list[tuple[ServerInfo, str]] = []
        for info in servers:
            proc = self.process(info) or self._own_child(info)
            if proc is None:
                out.append((info, "not running"))
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM) if os.getpgid(proc.pid) == proc.pid else proc.terminate()
                try:
                    proc.wait(timeout=grace)
                    out.append((info, "stopped"))
                except psutil.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL) if os.getpgid(proc.pid) == proc.pid else proc.kill()
                    with contextlib.suppress(psutil.Error):
                        proc.wait(timeout=grace)
                    out.append((info, "killed"))
            if proc is None or _gone(proc):
                self._clear_temp_dir(info.name)
            self.pid_file(info.name).unlink(missing_ok=True)
        return out

    def status(self) -> list[dict[str, Any]]:
        """Each recorded server: name, alive, ports, pid, app id, URL and log."""
        rows = []
        for info in self.recorded():
            alive = self.process(info) is not None
            rows.append({"name": info.name, "alive": alive, "port": info.port, "ui_port": info.ui_port,
                         "pid": info.pid,
                         "app_id": (application_id(info.ui_port, info.host) if alive else None) or info.app_id,
                         "url": info.url, "conn_id": info.conn_id, "log": info.log})
        return rows


def _gone(proc: psutil.Process) -> bool:
    """Whether ``proc`` has ended (a zombie has: its files are closed)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def application_id(ui_port: int, host: str = LOOPBACK, timeout: float = 2.0) -> str | None:
    """The application id a Spark UI's REST API on ``host`` reports (None if it does not answer)."""
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        with urllib.request.urlopen(f"http://{host}:{ui_port}/api/v1/applications", timeout=timeout) as resp:
            return json.loads(resp.read().decode())[0]["id"]
    return None


def connection_definitions(servers: list[ServerInfo]) -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` environment variables (JSON connections) for the servers."""
    return {f"AIRFLOW_CONN_{s.conn_id.upper()}": json.dumps({"conn_type": "spark_connect", "host": s.host,
                                                             "port": s.port}) for s in servers}


def targets_json(servers: list[ServerInfo], slots: int = 2) -> str:
    """The ``[speculative] targets`` value that uses the servers (one target per server, node = its host or name)."""
    return json.dumps([{"name": s.name, "conn_id": s.conn_id, "slots": slots, **({"node": s.node} if s.node else {})}
                       for s in servers])


def _store_objects(output: bytes) -> int | None:
    """The objects a warm-up's store rounds wrote and deleted, from its last line of output; None if unreadable."""
    lines = output.decode(errors="replace").strip().splitlines()
    try:
        value = json.loads(lines[-1]).get("store_objects") if lines else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def _accepts(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _log_has(path: str, text: str) -> bool:
    try:
        return text.encode() in Path(path).read_bytes()
    except OSError:
        return False


def _actual_ui_port(path: str) -> int | None:
    # Spark moves the UI to the next free port when the configured one is taken: trust the log.
    with contextlib.suppress(OSError):
        found = _UI_STARTED.findall(Path(path).read_text(errors="replace"))
        if found:
            return int(found[-1])
    return None


def _tail(path: str, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


# Where `make jars` puts hadoop-aws and the AWS SDK (jars/s3a/pom.xml, at pyspark's Hadoop version).
S3A_JARS_ENV = "SPECULATIVE_S3A_JARS"


def pyspark_hadoop_version() -> str:
    """The Hadoop version the installed pyspark bundles (from its ``hadoop-client-api-<version>.jar``)."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise LocalClusterError(f"pyspark at {Path(pyspark.__file__).parent} bundles no hadoop-client-api jar")
    return jars[-1].name[len("hadoop-client-api-"):-len(".jar")]


def s3a_jars() -> str:
    """The s3a jar directory: ``$SPECULATIVE_S3A_JARS``, else ``.jars/s3a-<pyspark's Hadoop>`` (`make jars`)."""
    configured = os.environ.get(S3A_JARS_ENV)
    if configured:
        return configured
    checkout = Path(__file__).resolve().parents[2] / ".jars" / f"s3a-{pyspark_hadoop_version()}"
    if not checkout.is_dir():
        raise LocalClusterError(f"no s3a jars: set ${S3A_JARS_ENV} to a directory with hadoop-aws and the AWS SDK "
                                f"bundle for pyspark's Hadoop, or run `make jars` in a checkout ({checkout})")
    return str(checkout)


def jar_paths(spec: str) -> list[str]:
    """Absolute jar paths from a directory (its ``*.jar``) or a comma-separated list; each must exist."""
    if os.path.isdir(spec):
        found = sorted(str(p.resolve()) for p in Path(spec).glob("*.jar"))
        if not found:
            raise LocalClusterError(f"jar directory {spec} has no *.jar files")
        return found
    paths = [p.strip() for p in spec.split(",") if p.strip()]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise LocalClusterError(f"jar {missing[0]} does not exist" + (f" (and {len(missing) - 1} more)"
                                                                      if len(missing) > 1 else ""))
    return [os.path.abspath(p) for p in paths]
