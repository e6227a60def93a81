"""Is this pid still the process we started? Identity by start time in clock ticks since boot.

``psutil``'s ``create_time()`` is boot time (``btime`` in ``/proc/stat``, whole wall-clock seconds)
plus the start ticks, so it moves when the wall clock is stepped or ``btime`` is re-rounded (a VM
resumed, NTP): two readings of the same process can differ by more than a second, and a live attempt
or server would look like a reused pid. The start ticks themselves (``/proc/<pid>/stat`` field 22)
never change for a process and differ for a reused pid. Where ``/proc`` is missing (not Linux) the
caller falls back to ``create_time`` with a tolerance.
"""

from __future__ import annotations

from typing import Any

CREATE_TIME_TOLERANCE = 1.0


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None (no such process, no /proc)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as stat:
            data = stat.read()
    except (OSError, ValueError):
        return None
    try:
        # The command name (field 2) may hold spaces and parentheses: count fields after its last ")".
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def same_process(pid: int, recorded: dict[str, Any], create_time: float | None) -> bool:
    """Whether live ``pid`` is the process ``recorded`` (its ``start_ticks``, else its ``create_time``) describes.

    ``create_time`` is the live process's psutil create time (only used without recorded ticks).
    """
    ticks = recorded.get("start_ticks")
    if ticks is not None:
        now = start_ticks(pid)
        if now is not None:
            return now == int(ticks)
    if recorded.get("create_time") and create_time is not None:
        return abs(create_time - float(recorded["create_time"])) <= CREATE_TIME_TOLERANCE
    return True
