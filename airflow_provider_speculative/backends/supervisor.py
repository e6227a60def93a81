"""Detached supervisor of one attempt: runs spark-submit, records pid, timestamps and exit code.

Started with ``start_new_session=True`` so it and everything spark-submit starts (the driver JVM
and its Python process) share one process group that ``killpg`` stops as a whole. It imports
neither Airflow nor Spark, so it starts in milliseconds. Forked from the fork server instead
(``backends/forkserver.py``), it forks a Python application from that warm image.

On a POSIX store ``--status`` and ``--manifest`` are paths in the attempt's directory and ``--log`` is the
attempt's log there. With ``--store URL`` (a store without paths, S3) they are store names read and written
through that store (opened with the AWS environment, as an attempt opens it: never a connection itself; the
launcher puts ``[speculative] s3_conn_id``'s credentials there, core/contract.py ``attempt_env``), ``--log`` is a
local file (the launcher's working directory for the attempt) and ``--log-name`` the name it is uploaded to when
the attempt ends, before its final status, so a reader that sees the end finds the log.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from airflow_provider_speculative.backends import scratch, warmstart
from airflow_provider_speculative.backends.identity import start_ticks
from airflow_provider_speculative.core.contract import EXIT_NODE_LOST, LAUNCHED_AT_ENV, STORE_EXIT_CAUSES
from airflow_provider_speculative.core.faults import current as current_faults
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.files import atomic_write_json, read_json, wait_for_file
from airflow_provider_speculative.store.layout import CANCEL_FILE, FAILURE_FILE
from airflow_provider_speculative.store.roots import open_store

_READY_FD: list[int] = []
# How often the supervisor refreshes alive_at and looks for a cancel request written by a controller
# on another host (a local controller signals the process group directly).
CHECK_INTERVAL = 1.0
ALIVE_INTERVAL = 5.0
KILL_GRACE = 5.0


def _daemonize(status_path: str) -> None:
    # Double fork: the launcher's child exits at once, so the supervisor is re-parented to init
    # and never lingers as a zombie of the long-running triggerer.
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        ready = os.read(read_end, 1)
        os._exit(0 if ready == b"1" else 1)
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    _READY_FD.append(write_end)


def _create_time() -> float | None:
    try:
        import psutil

        return psutil.Process(os.getpid()).create_time()
    except Exception:
        return None


class AttemptDocuments:
    """The attempt's documents the supervisor reads and writes: by path on a POSIX store, by name in ``store``."""

    def __init__(self, status: str, manifest: str, store: StoreBackend | None = None,
                 log_name: str | None = None) -> None:
        self.status, self.manifest, self.store, self.log_name = status, manifest, store, log_name
        # Names are /-separated whatever the host; paths are the host's.
        self._path = posixpath if store is not None else os.path
        self.dir = self._path.dirname(status)

    def shown(self) -> str:
        """The attempt's directory as messages name it: its path, or its URL in the store."""
        return self.dir if self.store is None else f"{self.store.url}/{self.dir}"

    def read(self, file: str) -> Any:
        """The JSON document ``file`` of the attempt's directory; None if missing."""
        where = self._path.join(self.dir, file)
        return read_json(where) if self.store is None else self.store.read_json(where)

    def exists(self, file: str) -> bool:
        """True if ``file`` of the attempt's directory exists."""
        where = self._path.join(self.dir, file)
        return os.path.exists(where) if self.store is None else self.store.exists(where)

    def manifest_written(self) -> bool:
        """True once the attempt's manifest exists (it is written last, so the output is complete)."""
        found = read_json(self.manifest) if self.store is None else self.store.read_json(self.manifest)
        return found is not None

    def record(self, status: dict[str, object], *, notify: bool = True) -> None:
        """Write status.json and, for a state change, leave a change notice for the controller."""
        if self.store is None:
            atomic_write_json(self.status, status)
        else:
            self.store.replace_json(self.status, status)
        if not notify:
            return
        subtask_dir = self._path.dirname(self.dir)
        try:
            subtask = int(self._path.basename(subtask_dir).split("=", 1)[1])
            attempt = int(self._path.basename(self.dir).split("=", 1)[1])
        except (IndexError, ValueError):
            return  # not in the store layout (a unit test's own path): nobody to notify
        if self.store is None:
            changes.notify(os.path.dirname(subtask_dir), subtask, attempt)
        else:
            changes.post(self.store, posixpath.dirname(subtask_dir), subtask, attempt)

    def upload_log(self, log: str) -> None:
        """Upload the local log to ``log_name`` in the store (nothing on a POSIX store: the log is already there).

        Best effort: a log that cannot be uploaded must not turn the attempt's result into a failure.
        """
        if self.store is None or not self.log_name:
            return
        folder, file = os.path.split(os.path.abspath(log))
        try:
            self.store.copy_from(self.log_name, PosixBackend(folder), file)
        except (StoreError, OSError) as exc:
            print(f"[speculative] could not upload the attempt's log to {self.store.url}/{self.log_name}: "
                  f"{type(exc).__name__}", file=sys.stderr)


def _record(status_path: str, status: dict[str, object], *, notify: bool = True) -> None:
    """Write status.json at a path and, for a state change, leave a change notice for the controller."""
    AttemptDocuments(status_path, "").record(status, notify=notify)


