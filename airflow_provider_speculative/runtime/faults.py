"""Fault injection inside an attempt (tests and demos only): slow it down, fail it, or hold it at a barrier.

What to inject is the fault hook's answer for the attempt's stage (``core/faults.py``: nothing in
production); this module applies it after the attempt wrote its output and before its manifest, so an
injected slow-down stands for work on the node: losing the node during it loses the attempt. No
benchmark's claim rests on it alone.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from airflow_provider_speculative.core.contract import LAUNCHED_AT_ENV
from airflow_provider_speculative.core.faults import FaultInjection, FaultSpec
from airflow_provider_speculative.core.states import HeartbeatPhase
from airflow_provider_speculative.runtime.heartbeat import Heartbeat
from airflow_provider_speculative.store.layout import StageLayout


def inject_faults(faults: FaultInjection, target: str, subtask: int, attempt: int, heartbeat: Heartbeat,
                  layout: StageLayout, node_lost: Callable[[], BaseException | None]) -> None:
    """Apply the stage's injected faults to this attempt; raise what a lost node or an injected failure raises."""
    if faults.barrier:
        wait_at_barrier(layout, subtask, heartbeat)
    fault: FaultSpec = faults.for_attempt(target, subtask, attempt)
    if not fault.active:
        return
    if fault.fail:
        raise RuntimeError(f"injected failure (fault injection) for subtask {subtask} attempt {attempt}")
    launched = float(os.environ.get(LAUNCHED_AT_ENV) or heartbeat.started_at)
    # A node `factor` times slower would have taken factor times the elapsed time so far.
    extra = (fault.factor - 1.0) * (time.time() - launched) + fault.delay
    print(f"[speculative] fault injection: slowing attempt by {extra:.1f}s", file=sys.stderr)
    deadline = time.time() + max(0.0, extra)
    while time.time() < deadline:
        lost = node_lost()
        if lost is not None:
            raise lost
        time.sleep(min(0.5, max(0.0, deadline - time.time())))


def wait_at_barrier(layout: StageLayout, subtask: int, heartbeat: Heartbeat, timeout: float = 900.0) -> None:
    """Hold the attempt until the test releases its subtask's barrier (deterministic races)."""
    release = layout.barrier_release(subtask)
    heartbeat.set_phase(HeartbeatPhase.BARRIER)
    if not layout.wait_for(release, timeout, 0.005):
        raise TimeoutError(f"fault injection barrier {release} was not released within {timeout}s")
