"""End to end as users deploy it: PostgreSQL + LocalExecutor, api-server, scheduler, dag-processor, triggerer.

The example DAG ``dags/tpch_q1.py`` is triggered through the CLI, its two stages run as real Spark
submissions launched by the deferred stage controller in the triggerer, and the committed output must
equal DuckDB's TPC-H Q1 over the same lineitem files.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.q1 import assert_q1_equal, duckdb_q1, output_decimal_scales, read_q1_output

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
LINEITEM = REPO / ".data" / "tpch" / "lineitem"
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}

DAG_ID = "tpch_q1"
LOGICAL_DATE = "2026-01-01T00:00:00+00:00"
DS = "2026-01-01"


# -- helpers ------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0,
               on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text[-lines:])


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line mentions ``text``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(text in a for a in proc.info["cmdline"] or []):
                found.append(proc)
    return found


def describe(procs: list[psutil.Process]) -> str:
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


@dataclass
class PostgresDatabase:
    """A throw-away database on the local PostgreSQL server."""

    name: str = field(default_factory=lambda: f"airflow_e2e_{secrets.token_hex(6)}")

    def _admin(self) -> Any:
        import psycopg2

        conn = psycopg2.connect(dbname="postgres", connect_timeout=5, **PG)
        conn.autocommit = True
        return conn

    def create(self) -> None:
        with contextlib.closing(self._admin()) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        with contextlib.closing(self._admin()) as conn, conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{PG['user']}@{PG['host']}:{PG['port']}/{self.name}"


class Deployment:
    """Airflow components started as subprocesses, each in its own process group, logging to files."""

    def __init__(self, home: Path, env: dict[str, str], api_port: int) -> None:
        self.home = home
        self.env = env
        self.api_port = api_port
        self.logs = home / "component-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # commands
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

    # components
    def start(self, name: str, *args: str) -> None:
        with open(self.logs / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen([AIRFLOW, *args], env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, cwd=self.home)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited with {proc.returncode}; its log ends:\n"
                                     f"{tail(self.logs / f'{name}.log')}")

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/api/v2/monitor/health", timeout=5) as r:
                return json.load(r)
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def healthy(self) -> bool:
        self.check_alive()
        health = self.health() or {}
        wanted = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((health.get(part) or {}).get("status") == "healthy" for part in wanted)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every component's process group, SIGKILL what is left after ``grace`` seconds."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            # The group outlives its leader if a child ignored SIGTERM: kill the group regardless.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def diagnostics(self, lines: int = 60) -> str:
        """Tails of the component logs, the task logs and the Spark attempt logs."""
        parts = [f"===== health: {self.health()}"]
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"===== {log.name} (last {lines} lines)\n{tail(log, lines)}")
        for log in sorted((self.home / "logs").rglob("*.log")):
            if "dag_id=" in str(log):
                parts.append(f"===== task log {log.relative_to(self.home)}\n{tail(log, lines)}")
        store = Path(self.env["AIRFLOW__SPECULATIVE__STORE_PATH"])
        for status in sorted(store.rglob("status.json")):
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(status.read_text()).get("state")
                parts.append(f"===== attempt {status.parent.relative_to(store)}: {state}")
                if state != "FINISHED":  # the Spark log of every attempt that did not finish
                    for log in sorted(status.parent.glob("*.log")):
                        parts.append(f"----- {log.name}\n{tail(log, 25)}")
        for journal in sorted(store.rglob("journal.jsonl")):
            parts.append(f"===== {journal.relative_to(store)}\n{tail(journal, 20)}")
        return "\n".join(parts)


def deployment_env(tmp: Path, db_url: str, api_port: int) -> dict[str, str]:
    """The environment every component and CLI call gets (nothing inherited from AIRFLOW_* / SPECULATIVE_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPECULATIVE_"))}
    base_url = f"http://127.0.0.1:{api_port}"
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(tmp / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
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
        # Only the run we trigger: unpausing a @daily DAG would otherwise also schedule the latest interval.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__SPECULATIVE__STORE_PATH": str(tmp / "store"),
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}',
        "SPECULATIVE_EXAMPLE_DATA": str(LINEITEM),
        "SPECULATIVE_EXAMPLE_OUTPUT": str(tmp / "output"),
    })
    return env


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def lineitem() -> Path:
    if not sorted(LINEITEM.glob("lineitem.*.parquet")):
        pytest.skip(f"TPC-H lineitem data missing at {LINEITEM}: run `make data` first")
    return LINEITEM


@pytest.fixture
def postgres_db() -> Iterator[PostgresDatabase]:
    import psycopg2

    db = PostgresDatabase()
    try:
        db.create()
    except psycopg2.OperationalError as exc:
        pytest.skip(f"local PostgreSQL not reachable at {PG['host']}:{PG['port']} as {PG['user']}: {exc}")
    yield db
    db.drop()


