"""Fork server: attempts start from a warm Python image instead of two fresh interpreters.

A Spark Connect attempt is a small Python client. Most of its start-up is importing pyspark's Connect
client with pandas, pyarrow and grpc (~0.6 s of CPU on this machine), paid again by every attempt on
the same cores as the Spark work. The fork server is one process per host, user and interpreter that
has imported them once. A launch asks it, over a Unix socket, to fork the attempt's supervisor
(``backends/supervisor.py``); that supervisor then forks the stage application from the same warm image
(``backends/warmstart.py``) instead of starting an interpreter. Imports run one way: this server
imports the supervisor, which imports warmstart.

What stays as without it:

* The supervisor detaches (double fork, ``setsid``) into a session and process group of its own and
  records pid, pgid and start ticks in ``status.json`` before the launch returns; the application runs
  in that group, so cancel and kill reach it.
* The attempt gets the launcher's environment and working directory (sent with the request; the forked
  child replaces its own) and sees ``sys.argv`` and ``sys.path[0]`` as ``python app.py`` would.
* Only a command of this interpreter running a ``.py`` file runs warm; anything else (spark-submit) is
  started by the warm supervisor with ``subprocess``.

Safety:

* The socket is in a directory of this user only (mode 0700, checked before every use). Its name
  carries a key of the interpreter, ``PYTHONPATH`` and the files of what the server imports, so a
  changed installation never gets an old image.
* A launch falls back to starting the supervisor directly only when the server provably started
  nothing: it was not reachable, or it did not acknowledge the request (it acknowledges before it
  forks). After the acknowledgement its answer decides; if it died before answering,
  :class:`LaunchUnknown` is raised and the caller decides from ``status.json``.
* The server forks only while single-threaded, serves one request at a time, and exits after
  :data:`IDLE_TIMEOUT` seconds without one: it unlinks its socket first, then serves what is queued,
  so a clean exit never drops a request. One server per key holds an exclusive lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.warmstart import fork_run, retitle

# What a Spark Connect stage application imports, loaded once in the server (a missing one is skipped).
WARM_MODULES = ("pandas", "pyarrow", "pyarrow.parquet", "grpc", "boto3", "pyspark.sql.connect.session",
                "pyspark.sql.functions", "setproctitle", "airflow_provider_speculative.runtime",
                "airflow_provider_speculative.backends.supervisor")
IDLE_TIMEOUT = 600.0
# How long a launcher waits for a server it has just started (its imports) before starting directly.
FIRST_START_WAIT = 3.0
LAUNCH_TIMEOUT = 60.0
MAX_REQUEST = 16 * 1024 * 1024
ACCEPTED = b"A"
_PACKAGE = Path(__file__).resolve().parent.parent
_MODULE = "airflow_provider_speculative.backends.forkserver"  # not __name__: the server runs it as __main__
_state: dict[str, Any] = {"key": None, "started": {}}


class LaunchUnknown(RuntimeError):
    """The request reached the fork server but no answer came back: the supervisor may or may not run."""


class _Stopped(Exception):
    """Raised by the server's SIGTERM handler while it waits for a connection."""


def runtime_dir() -> Path:
    """This user's private directory for fork server sockets, created 0700 (never trusted otherwise)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return Path(base) / f"airflow-speculative-{os.getuid()}"


def _private_dir() -> Path | None:
    directory = runtime_dir()
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        info = os.lstat(directory)
    except OSError:
        return None
    # Another user could have made the directory first: then it is not ours to put a server socket in.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
        return None
    return directory


def image_key() -> str:
    """A key of what a forked attempt would run and where: host, interpreter, PYTHONPATH, the files imported.

    The host is in it because the socket directory may be shared by several hosts (a /tmp or
    XDG_RUNTIME_DIR volume shared by containers, network namespaces on one machine): a launcher
    must never have its attempts forked on another host, where its status.json would name the
    wrong host and losing the launcher's host would not lose them.
    """
    if _state["key"] is None:
        digest = hashlib.sha256()
        digest.update(f"{socket.gethostname()}\0{sys.executable}\0{sys.version}\0"
                      f"{os.environ.get('PYTHONPATH', '')}".encode())
        for name in ("pyspark", "pandas", "pyarrow", "grpc"):
            with contextlib.suppress(Exception):
                spec = importlib.util.find_spec(name)
                if spec is not None and spec.origin:
                    info = os.stat(spec.origin)
                    digest.update(f"\0{spec.origin}:{info.st_mtime_ns}:{info.st_size}".encode())
        for path in sorted(_PACKAGE.rglob("*.py")):
            with contextlib.suppress(OSError):
                info = path.stat()
                digest.update(f"\0{path}:{info.st_mtime_ns}:{info.st_size}".encode())
        _state["key"] = digest.hexdigest()[:16]
    return str(_state["key"])


def socket_path() -> Path | None:
    """The socket of this interpreter's fork server, or None if no private directory can be had."""
    directory = _private_dir()
    path = None if directory is None else directory / f"fork-{image_key()}.sock"
    # A Unix socket path has at most 107 bytes (and the server binds a longer staging name first).
    return path if path is not None and len(os.fsencode(path)) <= 90 else None


