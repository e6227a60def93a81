"""A spark-submit attempt's temporary directory, removed when its attempt ends, even a killed one.

A driver JVM keeps its scratch space in ``java.io.tmpdir`` (``spark-*`` with copies of ``spark.jars``,
``blockmgr-*`` with shuffle files) unless ``spark.local.dir`` says otherwise, and Spark deletes it only
on a clean shutdown: an attempt killed with SIGKILL (a cancel after its grace period) leaves it behind.
The supervisor gives its spark-submit a directory of its own, ``<tmp>/speculative-scratch-<uid>/
<pid>-<start ticks>@<host>``, and removes it when the command ends. A supervisor killed with its
attempt cannot; the next one started on the host removes every directory of this host whose
supervisor is gone (its pid no longer has that start time), so what is removed was provably an
attempt's and is no longer used.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from airflow_provider_speculative.backends.identity import start_ticks

ROOT_PREFIX = "speculative-scratch-"


def scratch_root() -> Path | None:
    """This user's directory of attempt scratch directories, or None if it is not this user's alone (0700)."""
    root = Path(tempfile.gettempdir()) / f"{ROOT_PREFIX}{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        info = root.lstat()
    except OSError:
        return None
    # Another user's directory (or one others can write to) must not receive a driver's files.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return root


def _name(pid: int, ticks: int) -> str:
    return f"{pid}-{ticks}@{socket.gethostname()}"


def _owner(name: str) -> tuple[int, int, str] | None:
    """(pid, start ticks, host) of a scratch directory's name; None for a name this module did not make."""
    ident, sep, host = name.rpartition("@")
    pid, dash, ticks = ident.partition("-")
    if not sep or not dash or not pid.isdigit() or not ticks.isdigit():
        return None
    return int(pid), int(ticks), host


def sweep(root: Path) -> list[str]:
    """Remove the scratch directories of this host whose supervisor is gone; the names removed."""
    removed: list[str] = []
    host = socket.gethostname()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        owner = _owner(entry.name)
        # Another host's (a shared /tmp) is that host's to judge; a link is never followed.
        if owner is None or owner[2] != host or not entry.is_dir(follow_symlinks=False):
            continue
        if start_ticks(owner[0]) == owner[1]:
            continue  # its supervisor still runs
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


def create() -> Path | None:
    """A fresh scratch directory for this process's attempt (after a sweep); None if none can be made."""
    ticks = start_ticks(os.getpid())
    root = scratch_root()
    if ticks is None or root is None:
        return None  # no /proc to tell a live owner from a dead one: Spark's own default then
    sweep(root)
    path = root / _name(os.getpid(), ticks)
    try:
        path.mkdir(mode=0o700)
    except OSError:
        return None
    return path


def remove(path: Path | None) -> None:
    """Remove a scratch directory made by :func:`create` (nothing for None)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def runs_spark_submit(cmd: list[str]) -> bool:
    """Whether ``cmd`` starts a spark-submit (a driver JVM on this host, in client mode)."""
    return bool(cmd) and os.path.basename(cmd[0]).startswith("spark-submit")


def submit_env(path: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``path`` as the driver JVM's ``java.io.tmpdir``, after any SPARK_SUBMIT_OPTS already set."""
    option = shlex.quote(f"-Djava.io.tmpdir={path}")
    return {**env, "SPARK_SUBMIT_OPTS": " ".join(filter(None, [env.get("SPARK_SUBMIT_OPTS"), option]))}
