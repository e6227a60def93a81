"""A real slow node for tests and benchmarks: a process tree throttled by the kernel, always restored.

``throttle(pid, share)`` limits a process and every descendant (present and future: children stay
in their parent's cgroup) to ``share`` of one CPU with the cgroup cpu controller: v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, or v2 ``cpu.max``. Where no cgroup is writable it falls
back to a SIGSTOP/SIGCONT duty cycle over the tree (coarser: the tree runs ``share`` of each 100 ms
period at full speed, so a tree busy on k cores gets k x ``share`` CPU). Leaving the context moves
the processes back and removes the group, also after an exception. Nothing here sleeps inside an
attempt: the node is slow because it gets less CPU.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

V1_CPU = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@dataclass
class Throttle:
    """A running throttle: how it is applied and which processes it holds."""

    method: str  # "cgroup-v1" | "cgroup-v2" | "sigstop"
    share: float
    root_pid: int
    group: Path | None = None

    def pids(self) -> list[int]:
        """The processes currently throttled (the cgroup's members, or the live tree)."""
        if self.group is not None:
            return [int(p) for p in (self.group / "cgroup.procs").read_text().split()]
        return tree(self.root_pid)


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    try:
        proc = psutil.Process(pid)
        return [proc.pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def unavailable_reason() -> str | None:
    """Why no throttle method works here (None: one does). SIGSTOP needs only permission over the tree."""
    if _v1_writable() or _v2_writable():
        return None
    if hasattr(signal, "SIGSTOP"):
        return None
    return "no writable cgroup cpu controller (v1 or v2) and no SIGSTOP on this platform"


def method_available() -> str:
    """The method :func:`throttle` would use here."""
    if _v1_writable():
        return "cgroup-v1"
    if _v2_writable():
        return "cgroup-v2"
    return "sigstop"


def _v1_writable() -> bool:
    return (V1_CPU / "cpu.cfs_quota_us").exists() and os.access(V1_CPU, os.W_OK)


def _v2_writable() -> bool:
    controllers = V2_ROOT / "cgroup.controllers"
    return controllers.exists() and "cpu" in controllers.read_text().split() and os.access(V2_ROOT, os.W_OK)


def _parent_of(pid: int) -> Path:
    """The v1 cpu cgroup directory ``pid`` is in now (to move it back there)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return V1_CPU / path.lstrip("/")
    return V1_CPU


@contextlib.contextmanager
def throttle(pid: int, share: float, method: str | None = None) -> Iterator[Throttle]:
    """Limit ``pid``'s process tree to ``share`` (0 < share <= 1) of one CPU while the context is open."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    method = method or method_available()
    if method == "sigstop":
        with _duty_cycle(pid, share) as held:
            yield held
        return
    name = f"speculative-slow-{uuid.uuid4().hex[:8]}"
    if method == "cgroup-v1":
        group = V1_CPU / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * share)))
        home = _parent_of(pid)
    else:
        group = V2_ROOT / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(PERIOD_US * share)} {PERIOD_US}")
        home = V2_ROOT
    held = Throttle(method, share, pid, group)
    try:
        for member in tree(pid):
            with contextlib.suppress(OSError):  # a thread or process that just exited
                (group / "cgroup.procs").write_text(str(member))
        yield held
    finally:
        for member in held.pids():
            with contextlib.suppress(OSError):
                (home / "cgroup.procs").write_text(str(member))
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def _duty_cycle(pid: int, share: float) -> Iterator[Throttle]:
    """The fallback: stop the tree for (1 - share) of every period, continue it for the rest."""
    stop = threading.Event()
    held = Throttle("sigstop", share, pid)

    def signal_tree(sig: int) -> None:
        for member in tree(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, sig)

    def loop() -> None:
        period = PERIOD_US / 1e6
        while not stop.is_set():
            signal_tree(signal.SIGSTOP)
            if stop.wait(period * (1 - share)):
                break
            signal_tree(signal.SIGCONT)
            stop.wait(period * share)
        signal_tree(signal.SIGCONT)

    thread = threading.Thread(target=loop, name="slownode-duty-cycle", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join(timeout=5)
        signal_tree(signal.SIGCONT)