# -- launcher side --------------------------------------------------------------------------------


def launch(argv: list[str], env: dict[str, str], log: str) -> int | None:
    """Start a supervisor (``argv`` are its arguments) through the fork server; its exit code.

    None means nothing was sent (no server, or none reachable): the caller starts the supervisor itself.
    A server not running is started in the background; a launch waits up to :data:`FIRST_START_WAIT`
    for one it has just started, since starting the attempts cold would cost more.
    """
    path = socket_path()
    if path is None:
        return None
    sock = _connect(path)
    if sock is None:
        # Wait only for a server started moments ago (it is importing); one that never came: start directly.
        deadline = _start_server(path) + FIRST_START_WAIT
        while sock is None and time.monotonic() < deadline:
            time.sleep(0.02)
            sock = _connect(path)
        if sock is None:
            return None
    request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "log": log}).encode()
    with sock:
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            # The server acknowledges the whole request before it forks: without the acknowledgement
            # (a server dying with the request still queued) nothing was started.
            accepted = sock.recv(1) == ACCEPTED
        except OSError:
            accepted = False
        if not accepted:
            _start_server(path)
            return None
        try:
            reply = _read_all(sock)
        except OSError as exc:
            raise LaunchUnknown(f"fork server {path} failed during the launch: {exc}") from None
    if not reply:
        raise LaunchUnknown(f"fork server {path} closed the connection without an answer (it died)")
    return int(json.loads(reply)["code"])


def prestart() -> None:
    """Start this interpreter's fork server in the background if none answers (before the first launch)."""
    path = socket_path()
    if path is None:
        return
    sock = _connect(path)
    if sock is not None:
        sock.close()
        return
    _start_server(path)


def serving(timeout: float = 0.0) -> bool:
    """True once this interpreter's fork server answers (waiting up to ``timeout`` seconds)."""
    path = socket_path()
    deadline = time.monotonic() + timeout
    while path is not None:
        sock = _connect(path)
        if sock is not None:
            sock.close()
            return True
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return False


def servers() -> list[dict[str, Any]]:
    """This user's fork servers on this host that run, and this interpreter's even if it does not."""
    directory = _private_dir()
    if directory is None:
        return []
    current = socket_path()
    rows = []
    for lock_path in sorted(directory.glob("fork-*.sock.lock")):
        sock = Path(str(lock_path)[: -len(".lock")])
        pid = _running_pid(lock_path)
        if pid is None and sock != current:
            continue  # an older installation's (its lock and log files stay: see serve())
        rows.append({"socket": str(sock), "pid": pid, "running": pid is not None,
                     "serving": sock.exists(), "current": sock == current, "log": f"{sock}.log"})
    return rows


def _running_pid(lock_path: Path) -> int | None:
    """The pid recorded in ``lock_path`` if that process is still the fork server of its socket."""
    try:
        text = lock_path.read_text().strip()
    except OSError:
        return None
    # Not probed with flock: a probe's own lock, however short, could make a starting server give up.
    pid = int(text) if text.isdigit() else None
    return pid if pid is not None and _is_server(pid, str(lock_path)[: -len(".lock")]) else None


def stop_servers(timeout: float = 30.0) -> list[dict[str, Any]]:
    """Stop this user's running fork servers (SIGTERM: each finishes the launch it serves); what was stopped.

    Attempts they started are not touched: a supervisor is in a session of its own once detached.
    """
    stopping = []
    for row in servers():
        pid = row["pid"]
        if pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        stopping.append(row)
    deadline = time.monotonic() + timeout
    for row in stopping:
        lock_path = Path(f"{row['socket']}.lock")
        while _running_pid(lock_path) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        row["stopped"] = _running_pid(lock_path) is None
    return stopping


