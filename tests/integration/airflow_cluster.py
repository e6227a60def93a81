"""A real Airflow deployment for end-to-end tests: PostgreSQL + LocalExecutor, api-server, scheduler,
dag-processor and triggerer, each a subprocess in its own process group that a test can stop, kill -9
and restart individually.

Used by ``test_e2e_scheduler.py`` and ``test_e2e_recovery.py``::

    db = PostgresDatabase(); db.create_migrated()
    cluster = AirflowCluster(tmp_path, db.url, dags_folder=..., data=...)
    cluster.start_all(); cluster.wait_healthy()
    ...
    cluster.kill("triggerer"); cluster.start("triggerer"); cluster.wait_component_restarted("triggerer", since)
    ...
    cluster.shutdown(); db.drop()
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from airflow_provider_speculative.devtools.services import PostgresServer
from tests import services
from tests.processes import free_port, group_processes, processes_mentioning, tail, wait_for

REPO = Path(__file__).resolve().parents[2]
LINEITEM = REPO / ".data" / "tpch" / "lineitem"
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Key of each component in the api-server's /monitor/health document.
HEALTH_KEYS = {"scheduler": "scheduler", "triggerer": "triggerer", "dag-processor": "dag_processor"}


# -- generic helpers ----------------------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0,
               on_timeout: Callable[[], str] | None = None) -> Any:
    """:func:`tests.processes.wait_for` at the pace of Airflow's components (1 s)."""
    return wait_for(predicate, timeout, what, interval, on_timeout)


def describe(procs: list[psutil.Process]) -> str:
    """One line per process: pid and (truncated) command line."""
    lines = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            lines.append(f"  pid {proc.pid}: {' '.join(proc.cmdline())[:300]}")
    return "\n".join(lines)


def parse_json_output(out: str, what: str) -> Any:
    """The last line of ``out`` that is a JSON document (Airflow may log warnings to stdout first)."""
    for line in reversed(out.splitlines()):
        if line.lstrip().startswith(("[", "{")):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    with contextlib.suppress(ValueError):
        return json.loads(out[min((i for i in (out.find("\n{"), out.find("\n[")) if i >= 0), default=0):])
    raise AssertionError(f"no JSON document in the output of {what}:\n{out[-3000:]}")


