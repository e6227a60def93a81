"""Start a real Airflow on the demo's home with the plugin, trigger the example and print where to look.

``make ui`` runs this with the demo's environment (AIRFLOW_HOME=.demo/airflow, its DAGs folder and store).
It starts a warm pool of local Spark Connect servers as the attempts' targets (``--pool 2``, as ``make
demo`` does; ``--pool 0``: the built-in spark-submit targets), then the api-server, scheduler,
dag-processor and triggerer (LocalExecutor, each in its own process group, logs in
``$AIRFLOW_HOME/ui-logs/``), creates a SimpleAuthManager login (``admin``, password in
``$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated``), unpauses and triggers the DAG, and prints
the URL of the run's "Speculative stages" view with the credentials. Ctrl-C (SIGINT) or SIGTERM stops
every component and every attempt the run launched (attempt supervisors run in their own sessions) and
the pool, and exits once no process is left.

The settings every component needs to talk to the others are those tests/integration/airflow_cluster.py
uses for the end-to-end tests (shared JWT secret, Execution API URL, free log-server ports).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from airflow_provider_speculative.exceptions import SpeculativeError

BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
PORTS = range(28100, 28200)
POOL_PORTS = range(15200, 15300, 2)  # gRPC ports of a pool's first server (the next one is +1)
POOL_UI_PORTS = range(4200, 4300, 2)
USER = "admin"
STOP_GRACE = 20.0


def free_port(candidates: range | None = None) -> int:
    """The first free loopback port among ``candidates`` (any free port if None)."""
    for port in candidates or [0]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise SystemExit(f"error: no free port in {candidates.start}-{candidates.stop - 1}; pass --port")


def _secrets(home: Path) -> dict[str, str]:
    """Keys kept across starts (a restarted UI must read what the previous one encrypted or signed)."""
    path = home / "ui-secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    from cryptography.fernet import Fernet

    values = {"fernet_key": Fernet.generate_key().decode(), "api_secret": secrets.token_urlsafe(32),
              "jwt_secret": secrets.token_urlsafe(32)}
    path.write_text(json.dumps(values))
    path.chmod(0o600)
    return values


def _password(home: Path) -> str:
    """The admin password: the generated one kept in the passwords file, else a new one written there."""
    path = home / "simple_auth_manager_passwords.json.generated"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return json.loads(path.read_text())[USER]
    password = secrets.token_urlsafe(12)
    path.write_text(json.dumps({USER: password}))
    path.chmod(0o600)
    return password


def ui_env(base: dict[str, str], home: Path, port: int) -> dict[str, str]:
    """The environment of every component: the demo's plus what a multi-process Airflow needs."""
    keys = _secrets(home)
    url = f"http://127.0.0.1:{port}"
    env = dict(base)
    # Stage tasks defer at once; a few LocalExecutor workers are plenty and spare a small machine.
    env.setdefault("AIRFLOW__CORE__PARALLELISM", "4")
    # SQLite serialises the components' writes; on a busy machine a task's first Execution API call
    # can wait tens of seconds for the lock. The default 5 s timeout then retries a call that already
    # succeeded (the task is "running"), which fails the task.
    env.setdefault("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT", "120")
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__FERNET_KEY": keys["fernet_key"],
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "simple_auth_manager_passwords.json.generated"),
        # Task processes reach the metadata through the api-server's Execution API with JWTs the
        # scheduler signs: every component must share the secret and know the URL.
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": keys["api_secret"],
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        # Fixed default log-server ports (8793, 8794) would collide with another Airflow on this machine.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        # Only the run this script triggers: unpausing a @daily DAG would also schedule the latest interval.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
    })
    return env