def main(argv: list[str] | None = None, warm: bool = False) -> int:
    """Run the command after ``--``, keeping ``--status`` up to date; return its exit code.

    ``warm``: this supervisor was forked from the fork server (backends/forkserver.py), so a Python
    application of this interpreter is forked from the same, already imported, image.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--status", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--store", default="", help="the store's root URL: --status and --manifest are its names")
    parser.add_argument("--log-name", default="", help="the store name the local --log is uploaded to at the end")
    parser.add_argument("--daemonize", action="store_true", help="fork, detach and return once started")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if args.daemonize:
        _daemonize(args.status)
    store = open_store(args.store) if args.store else None
    docs = AttemptDocuments(args.status, args.manifest, store, args.log_name or None)
    now = time.time()
    launched = os.environ.get(LAUNCHED_AT_ENV)
    status = {"state": "DEPLOYING", "pid": os.getpid(), "pgid": os.getpgid(0), "deploying_at": now,
              "launched_at": float(launched) if launched else now, "alive_at": now, "host": socket.gethostname(),
              "create_time": _create_time(), "start_ticks": start_ticks(os.getpid()),
              "node": os.environ.get("SPECULATIVE_NODE")}
    docs.record(status)
    if args.daemonize:
        os.write(_READY_FD[0], b"1")
        os.close(_READY_FD[0])
    cancelled: dict[str, int | None] = {"signal": None}

    def on_term(signum: int, _frame: object) -> None:
        cancelled["signal"] = signum

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # A driver's temporary files are the attempt's: gone when it ends, even killed (backends/scratch.py).
    temp = scratch.create() if scratch.runs_spark_submit(cmd) else None
    try:
        with open(args.log, "ab") as log:
            try:
                child: Any
                if warm and warmstart.runs_warm(cmd):
                    child = warmstart.ForkedScript(cmd[1:], log.fileno())
                else:
                    env = scratch.submit_env(temp, os.environ) if temp is not None else None
                    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            except OSError as exc:
                status.update(state="FAILED", end_at=time.time(), exit_code=127,
                              cause=f"cannot start {cmd[0]}: {exc}")
                docs.upload_log(args.log)
                docs.record(status)
                return 127
            status["child_pid"] = child.pid
            docs.record(status)
            code = _wait(child, docs, status, cancelled)
    finally:
        scratch.remove(temp)
    hold = current_faults().hold_end_release
    if hold and code == 0 and cancelled["signal"] is None and docs.manifest_written():
        _hold_end(hold, docs, status, cancelled)
    status.update(end_at=time.time(), exit_code=code)
    if cancelled["signal"] is not None:
        status.update(state="CANCELED", cause=f"cancelled (signal {cancelled['signal']})")
    elif code == 0 and docs.manifest_written():
        status.update(state="FINISHED")
    else:
        failure = docs.read(FAILURE_FILE) or {}
        cause = failure.get("error") or (f"exit code {code} without a manifest" if code == 0 else f"exit code {code}")
        if not failure and code in STORE_EXIT_CAUSES:
            cause = (f"{STORE_EXIT_CAUSES[code]}: the attempt could not write its output under "
                     f"{docs.shown()} (exit code {code})")
        kind = failure.get("kind") or ("node_lost" if code == EXIT_NODE_LOST else None)
        status.update(state="FAILED", cause=cause, failure_kind=kind)
    docs.upload_log(args.log)
    docs.record(status)
    return code


def _wait(child: Any, docs: AttemptDocuments, status: dict[str, object],
          cancelled: dict[str, int | None]) -> int:
    term_sent_at: float | None = None
    while True:
        try:
            return child.wait(timeout=CHECK_INTERVAL)
        except subprocess.TimeoutExpired:
            pass
        except InterruptedError:
            continue
        try:
            if time.time() - float(status["alive_at"]) >= ALIVE_INTERVAL:  # type: ignore[arg-type]
                # A refresh is not a change: no notice (controllers of other hosts read it on their own clock).
                status["alive_at"] = time.time()
                docs.record(status, notify=False)
            cancel = docs.exists(CANCEL_FILE)
        except StoreError:
            if docs.store is None:
                raise
            # An object store's passing error (throttled, a dropped connection) must not orphan the attempt:
            # asked again at the next check, well within REMOTE_ALIVE_TIMEOUT.
            continue
        if cancel:
            # A controller on another host cannot signal this group: it asks through the store.
            if term_sent_at is None:
                cancelled["signal"] = signal.SIGTERM
                term_sent_at = time.time()
                _signal_children(signal.SIGTERM)
            elif time.time() - term_sent_at > KILL_GRACE:
                _signal_children(signal.SIGKILL)


def _hold_end(release: str, docs: AttemptDocuments, status: dict[str, object], cancelled: dict[str, int | None],
              timeout: float = 900.0) -> None:
    """Fault injection (``hold_end``): keep a successful end unrecorded until ``release`` exists."""
    status["held_at"] = time.time()
    # Not a change the controller acts on: the attempt still looks alive to it, as it should.
    docs.record(status, notify=False)

    def cancel_requested() -> bool:
        return cancelled["signal"] is not None or docs.exists(CANCEL_FILE)

    # 5 ms: the two attempts of a race record their ends within milliseconds of each other. After the
    # timeout the end is recorded anyway.
    store = docs.store
    if store is not None and release.startswith(store.url.rstrip("/") + "/"):
        # The release is an object of a store without paths (the controller names it by its URL): polled by
        # name, each look a request, so less often; both supervisors still see it within one interval.
        name = release[len(store.url.rstrip("/")) + 1:]
        deadline = time.monotonic() + timeout
        while not store.exists(name) and not cancel_requested() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        wait_for_file(release, timeout, 0.005, stop=cancel_requested)
    if cancel_requested():
        cancelled["signal"] = cancelled["signal"] or signal.SIGTERM


def _signal_children(signum: int) -> None:
    import psutil

    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            proc.send_signal(signum)
        except psutil.Error:
            continue


if __name__ == "__main__":
    sys.exit(main())
