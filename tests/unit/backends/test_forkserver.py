"""The fork server with real processes: warm launches, exit codes, cancel, a dead or stale server, idle exit.

No Spark: the applications are small Python scripts. Each test has its own runtime directory (so its
own server), and every server it started is killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from airflow_provider_speculative.backends import forkserver, warmstart
from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.backends.supervised import SupervisedBackend
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.store.files import atomic_write_json, read_json
from airflow_provider_speculative.store.layout import StageLayout

APP = """
import os, sys, time
from pathlib import Path
print("image:", "warm" if "pyspark.sql.connect.session" in sys.modules else "cold", flush=True)
print("argv:", sys.argv[1:], "path0:", sys.path[0], "var:", os.environ.get("ATTEMPT_VAR"), flush=True)
print("group:", os.getpgid(0) == os.getpgid(os.getppid()), flush=True)
Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
mode = os.environ.get("MODE", "ok")
if mode == "sleep":
    time.sleep(600)
if mode == "raise":
    raise ValueError("boom from the application")
if mode == "exit3":
    sys.exit(3)
if mode == "message":
    sys.exit("a message to stderr")
Path(os.environ["MANIFEST"]).write_text('{"files": [], "records": 0}')
"""


@pytest.fixture()
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime directory short enough for a Unix socket path; its servers are killed at the end."""
    base = Path(tempfile.mkdtemp(prefix="fs", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    monkeypatch.setitem(forkserver._state, "started", {})
    yield base
    for proc in psutil.process_iter(["cmdline"]):
        if str(base) in " ".join(proc.info["cmdline"] or []):
            proc.kill()
    if os.environ.get("KEEP_FS") is None:
        shutil.rmtree(base, ignore_errors=True)


def _server_pids(base: Path) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "forkserver" in " ".join(p.info["cmdline"] or []) and str(base) in " ".join(p.info["cmdline"] or [])]


def _until(predicate, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Attempts:
    """Launch real attempts of a one-file application through a SupervisedBackend."""

    def __init__(self, root: Path, fork_server: bool = True) -> None:
        self.layout = StageLayout(root / "store", "d", "r", "s")
        self.backend = SupervisedBackend(self.layout)
        self.backend.fork_server = fork_server
        self.app = root / "apps" / "app.py"
        self.app.parent.mkdir(parents=True, exist_ok=True)
        self.app.write_text(APP)
        self.count = 0

    def launch(self, mode: str = "ok", command: list[str] | None = None) -> int:
        number = self.count
        self.count += 1
        self.layout.attempt_dir(0, number).mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.layout.claim(0, number), {"target": "t", "created_at": time.time()})
        env = {"ATTEMPT_VAR": f"value-{number}", "MODE": mode, "PID_FILE": str(self.pid_file(number)),
               "MANIFEST": str(self.layout.manifest(0, number))}
        self.backend.launch(LaunchSpec(0, number, "t", "n", False,
                                       command or [sys.executable, str(self.app), "--x", str(number)], env))
        return number

    def pid_file(self, number: int) -> Path:
        return self.layout.attempt_dir(0, number) / "app.pid"

    def app_pid(self, number: int) -> int | None:
        """The application's pid once its pid file is written whole (it is created before it is written)."""
        try:
            text = self.pid_file(number).read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def status(self, number: int) -> dict:  # type: ignore[type-arg]
        return read_json(self.layout.status(0, number)) or {}

    def ended(self, number: int) -> dict:  # type: ignore[type-arg]
        _until(lambda: self.status(number).get("end_at") is not None, f"attempt {number} to end")
        return self.status(number)

    def log(self, number: int) -> str:
        return self.layout.log(0, number).read_text()


def _warm_server(runtime: Path) -> None:
    forkserver.prestart()
    assert forkserver.serving(timeout=120), (runtime / "log").as_posix()


def test_a_warm_attempt_runs_like_a_fresh_interpreter(runtime: Path, tmp_path: Path) -> None:
    _warm_server(runtime)
    attempts = Attempts(tmp_path)
    numbers = [attempts.launch() for _ in range(3)]
    for number in numbers:
        status = attempts.ended(number)
        assert status["state"] == "FINISHED" and status["exit_code"] == 0
        log = attempts.log(number)
        # Forked from the server's image, with its own argv, script directory, environment and group.
        assert "image: warm" in log
        assert f"argv: ['--x', '{number}'] path0: {attempts.app.parent}" in log
        assert f"var: value-{number}" in log and "group: True" in log
        assert status["child_pid"] == int(attempts.pid_file(number).read_text())
    assert len(_server_pids(runtime)) == 1


@pytest.mark.parametrize(("mode", "code", "text"), [("exit3", 3, None), ("raise", 1, "ValueError: boom"),
                                                     ("message", 1, "a message to stderr")])
def test_a_warm_attempt_exits_as_the_interpreter_would(runtime: Path, tmp_path: Path, mode: str, code: int,
                                                       text: str | None) -> None:
    _warm_server(runtime)
    attempts = Attempts(tmp_path)
    status = attempts.ended(attempts.launch(mode))
    assert status["state"] == "FAILED" and status["exit_code"] == code
    assert "image: warm" in attempts.log(0)
    if text:
        assert text in attempts.log(0)


def test_cancel_stops_a_warm_attempt_and_its_group(runtime: Path, tmp_path: Path) -> None:
    _warm_server(runtime)
    attempts = Attempts(tmp_path)
    number = attempts.launch("sleep")
    _until(lambda: attempts.app_pid(number) is not None, "the application to start")
    app_pid = attempts.app_pid(number)
    assert app_pid is not None
    # Both forked processes show the command lines they would have had (what ps and leak checks look for).
    supervisor = psutil.Process(attempts.status(number)["pid"])
    assert str(attempts.layout.status(0, number)) in " ".join(supervisor.cmdline())
    assert f"{attempts.app} --x {number}" in " ".join(psutil.Process(app_pid).cmdline())
    attempts.backend.cancel(0, number, "test")
    status = attempts.ended(number)
    assert status["state"] == "CANCELED"
    _until(lambda: not psutil.pid_exists(app_pid) or psutil.Process(app_pid).status() == psutil.STATUS_ZOMBIE,
           "the application to be gone")
    assert attempts.backend.poll(0, number).state == AttemptState.CANCELED


def test_a_command_that_is_not_this_python_runs_as_a_subprocess(runtime: Path, tmp_path: Path) -> None:
    _warm_server(runtime)
    attempts = Attempts(tmp_path)
    number = attempts.launch(command=["/bin/sh", "-c", 'echo "shell $ATTEMPT_VAR"; exit 7'])
    status = attempts.ended(number)
    assert status["exit_code"] == 7 and "shell value-0" in attempts.log(number)


def test_without_a_server_the_first_launch_starts_cold_and_starts_one(runtime: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkserver, "FIRST_START_WAIT", 0.0)
    attempts = Attempts(tmp_path)
    attempts.ended(attempts.launch())
    assert "image: cold" in attempts.log(0)
    assert forkserver.serving(timeout=120)
    attempts.ended(attempts.launch())
    assert "image: warm" in attempts.log(1)


def test_a_killed_server_is_replaced_and_no_launch_is_lost(runtime: Path, tmp_path: Path) -> None:
    _warm_server(runtime)
    [old] = _server_pids(runtime)
    os.kill(old, signal.SIGKILL)
    _until(lambda: not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE, "it to die")
    assert forkserver.socket_path().exists()  # type: ignore[union-attr]  # a stale socket is left behind
    forkserver._state["started"].clear()  # a new launcher process
    attempts = Attempts(tmp_path)
    status = attempts.ended(attempts.launch())
    assert status["state"] == "FINISHED"  # cold or warm, but started exactly once
    _until(lambda: forkserver.serving() and _server_pids(runtime) not in ([], [old]), "a new server")


def test_an_idle_server_unpublishes_its_socket_and_exits(runtime: Path) -> None:
    path = forkserver.socket_path()
    assert path is not None
    proc = subprocess.Popen([sys.executable, "-m", "airflow_provider_speculative.backends.forkserver",
                             "--socket", str(path), "--idle-timeout", "0.5"], cwd=str(path.parent))
    assert proc.wait(timeout=120) == 0
    assert not path.exists()


def test_a_second_server_of_the_same_key_steps_aside(runtime: Path) -> None:
    _warm_server(runtime)
    path = forkserver.socket_path()
    second = subprocess.run([sys.executable, "-m", "airflow_provider_speculative.backends.forkserver",
                             "--socket", str(path)], timeout=120)
    assert second.returncode == 0 and forkserver.serving() and len(_server_pids(runtime)) == 1


def test_stop_ends_the_server_but_not_the_attempts_it_started(runtime: Path, tmp_path: Path) -> None:
    _warm_server(runtime)
    (row,) = forkserver.servers()
    assert row["running"] and row["serving"] and row["current"] and row["pid"] in _server_pids(runtime)
    attempts = Attempts(tmp_path)
    number = attempts.launch("sleep")
    _until(lambda: attempts.app_pid(number) is not None, "the warm attempt to run")
    (stopped,) = forkserver.stop_servers()
    assert stopped["stopped"] and not _server_pids(runtime)
    assert not Path(row["socket"]).exists(), "a stopped server unpublishes its socket"
    (after,) = forkserver.servers()
    assert not after["running"] and after["pid"] is None
    # Its attempts run on: a supervisor is detached into a session of its own.
    assert attempts.status(number).get("end_at") is None and psutil.pid_exists(attempts.status(number)["pid"])
    attempts.backend.cancel(0, number, "test over")
    assert attempts.ended(number)["state"] == "CANCELED"


def test_stop_never_signals_a_pid_that_is_not_the_server(runtime: Path) -> None:
    path = forkserver.socket_path()
    assert path is not None
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Path(f"{path}.lock").write_text(f"{bystander.pid}\n")  # a stale record whose pid was reused
        assert forkserver.servers()[0]["pid"] is None
        assert forkserver.stop_servers() == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_runtime_directory_others_can_enter_is_not_used(runtime: Path, tmp_path: Path) -> None:
    directory = forkserver.runtime_dir()
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    assert forkserver.socket_path() is None
    attempts = Attempts(tmp_path)
    status = attempts.ended(attempts.launch())
    assert status["state"] == "FINISHED" and "image: cold" in attempts.log(0) and not _server_pids(runtime)


@contextlib.contextmanager
def _dying_server(behaviour: Callable[[socket.socket], None]) -> Iterator[None]:
    """A fake server on this interpreter's socket path: takes one connection, does ``behaviour``, dies."""
    path = forkserver.socket_path()
    assert path is not None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve_once() -> None:
        conn, _ = listener.accept()
        with conn:
            behaviour(conn)

    thread = threading.Thread(target=serve_once)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout=60)
        listener.close()