def _is_server(pid: int, sock: str) -> bool:
    """Whether ``pid`` is the fork server of ``sock`` (the lock file's pid could be stale or reused)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        return False
    return _MODULE.encode() in args and sock.encode() in args


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(LAUNCH_TIMEOUT)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _start_server(path: Path) -> float:
    """Start the server detached, at most once a minute per launcher; when it was started (monotonic)."""
    last = _state["started"].get(str(path))
    if last is not None and time.monotonic() - last < 60.0:
        return float(last)
    _state["started"][str(path)] = now = time.monotonic()
    # numpy's OpenBLAS would start a worker thread per core at import: a Connect client needs none.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with open(f"{path}.log", "ab") as out:
        subprocess.Popen([sys.executable, "-m", _MODULE, "--socket", str(path)], cwd=str(path.parent), env=env,
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                         close_fds=True)
    return now


# -- server side -----------------------------------------------------------------------------------


def serve(path: Path, idle_timeout: float = IDLE_TIMEOUT) -> int:
    """Import the warm modules, then fork supervisors on request until idle; the process's exit code."""
    # The lock file is never removed: a server that unlinked it on exit could race one just opening it,
    # and two servers of one key would then both serve.
    lock = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server of this key runs
    # The pid, for `airflow speculative fork-server status|stop`; trusted only while the lock is held.
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
    signal.signal(signal.SIGTERM, _on_term)
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # warm is best effort: the application imports what is missing itself
            print(f"[fork server] not pre-imported: {name}: {exc}", file=sys.stderr)
    try:
        # An attempt with its store on S3 builds a boto3 client: its service models are parsed here, once.
        from airflow_provider_speculative.store.backend import warm_s3_client

        warm_s3_client()
    except Exception as exc:
        print(f"[fork server] S3 client not warmed: {exc}", file=sys.stderr)
    if threading.active_count() != 1:
        # fork() copies only the calling thread: another Python thread's held locks would stay held.
        print(f"[fork server] {threading.active_count()} Python threads after the imports; not serving",
              file=sys.stderr)
        return 1
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging)
    server.bind(staging)
    os.chmod(staging, 0o600)
    server.listen(128)
    inode = os.stat(staging).st_ino
    os.replace(staging, path)  # published complete: a launcher never connects to a half-made server
    # Native threads that remain (pyarrow's jemalloc background thread) make their locks fork-safe
    # with pthread_atfork handlers; they are listed for whoever reads this log.
    print(f"[fork server] pid {os.getpid()} serving {path}; threads: {_native_threads()}",
          file=sys.stderr, flush=True)
    server.settimeout(idle_timeout)
    try:
        while not _state.get("stop"):
            try:
                _state["accepting"] = True
                conn, _ = server.accept()
            except (TimeoutError, _Stopped):
                break
            finally:
                _state["accepting"] = False
            _serve_one(server, conn, lock)
        # Idle or stopped: unpublish first (new launchers start directly), then serve what was queued.
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        server.settimeout(0.0)
        while True:
            try:
                conn, _ = server.accept()
            except (BlockingIOError, TimeoutError):
                break
            _serve_one(server, conn, lock)
    finally:
        server.close()
    return 0


def _on_term(_signum: int, _frame: object) -> None:
    # A request being served is finished first; a wait for the next one ends at once. A connection
    # accepted just before this is dropped unacknowledged, and its launcher starts the attempt itself.
    _state["stop"] = True
    if _state.get("accepting"):
        raise _Stopped


def _native_threads() -> list[str]:
    names = []
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as comm:
                names.append(comm.read().strip())
    return names


def _serve_one(server: socket.socket, conn: socket.socket, lock: int) -> None:
    with conn:
        conn.settimeout(LAUNCH_TIMEOUT)
        try:
            data = b""
            while len(data) <= MAX_REQUEST and (chunk := conn.recv(65536)):
                data += chunk
            request = json.loads(data)
            argv, env, cwd, log = request["argv"], request["env"], request["cwd"], request["log"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"[fork server] bad request: {exc}", file=sys.stderr, flush=True)
            return
        try:
            conn.sendall(ACCEPTED)
        except OSError:
            return  # the launcher is gone: it starts nothing, so neither does the server

        def child() -> int:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the supervisor installs its own
            server.close()
            conn.close()
            os.close(lock)  # or every daemonized supervisor would hold the server's lock
            return _become_supervisor(argv, env, cwd, log)

        _, status = os.waitpid(fork_run(child), 0)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())


def _become_supervisor(argv: list[str], env: dict[str, str], cwd: str, log: str) -> int:
    """In the forked child: take the launch's environment, directory and output, then run the supervisor."""
    # Before the environment changes: setproctitle finds its space behind argv and the original environ.
    retitle([sys.executable, "-m", "airflow_provider_speculative.backends.supervisor", *argv])
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    random.seed()
    from airflow_provider_speculative.backends import supervisor

    return supervisor.main(argv, warm=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_provider_speculative.backends.forkserver --socket PATH [--idle-timeout S]``."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT)
    args = parser.parse_args(argv)
    return serve(Path(args.socket), args.idle_timeout)


if __name__ == "__main__":
    sys.exit(main())