def is_spark(proc: psutil.Process) -> bool:
    """spark-submit wrapper or the SparkSubmit driver JVM."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        cmdline = " ".join(proc.cmdline())
        return "spark-submit" in cmdline or "org.apache.spark.deploy.SparkSubmit" in cmdline
    return False


def kill_leftovers(text: str) -> None:
    """SIGKILL the process group of every process mentioning ``text`` (never the test's own group)."""
    for proc in processes_mentioning(text):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            pgid = os.getpgid(proc.pid)
            if pgid != os.getpgrp():
                os.killpg(pgid, signal.SIGKILL)


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


# -- the database -------------------------------------------------------------------------------


__all__ = ["AirflowCluster", "PostgresDatabase", "cluster_env", "describe", "free_port", "group_processes",
           "kill_leftovers", "parse_json_output", "processes_mentioning", "tail", "wait_until"]


@dataclass
class PostgresDatabase:
    """A throw-away database on the session's PostgreSQL server (tests/services.py starts it on first use)."""

    name: str = field(default_factory=lambda: f"airflow_e2e_{secrets.token_hex(6)}")
    server: PostgresServer = field(default_factory=services.postgres)

    def create(self) -> None:
        """Create the database."""
        self.server.create_database(self.name)

    def create_migrated(self) -> None:
        """Create the database with Airflow's schema: a copy of the session's migrated template (no ``migrate``)."""
        import psycopg2

        template = migrated_template(self.server)
        conn = psycopg2.connect(self.server.dsn(), connect_timeout=5)
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                # PostgreSQL copies the template's files: no interpreter start, no Alembic run.
                cur.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{template}"')
        finally:
            conn.close()

    def drop(self) -> None:
        """Drop the database, closing any connection left open by a killed component."""
        self.server.drop_database(self.name)

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the database."""
        return self.server.url(self.name)

    @property
    def dsn(self) -> str:
        """libpq connection string of the database."""
        return self.server.dsn(self.name)


_template_lock = threading.Lock()
_templates: dict[int, str] = {}


def migrated_template(server: PostgresServer) -> str:
    """The name of a database of ``server`` that ``airflow db migrate`` ran on, once per session and server.

    Every deployment of the suite needs the same schema, and one migration is a fresh Airflow interpreter plus
    Alembic's whole history. Nothing connects to the template afterwards, as ``CREATE DATABASE ... TEMPLATE``
    requires.
    """
    with _template_lock:
        name = _templates.get(server.port)
        if name is None:
            name = f"airflow_template_{secrets.token_hex(6)}"
            server.create_database(name)
            home = Path(tempfile.mkdtemp(prefix="airflow-template-"))
            env = cluster_env(home, server.url(name), free_port(), dags_folder=home, data=LINEITEM)
            result = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True,
                                    timeout=600, stdin=subprocess.DEVNULL)
            if result.returncode != 0:
                server.drop_database(name)
                raise AssertionError(f"airflow db migrate of the template exited {result.returncode}\n"
                                     f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
            _templates[server.port] = name
        return name


# -- the deployment -----------------------------------------------------------------------------


def cluster_env(tmp: Path, db_url: str, api_port: int, dags_folder: Path, data: Path,
                extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every component and CLI call gets (nothing inherited from AIRFLOW_* / SPECULATIVE_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPECULATIVE_"))}
    base_url = f"http://127.0.0.1:{api_port}"
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(tmp / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__FERNET_KEY": _fernet_key(),
        # Task processes reach the metadata through the api-server's Execution API, authenticated with
        # JWTs the scheduler signs: every component must share the secret and know the URL.
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        # The scheduler (LocalExecutor workers) and the triggerer serve their logs on fixed ports by default
        # (8793, 8794): take free ones so that concurrent Airflow instances on this machine do not collide.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        # Only the runs a test creates: unpausing a @daily DAG would otherwise also schedule the latest interval.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__SPECULATIVE__STORE_PATH": str(tmp / "store"),
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}',
        "SPECULATIVE_EXAMPLE_DATA": str(data),
        "SPECULATIVE_EXAMPLE_OUTPUT": str(tmp / "output"),
    })
    env.update(extra or {})
    return env


class AirflowCluster:
    """Airflow components started as subprocesses, each in its own process group, logging to files.

    ``start``/``stop``/``kill``/``restart`` act on one component; ``start_all``/``shutdown`` on all.
    ``cli`` runs the Airflow CLI, ``api`` the public REST API (``all_admins`` makes the SimpleAuthManager
    hand out admin tokens without credentials), and ``diagnostics`` gathers what makes a failure readable.
    """

    def __init__(self, root: Path, db_url: str, *, dags_folder: Path, data: Path = LINEITEM,
                 extra_env: dict[str, str] | None = None) -> None:
        self.root = root
        self.api_port = free_port()
        self.env = cluster_env(root, db_url, self.api_port, dags_folder, data, extra_env)
        self.home = Path(self.env["AIRFLOW_HOME"])
        self.store = Path(self.env["AIRFLOW__SPECULATIVE__STORE_PATH"])
        self.output = Path(self.env["SPECULATIVE_EXAMPLE_OUTPUT"])
        self.logs = self.home / "component-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.base_url = f"http://127.0.0.1:{self.api_port}"
        self._token: str | None = None

    # -- CLI ------------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` with the deployment's environment."""
        result = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {result.returncode}\n"
                                 f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
        return result

    def cli_json(self, *args: str) -> Any:
        """Run ``airflow <args> -o json`` and parse the document (log lines such as warnings may precede it)."""
        return parse_json_output(self.cli(*args, "-o", "json").stdout, f"airflow {' '.join(args)}")

    def migrate(self) -> None:
        """Create the metadata schema."""
        self.cli("db", "migrate", timeout=600)

    # -- components -----------------------------------------------------------------------------

    def _args(self, name: str) -> list[str]:
        if name == "api-server":
            return ["api-server", "--host", "127.0.0.1", "--port", str(self.api_port), "--workers", "1"]
        if name in COMPONENTS:
            return [name]
        raise ValueError(f"unknown component {name!r}; expected one of {COMPONENTS}")

    def start(self, name: str) -> None:
        """Start one component (again, after a kill) in its own session; output goes to its log."""
        if name in self.procs and self.procs[name].poll() is None:
            raise AssertionError(f"{name} is already running (pid {self.procs[name].pid})")
        with open(self.logs / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            log.write(f"\n===== starting {name} at {datetime.now(UTC).isoformat()}\n".encode())
            log.flush()
            self.procs[name] = subprocess.Popen([AIRFLOW, *self._args(name)], env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, cwd=self.home)

    def start_all(self) -> None:
        """Start api-server, scheduler, dag-processor and triggerer."""
        for name in COMPONENTS:
            self.start(name)

    def pid(self, name: str) -> int:
        """Pid (and process group id) of a running component."""
        return self.procs[name].pid

    def kill(self, name: str) -> list[str]:
        """``kill -9`` a component's whole process group (the component and every child it forked, e.g. the
        scheduler's LocalExecutor workers or the triggerer's trigger runner), as a crash of its host would.

        Processes that left the group (attempt supervisors start their own sessions) are not touched.
        Returns a description of the processes killed.
        """
        proc = self.procs.pop(name)
        victims = group_processes(proc.pid)
        killed = describe(victims).splitlines()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until(lambda: not group_processes(proc.pid), 30, f"every process of {name}'s group to be gone",
                   interval=0.2, on_timeout=lambda: describe(group_processes(proc.pid)))
        with open(self.logs / f"{name}.log", "ab") as log:
            log.write(f"\n===== killed (SIGKILL) at {datetime.now(UTC).isoformat()}\n".encode())
        return killed

    def stop(self, name: str | None = None, grace: float = 30.0) -> None:
        """SIGTERM a component's (default: every component's) process group, SIGKILL what is left after
        ``grace`` seconds."""
        procs = {n: p for n, p in self.procs.items() if name is None or n == name}
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in procs.values():
            # The group outlives its leader if a child ignored SIGTERM: kill the group regardless.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for n in procs:
            del self.procs[n]

    def restart(self, name: str) -> None:
        """Stop (SIGTERM) and start one component."""
        self.stop(name)
        self.start(name)

    def shutdown(self) -> None:
        """Stop every component and kill whatever of the store is still running (never leak a Spark driver)."""
        self.stop()
        kill_leftovers(str(self.store))

    def check_alive(self) -> None:
        """Fail with the log tail of any component that exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited with {proc.returncode}; its log ends:\n"
                                     f"{tail(self.logs / f'{name}.log')}")

    # -- health ---------------------------------------------------------------------------------

    def health(self) -> dict[str, Any] | None:
        """The api-server's health document, or None if it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/v2/monitor/health", timeout=5) as r:
                return json.load(r)
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def healthy(self) -> bool:
        """Metadatabase, scheduler, triggerer and dag-processor all reported healthy."""
        self.check_alive()
        health = self.health() or {}
        wanted = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((health.get(part) or {}).get("status") == "healthy" for part in wanted)

    def wait_healthy(self, timeout: float = 240) -> None:
        """Wait until :meth:`healthy`."""
        wait_until(self.healthy, timeout, "api-server, scheduler, dag-processor and triggerer to be healthy",
                   interval=1, on_timeout=self.diagnostics)

    def heartbeat(self, name: str) -> datetime | None:
        """Latest heartbeat of a component's job as the health endpoint reports it."""
        key = HEALTH_KEYS[name]
        part = (self.health() or {}).get(key) or {}
        return _parse_time(part.get(f"latest_{key}_heartbeat"))

    def wait_component_restarted(self, name: str, since: datetime, timeout: float = 240) -> None:
        """Wait until the component heartbeats again after ``since`` (the new process is working)."""
        def beating() -> bool:
            self.check_alive()
            latest = self.heartbeat(name)
            return latest is not None and latest > since

        wait_until(beating, timeout, f"the restarted {name} to heartbeat", interval=1,
                   on_timeout=lambda: tail(self.logs / f"{name}.log"))

    # -- REST API -------------------------------------------------------------------------------

    def token(self) -> str:
        """An admin JWT (needs ``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True``)."""
        if self._token is None:
            with urllib.request.urlopen(f"{self.base_url}/auth/token", timeout=30) as r:
                self._token = json.load(r)["access_token"]
        return self._token

    def api(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        """Call the public REST API (``path`` below ``/api/v2``) and return the JSON answer."""
        request = urllib.request.Request(
            f"{self.base_url}/api/v2{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path} answered {exc.code}: {exc.read()[:2000]!r}") from exc

    def dag_runs(self, dag_id: str) -> dict[str, dict[str, Any]]:
        """Every run of ``dag_id`` by run id."""
        answer = self.api("GET", f"/dags/{quote(dag_id, safe='')}/dagRuns?limit=100")
        return {r["dag_run_id"]: r for r in answer["dag_runs"]}

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """Task instances of a run by task id."""
        answer = self.api("GET", f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances")
        return {ti["task_id"]: ti for ti in answer["task_instances"]}

    def wait_runs_finished(self, dag_id: str, run_ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        """Wait until every run in ``run_ids`` is success or failed; return them (components must stay up)."""
        def finished() -> dict[str, dict[str, Any]] | None:
            self.check_alive()
            runs = self.dag_runs(dag_id)
            missing = [r for r in run_ids if r not in runs]
            assert not missing, f"runs {missing} not listed: {sorted(runs)}"
            chosen = {r: runs[r] for r in run_ids}
            return chosen if all(r["state"] in ("success", "failed") for r in chosen.values()) else None

        return wait_until(finished, timeout, f"runs {run_ids} of {dag_id} to finish", interval=1)

    # The helpers below go through the REST API, not the CLI: every ``airflow`` command is a fresh interpreter
    # importing Airflow, seconds of CPU on the cores the deployment's components and Spark attempts share.
    # Tests that check the CLI itself call ``cli`` directly.

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG as the REST API lists it, or None while the dag-processor has not serialized it."""
        request = urllib.request.Request(f"{self.base_url}/api/v2/dags/{quote(dag_id, safe='')}",
                                         headers={"Authorization": f"Bearer {self.token()}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise AssertionError(f"GET /dags/{dag_id} answered {exc.code}: {exc.read()[:2000]!r}") from exc

    def wait_dag(self, dag_id: str, timeout: float = 240) -> None:
        """Wait until the dag-processor serialized ``dag_id``."""
        def serialized() -> bool:
            self.check_alive()
            return self.dag(dag_id) is not None

        wait_until(serialized, timeout, f"the dag-processor to serialize {dag_id}", interval=1,
                   on_timeout=lambda: self.cli("dags", "list-import-errors", check=False).stdout)

    def unpause(self, dag_id: str) -> None:
        """Unpause ``dag_id`` (as ``airflow dags unpause`` does)."""
        answer = self.api("PATCH", f"/dags/{quote(dag_id, safe='')}", {"is_paused": False})
        assert answer["is_paused"] is False, answer

    def trigger(self, dag_id: str, logical_date: str) -> str:
        """Trigger a manual run of ``dag_id`` at ``logical_date`` (as ``airflow dags trigger`` does); its run id."""
        run = self.api("POST", f"/dags/{quote(dag_id, safe='')}/dagRuns", {"logical_date": logical_date})
        return str(run["dag_run_id"])

    # -- diagnostics ----------------------------------------------------------------------------

    def diagnostics(self, lines: int = 60) -> str:
        """Tails of the component logs, the task logs and the Spark attempt logs, attempt states, journals."""
        parts = [f"===== health: {self.health()}"]
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"===== {log.name} (last {lines} lines)\n{tail(log, lines)}")
        for log in sorted((self.home / "logs").rglob("*.log")):
            if "dag_id=" in str(log):
                parts.append(f"===== task log {log.relative_to(self.home)}\n{tail(log, lines)}")
        for status in sorted(self.store.rglob("status.json")):
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(status.read_text()).get("state")
                parts.append(f"===== attempt {status.parent.relative_to(self.store)}: {state}")
                if state != "FINISHED":  # the Spark log of every attempt that did not finish
                    for log in sorted(status.parent.glob("*.log")):
                        parts.append(f"----- {log.name}\n{tail(log, 25)}")
        for journal in sorted(self.store.rglob("journal.jsonl")):
            parts.append(f"===== {journal.relative_to(self.store)}\n{tail(journal, 20)}")
        return "\n".join(parts)