class Airflow:
    """The four components as subprocesses, each in its own session, logging to ``ui-logs/``."""

    def __init__(self, env: dict[str, str], home: Path, port: int) -> None:
        self.env, self.home, self.port = env, home, port
        self.url = f"http://127.0.0.1:{port}"
        self.logs = home / "ui-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._token: str | None = None

    def start(self) -> None:
        """Start every component."""
        for name in COMPONENTS:
            args = ["api-server", "--host", "127.0.0.1", "--port", str(self.port)] if name == "api-server" else [name]
            with open(self.logs / f"{name}.log", "ab") as log:
                log.write(f"\n===== starting {name} at {datetime.now(UTC).isoformat()}\n".encode())
                log.flush()
                self.procs[name] = subprocess.Popen([AIRFLOW, *args], env=self.env, stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True, cwd=self.home)

    def check_alive(self) -> None:
        """Raise with the log's end if a component exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-40:]
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}; its log ends:\n" + "\n".join(log))

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, auth: bool = True) -> Any:
        """Call the api-server and return the JSON answer."""
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(f"{self.url}{path}", method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)

    def token(self) -> str:
        """A JWT for the admin login."""
        if self._token is None:
            self._token = self.request("POST", "/auth/token", {"username": USER, "password": _password(self.home)},
                                       auth=False)["access_token"]
        return self._token

    def healthy(self) -> bool:
        """Metadatabase, scheduler, triggerer and dag-processor report healthy."""
        self.check_alive()
        try:
            health = self.request("GET", "/api/v2/monitor/health", auth=False)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return all((health.get(p) or {}).get("status") == "healthy"
                   for p in ("metadatabase", "scheduler", "triggerer", "dag_processor"))

    def has_dag(self, dag_id: str) -> bool:
        """The dag-processor serialized ``dag_id``."""
        self.check_alive()
        try:
            self.request("GET", f"/api/v2/dags/{quote(dag_id, safe='')}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    def stop(self) -> None:
        """SIGTERM every component's group, SIGKILL what is left after a grace period."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            # A child that ignored SIGTERM (a task process, the trigger runner) keeps the group alive.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def wait(predicate: Any, timeout: float, what: str, interval: float = 1.0) -> Any:
    """Poll ``predicate`` until truthy; raise naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def kill_attempts(store: str) -> int:
    """SIGKILL the process group of every process whose command line names the store (attempt supervisors
    and the Spark work in their groups); return how many groups."""
    groups = set()
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(store in a for a in proc.info["cmdline"] or []):
                pgid = os.getpgid(proc.pid)
                if pgid != os.getpgrp():
                    groups.add(pgid)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return len(groups)


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived."""


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """Run until interrupted; 0 after a clean stop, 1 if Airflow could not start."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=None, help="api-server port (default: first free in 28100-28199)")
    parser.add_argument("--dag-id", default="tpch_q1")
    parser.add_argument("--logical-date", default=None, help="of the triggered run (default: now)")
    parser.add_argument("--no-trigger", action="store_true", help="only start Airflow")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for Airflow to be ready")
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres",
                        help="metadata DB: a throw-away PostgreSQL (default) or the demo's SQLite (keeps runs)")
    parser.add_argument("--pool", type=int, default=2, choices=range(0, 5), metavar="N",
                        help="local Spark Connect servers to run attempts on (default 2; 0: spark-submit targets)")
    parser.add_argument("--warm-up-rounds", type=int, default=None, metavar="N",
                        help="rounds of the warm-up query each server runs first (default 4; 0: none)")
    args = parser.parse_args(argv)
    if args.warm_up_rounds is not None and args.warm_up_rounds < 0:
        parser.error(f"--warm-up-rounds {args.warm_up_rounds}: expected 0 or more")
    if "AIRFLOW_HOME" not in os.environ:
        print("error: AIRFLOW_HOME is not set: run `make ui`, or `source .demo/env.sh` first", file=sys.stderr)
        return 1
    home = Path(os.environ["AIRFLOW_HOME"]).resolve()
    home.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port(PORTS)
    # The run's fork servers (warm starts of Connect attempts) are the script's own: a private runtime
    # directory, so stopping them at the end touches no other Airflow of this user.
    runtime = tempfile.mkdtemp(prefix="spec-ui-")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    env = ui_env(dict(os.environ), home, port)
    password = _password(home)
    # Raise into the main flow on Ctrl-C / SIGTERM, so the same clean-up runs whatever was happening.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    store = None
    code = 0
    pool = None
    airflow = None
    database = None
    try:
        if args.db == "postgres":
            # LocalExecutor's workers and the four components write at once: SQLite serialises them.
            from airflow_provider_speculative.devtools.services import start_postgres

            database = start_postgres()
            database.create_database("airflow")
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = database.url("airflow")
            print(f"metadata DB: a throw-away PostgreSQL on 127.0.0.1:{database.port} (gone after Ctrl-C; "
                  "the store keeps the run's attempts)", flush=True)
        if args.pool:
            pool = start_pool(home, args.pool, env, args.warm_up_rounds)
        airflow = Airflow(env, home, port)
        print(f"migrating the metadata DB of {home} ...", flush=True)
        subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        store = subprocess.run([AIRFLOW, "config", "get-value", "speculative", "store_path"], env=env, check=True,
                               capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout.strip().splitlines()[-1]
        print(f"starting {', '.join(COMPONENTS)} (logs: {airflow.logs}) ...", flush=True)
        airflow.start()
        wait(airflow.healthy, args.timeout, "Airflow to be healthy", interval=2)
        run_url = f"{airflow.url}/dags/{quote(args.dag_id, safe='')}"
        if not args.no_trigger:
            wait(lambda: airflow.has_dag(args.dag_id), args.timeout, f"the dag-processor to parse {args.dag_id}",
                 interval=2)
            airflow.request("PATCH", f"/api/v2/dags/{quote(args.dag_id, safe='')}", {"is_paused": False})
            logical = args.logical_date or datetime.now(UTC).isoformat(timespec="seconds")
            run = airflow.request("POST", f"/api/v2/dags/{quote(args.dag_id, safe='')}/dagRuns",
                                  {"logical_date": logical, "conf": {}})
            run_id = run["dag_run_id"]
            run_url = f"{run_url}/runs/{quote(run_id, safe='')}/plugin/speculative-run"
            print(f"triggered {args.dag_id} run {run_id}", flush=True)
        print(f"\nAirflow UI:   {airflow.url}/\nRun view:     {run_url}\n"
              f"Login:        {USER} / {password}\n"
              f"CLI:          source .demo/env.sh; airflow speculative status --dag-id {args.dag_id} --run-id <run id>"
              f" --watch\nPress Ctrl-C to stop Airflow and every attempt it started.", flush=True)
        while True:
            airflow.check_alive()
            time.sleep(1)
    except Interrupted as exc:
        print(f"\n{exc}: stopping ...", flush=True)
    except (RuntimeError, SpeculativeError, subprocess.CalledProcessError, urllib.error.URLError) as exc:
        detail = exc.stderr.decode(errors="replace")[-2000:] if isinstance(exc, subprocess.CalledProcessError) else ""
        print(f"error: {exc}\n{detail}", file=sys.stderr, flush=True)
        code = 1
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if airflow is not None:
            airflow.stop()
        killed = kill_attempts(store) if store else 0
        print(f"stopped Airflow{f' and {killed} attempt process group(s)' if killed else ''}", flush=True)
        from airflow_provider_speculative.backends import forkserver

        forkserver.stop_servers()
        shutil.rmtree(runtime, ignore_errors=True)
        if pool is not None:
            for info, what in pool.stop():
                print(f"{info.name}: {what}", flush=True)
        if database is not None:
            database.stop()
    return code


def start_pool(home: Path, servers: int, env: dict[str, str], warm_up_rounds: int | None = None) -> Any:
    """Start the warm Connect servers (their ports free now) and point every component's targets at them."""
    from airflow_provider_speculative.devtools.localcluster import (
        LocalCluster,
        connection_definitions,
        targets_json,
    )

    def pair_free(base: int) -> bool:
        return all(_port_free(base + i) for i in range(servers))

    base = next((p for p in POOL_PORTS if pair_free(p)), None)
    ui_base = next((p for p in POOL_UI_PORTS if pair_free(p)), None)
    if base is None or ui_base is None:
        raise RuntimeError(f"no {servers} consecutive free ports in {POOL_PORTS} / {POOL_UI_PORTS} for the pool")
    cluster = LocalCluster(home / "local-cluster")
    print(f"starting {servers} warm Spark Connect server(s) (logs: {cluster.dir}) ...", flush=True)
    started, running = cluster.start(servers=servers, base_port=base, ui_base_port=ui_base,
                                     warm_up_rounds=warm_up_rounds)
    pool = sorted(started + running, key=lambda s: s.name)
    env.update(connection_definitions(pool))
    env["AIRFLOW__SPECULATIVE__TARGETS"] = targets_json(pool)
    print("targets: " + ", ".join(f"{s.name} (Spark Connect on port {s.port})" for s in pool), flush=True)
    return cluster


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