def test_a_server_that_dies_with_the_request_leaves_the_attempt_cancelled(runtime: Path, tmp_path: Path) -> None:
    def read_then_die(conn: socket.socket) -> None:  # a server killed after it accepted the request
        while conn.recv(65536):
            pass
        conn.sendall(forkserver.ACCEPTED)

    attempts = Attempts(tmp_path)
    with _dying_server(read_then_die), pytest.raises(RuntimeError, match="closed the connection without an answer"):
        attempts.launch()
    # Never started a second time by the launcher; a supervisor that still came up would find the cancel.
    assert attempts.status(0) == {}
    assert json.loads((attempts.layout.attempt_dir(0, 0) / "cancel.json").read_text())["reason"].startswith(
        "launch lost")


def test_a_request_the_server_never_acknowledged_is_started_directly(runtime: Path, tmp_path: Path) -> None:
    attempts = Attempts(tmp_path)
    with _dying_server(lambda conn: None):  # a server killed with the request still queued
        status = attempts.ended(attempts.launch())
    assert status["state"] == "FINISHED" and "image: cold" in attempts.log(0)


def test_only_this_interpreter_running_a_script_is_forked_warm(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text("")
    assert warmstart.runs_warm([sys.executable, str(script), "--plan", "p"])
    assert not warmstart.runs_warm(["/bin/sh", str(script)])
    assert not warmstart.runs_warm([sys.executable, "-m", "module"])
    assert not warmstart.runs_warm([sys.executable, str(tmp_path / "missing.py")])
    assert not warmstart.runs_warm(["spark-submit", "--master", "local[1]", str(script)])


def test_the_cli_lists_and_stops_the_servers(runtime: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from argparse import Namespace

    from airflow_provider_speculative.cli.local_cluster import fork_server

    _warm_server(runtime)
    fork_server(Namespace(action="status", output="json"))
    (row,) = json.loads(capsys.readouterr().out)
    assert row["running"] and row["current"]
    fork_server(Namespace(action="stop", output="plain"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["socket", "state", "pid", "log"]
    assert lines[1].split()[:3] == [row["socket"], "stopped", str(row["pid"])]
    fork_server(Namespace(action="stop", output="table"))
    assert "no fork server running under" in capsys.readouterr().out


def test_the_image_key_and_socket_are_per_host(monkeypatch) -> None:
    # A socket directory shared by two hosts must not let one host's launcher fork on the other.
    keys = {}
    for host in ("triggerer-a", "triggerer-b"):
        monkeypatch.setattr(forkserver.socket, "gethostname", lambda h=host: h)
        monkeypatch.setitem(forkserver._state, "key", None)
        keys[host] = (forkserver.image_key(), forkserver.socket_path())
    assert keys["triggerer-a"][0] != keys["triggerer-b"][0]
    assert keys["triggerer-a"][1] != keys["triggerer-b"][1]
