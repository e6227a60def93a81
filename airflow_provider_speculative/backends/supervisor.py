"""Detached supervisor of one attempt: runs spark-submit, records pid, timestamps and exit code.

Started with ``start_new_session=True`` so it and everything spark-submit starts (the driver JVM
and its Python process) share one process group that ``killpg`` stops as a whole. It imports
neither Airflow nor Spark, so it starts in milliseconds. Forked from the fork server instead
(``backends/forkserver.py``), it forks a Python application from that warm image.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from airflow_provider_speculative.backends import warmstart
from airflow_provider_speculative.backends.identity import start_ticks
from airflow_provider_speculative.core.contract import EXIT_NODE_LOST, LAUNCHED_AT_ENV, STORE_EXIT_CAUSES
from airflow_provider_speculative.core.faults import current as current_faults
from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.files import atomic_write_json, read_json, wait_for_file
from airflow_provider_speculative.store.layout import CANCEL_FILE, FAILURE_FILE

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


def _record(status_path: str, status: dict[str, object], *, notify: bool = True) -> None:
    """Write status.json and, for a state change, leave a change notice for the controller."""
    atomic_write_json(status_path, status)
    if notify:
        attempt_dir = os.path.dirname(status_path)
        subtask_dir = os.path.dirname(attempt_dir)
        try:
            subtask = int(os.path.basename(subtask_dir).split("=", 1)[1])
            attempt = int(os.path.basename(attempt_dir).split("=", 1)[1])
        except (IndexError, ValueError):
            return  # not in the store layout (a unit test's own path): nobody to notify
        changes.notify(os.path.dirname(subtask_dir), subtask, attempt)


def main(argv: list[str] | None = None, warm: bool = False) -> int:
    """Run the command after ``--``, keeping ``--status`` up to date; return its exit code.

    ``warm``: this supervisor was forked from the fork server (backends/forkserver.py), so a Python
    application of this interpreter is forked from the same, already imported, image.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--status", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--daemonize", action="store_true", help="fork, detach and return once started")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if args.daemonize:
        _daemonize(args.status)
    now = time.time()
    launched = os.environ.get(LAUNCHED_AT_ENV)
    status = {"state": "DEPLOYING", "pid": os.getpid(), "pgid": os.getpgid(0), "deploying_at": now,
              "launched_at": float(launched) if launched else now, "alive_at": now, "host": socket.gethostname(),
              "create_time": _create_time(), "start_ticks": start_ticks(os.getpid()),
              "node": os.environ.get("SPECULATIVE_NODE")}
    _record(args.status, status)
    if args.daemonize:
        os.write(_READY_FD[0], b"1")
        os.close(_READY_FD[0])
    cancelled: dict[str, int | None] = {"signal": None}

    def on_term(signum: int, _frame: object) -> None:
        cancelled["signal"] = signum

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with open(args.log, "ab") as log:
        try:
            child: Any
            if warm and warmstart.runs_warm(cmd):
                child = warmstart.ForkedScript(cmd[1:], log.fileno())
            else:
                child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            status.update(state="FAILED", end_at=time.time(), exit_code=127, cause=f"cannot start {cmd[0]}: {exc}")
            _record(args.status, status)
            return 127
        status["child_pid"] = child.pid
        _record(args.status, status)
        code = _wait(child, args.status, status, cancelled)
    hold = current_faults().hold_end_release
    if hold and code == 0 and cancelled["signal"] is None and read_json(args.manifest) is not None:
        _hold_end(hold, args.status, status, cancelled)
    status.update(end_at=time.time(), exit_code=code)
    if cancelled["signal"] is not None:
        status.update(state="CANCELED", cause=f"cancelled (signal {cancelled['signal']})")
    elif code == 0 and read_json(args.manifest) is not None:
        status.update(state="FINISHED")
    else:
        failure = read_json(os.path.join(os.path.dirname(args.status), FAILURE_FILE)) or {}
        cause = failure.get("error") or (f"exit code {code} without a manifest" if code == 0 else f"exit code {code}")
        if not failure and code in STORE_EXIT_CAUSES:
            cause = (f"{STORE_EXIT_CAUSES[code]}: the attempt could not write its output under "
                     f"{os.path.dirname(args.status)} (exit code {code})")
        kind = failure.get("kind") or ("node_lost" if code == EXIT_NODE_LOST else None)
        status.update(state="FAILED", cause=cause, failure_kind=kind)
    _record(args.status, status)
    return code


def _wait(child: Any, status_path: str, status: dict[str, object],
          cancelled: dict[str, int | None]) -> int:
    cancel_path = os.path.join(os.path.dirname(status_path), CANCEL_FILE)
    term_sent_at: float | None = None
    while True:
        try:
            return child.wait(timeout=CHECK_INTERVAL)
        except subprocess.TimeoutExpired:
            pass
        except InterruptedError:
            continue
        if time.time() - float(status["alive_at"]) >= ALIVE_INTERVAL:  # type: ignore[arg-type]
            # A refresh is not a change: no notice (controllers of other hosts read it on their own clock).
            status["alive_at"] = time.time()
            _record(status_path, status, notify=False)
        if os.path.exists(cancel_path):
            # A controller on another host cannot signal this group: it asks through the store.
            if term_sent_at is None:
                cancelled["signal"] = signal.SIGTERM
                term_sent_at = time.time()
                _signal_children(signal.SIGTERM)
            elif time.time() - term_sent_at > KILL_GRACE:
                _signal_children(signal.SIGKILL)


def _hold_end(release: str, status_path: str, status: dict[str, object], cancelled: dict[str, int | None],
              timeout: float = 900.0) -> None:
    """Fault injection (``hold_end``): keep a successful end unrecorded until ``release`` exists."""
    status["held_at"] = time.time()
    # Not a change the controller acts on: the attempt still looks alive to it, as it should.
    _record(status_path, status, notify=False)
    cancel_path = os.path.join(os.path.dirname(status_path), CANCEL_FILE)

    def cancel_requested() -> bool:
        return cancelled["signal"] is not None or os.path.exists(cancel_path)

    # 5 ms: the two attempts of a race record their ends within milliseconds of each other. After the
    # timeout the end is recorded anyway.
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
