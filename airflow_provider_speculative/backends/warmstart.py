"""Warm start of a stage application: forked from the warm image of a supervisor the fork server started.

Used by ``backends/supervisor.py`` (the application, forked instead of a fresh interpreter) and by
``backends/forkserver.py`` (the supervisor, forked from the server). Imports neither of them.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


def fork_run(child: Callable[[], int]) -> int:
    """Fork; the child runs ``child`` and exits with its code (1 on an exception, printed). The child's pid."""
    sys.stdout.flush()  # or the child would write what this process buffered a second time
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid



def runs_warm(cmd: list[str]) -> bool:
    """True if ``cmd`` is ``<this interpreter> <script.py> args…``: what can be forked from a warm image."""
    if len(cmd) < 2 or not cmd[1].endswith(".py") or not os.path.isfile(cmd[1]):
        return False
    with contextlib.suppress(OSError):
        return os.path.samefile(cmd[0], sys.executable)
    return False


class ForkedScript:
    """The stage application forked from the warm supervisor: what :class:`subprocess.Popen` is otherwise."""

    def __init__(self, argv: list[str], log_fd: int) -> None:
        def child() -> int:
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            return run_script(argv)

        self.pid = fork_run(child)
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The exit code as Popen gives it (negative for a signal); TimeoutExpired after ``timeout``."""
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)


def retitle(cmd: list[str]) -> None:
    """Show ``cmd`` as this forked process's command line (``ps``, and whoever looks for an attempt by it)."""
    with contextlib.suppress(Exception):
        import setproctitle

        setproctitle.setproctitle(" ".join(cmd))


def run_script(argv: list[str]) -> int:
    """Run ``argv[0]`` as ``__main__`` like ``python argv[0] argv[1:]``, then end as the interpreter would."""
    retitle([sys.executable, *argv])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    # What interpreter shutdown does before exiting: join non-daemon threads, run atexit handlers.
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        import atexit

        atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


