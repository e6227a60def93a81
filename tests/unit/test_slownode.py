"""The slow-node helper: a busy process tree really gets the CPU share it is throttled to, and is restored."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests import slownode

SPIN = "import os, time\nif os.fork() == 0:\n    pass\nwhile True:\n    pass\n"  # two busy processes


def _cpu_rate(pids: list[int], window: float) -> float:
    """CPU seconds per wall second used by ``pids`` over ``window`` (a measurement, not a synchronisation)."""
    procs = [psutil.Process(p) for p in pids]
    before = sum(sum(p.cpu_times()[:2]) for p in procs)
    start = time.monotonic()
    deadline = start + window
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return (sum(sum(p.cpu_times()[:2]) for p in procs) - before) / (time.monotonic() - start)


@pytest.mark.parametrize("method", ["cgroup-v1", "cgroup-v2", "sigstop"])
def test_throttle_limits_the_whole_tree_and_restores_it(method: str) -> None:
    if method.startswith("cgroup") and slownode.method_available() != method:
        pytest.skip(f"{method} is not writable here (available: {slownode.method_available()})")
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        deadline = time.monotonic() + 10
        while len(slownode.tree(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = slownode.tree(child.pid)
        assert len(pids) == 2
        with slownode.throttle(child.pid, 0.2, method=method) as held:
            if held.group is not None:
                assert sorted(held.pids()) == sorted(pids)
            throttled = _cpu_rate(pids, 1.5)
        group = held.group
        # A cgroup gives the two spinning processes 0.2 CPU together; the duty cycle runs each of them
        # 20 % of the wall time (0.4 CPU for two).
        assert throttled < (0.3 if held.group is not None else 0.55), throttled
        # Released: back in their own cgroup, the group gone, none left stopped. (Their CPU rate is not
        # asserted: on a loaded machine an unthrottled spinner may get little CPU too.)
        if group is not None:
            assert not group.exists()
            for pid in pids:
                assert group.name not in open(f"/proc/{pid}/cgroup").read()
        assert all(psutil.Process(p).status() != psutil.STATUS_STOPPED for p in pids)
    finally:
        for pid in slownode.tree(child.pid):
            psutil.Process(pid).kill()
        child.wait()


def test_share_is_checked() -> None:
    with pytest.raises(ValueError, match="share must be in"), slownode.throttle(1, 0):
        pass