@pytest.fixture
def deployment(tmp_path: Path, postgres_db: PostgresDatabase) -> Iterator[Deployment]:
    """Migrated DB, then api-server, scheduler, dag-processor and triggerer, all healthy; torn down after."""
    api_port = free_port()
    env = deployment_env(tmp_path, postgres_db.url, api_port)
    dep = Deployment(tmp_path / "airflow", env, api_port)
    store = env["AIRFLOW__SPECULATIVE__STORE_PATH"]
    try:
        dep.cli("db", "migrate", timeout=600)
        dep.start("api-server", "api-server", "--host", "127.0.0.1", "--port", str(api_port), "--workers", "1")
        dep.start("scheduler", "scheduler")
        dep.start("dag-processor", "dag-processor")
        dep.start("triggerer", "triggerer")
        wait_until(dep.healthy, 240, "api-server, scheduler, dag-processor and triggerer to be healthy",
                   interval=2, on_timeout=dep.diagnostics)
        yield dep
    finally:
        dep.stop()
        # Whatever happened, leave no Spark driver behind (the test asserts there is none on success).
        for proc in processes_mentioning(store):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                pgid = os.getpgid(proc.pid)
                if pgid != os.getpgrp():
                    os.killpg(pgid, signal.SIGKILL)


# -- the test -----------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_tpch_q1_runs_under_scheduler_and_triggerer(lineitem: Path, deployment: Deployment, tmp_path: Path):
    try:
        run_and_check(deployment, lineitem, tmp_path)
    except BaseException:  # also pytest-timeout's failure: print what makes it diagnosable
        print(f"\n{deployment.diagnostics()}")
        raise


def run_and_check(dep: Deployment, lineitem: Path, tmp_path: Path) -> None:
    """Trigger the example DAG, wait for its run, check output and store, then stop Airflow and check for leaks."""
    store = Path(dep.env["AIRFLOW__SPECULATIVE__STORE_PATH"])
    started = time.monotonic()

    def dag_serialized() -> bool:
        dep.check_alive()
        return any(d.get("dag_id") == DAG_ID for d in dep.cli_json("dags", "list"))

    def import_errors() -> str:
        return dep.cli("dags", "list-import-errors", check=False).stdout

    wait_until(dag_serialized, 240, f"the dag-processor to serialize {DAG_ID}", interval=2, on_timeout=import_errors)

    dep.cli("dags", "unpause", DAG_ID)
    triggered = dep.cli_json("dags", "trigger", DAG_ID, "--logical-date", LOGICAL_DATE)
    run = triggered[0] if isinstance(triggered, list) else triggered
    run_id = run.get("dag_run_id") or run["run_id"]

    def run_finished() -> dict[str, Any] | None:
        dep.check_alive()
        runs = {r["run_id"]: r for r in dep.cli_json("dags", "list-runs", DAG_ID)}
        assert run_id in runs, f"run {run_id} not listed: {sorted(runs)}"
        return runs[run_id] if runs[run_id]["state"] in ("success", "failed") else None

    final = wait_until(run_finished, 600, f"run {run_id} to finish", interval=5)
    print(f"\n{DAG_ID} run {run_id}: {final['state']} after {time.monotonic() - started:.0f}s "
          f"(trigger to finish, including DAG parsing)")
    assert final["state"] == "success", f"run {run_id} is {final['state']}"

    # The committed sink output: a _SUCCESS manifest and exactly TPC-H Q1.
    output = tmp_path / "output" / DAG_ID / DS
    assert output.is_dir(), f"{output} was not committed"
    manifest = json.loads((output / "_SUCCESS").read_text())
    assert manifest["dag_id"] == DAG_ID and manifest["run_id"] == run_id
    assert sorted(f["path"] for f in manifest["files"]) == sorted(
        p.name for p in output.glob("*.parquet") if not p.name.startswith((".", "_")))
    assert_q1_equal(read_q1_output(output), duckdb_q1(lineitem), scales=output_decimal_scales(output))

    # The store, as the CLI reports it: both stages, one admitted FINISHED attempt per subtask.
    status = dep.cli("speculative", "status", "--dag-id", DAG_ID, "--run-id", run_id, "--output", "json")
    report = parse_json_output(status.stdout, "airflow speculative status")
    stages = {s["stage"]: s for s in report["stages"]}
    assert [s["stage"] for s in report["stages"]] == ["scan", "aggregate"]
    assert {name: s["parallelism"] for name, s in stages.items()} == {"scan": 8, "aggregate": 2}
    for name, stage in stages.items():
        assert stage["committed"], f"stage {name} not committed"
        assert len(stage["subtasks"]) == stage["parallelism"]
        for sub in stage["subtasks"]:
            attempts = [(a["attempt"], a["state"], a["admitted"], a["speculative"]) for a in sub["attempts"]]
            assert attempts == [(0, "FINISHED", True, False)], f"stage {name} subtask {sub['subtask']}: {attempts}"
            assert sub["admitted"] == 0

    # Shut everything down: no spark-submit or SparkSubmit driver of this store may be left behind.
    dep.stop()
    wait_until(lambda: not processes_mentioning(str(store)), 15, "every attempt process to have exited",
               interval=0.5, on_timeout=lambda: describe(processes_mentioning(str(store))))
    spark = [p for p in processes_mentioning(str(tmp_path)) if is_spark(p)]
    assert not spark, f"Spark processes left behind:\n{describe(spark)}"
