"""Process and polling helpers shared by the integration tests, the slow-node helper and bench/."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5,
             on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; after ``timeout`` s fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f"\n{detail}" if detail else ""))
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a text file (or why it could not be read)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text[-lines:])


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line mentions ``text`` (e.g. a store path)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(text in a for a in proc.info["cmdline"] or []):
                found.append(proc)
    return found


def group_processes(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of the process group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found
