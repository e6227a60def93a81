"""The backend interface: claim, launch, poll, cancel, reap and invalidate attempts.

A *target* names where attempts run; its Airflow connection type picks the backend kind when the
stage is planned (``hooks/targets.py`` resolves the connection on the worker and writes a launch
template into plan.json). The controller then only needs the kind: it never touches Airflow
connections, so it runs unchanged in the triggerer, in tests and in :mod:`..devtools.runner`.
Which class implements which kind is :mod:`.registry`'s business; this module imports no implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from airflow_provider_speculative.core.states import Attempt
from airflow_provider_speculative.store.layout import StageLayout


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt: where, what command and which extra environment."""

    subtask: int
    attempt: int
    target: str
    node: str
    speculative: bool
    command: list[str]
    env: dict[str, str]
    # Nodes blocked when the attempt is launched: backends that can keep a submission off nodes
    # (YARN, Kubernetes; see core/placement.py) do so; the others rely on target choice.
    blocked_nodes: tuple[str, ...] = ()


class Backend(Protocol):
    """What the controller needs from a backend; every method is idempotent and restart-safe."""

    kind: ClassVar[str]
    layout: StageLayout
    kill_grace: float
    # Capability: launches go through the per-host fork server (backends/forkserver.py).
    fork_server: bool

    def claim(self, subtask: int, attempt: int, record: dict[str, Any]) -> bool:
        """Atomically claim an attempt number; False if another controller owns it."""
        ...

    def launch(self, spec: LaunchSpec) -> None:
        """Start the attempt detached; return once its status is recorded (raise if it cannot start)."""
        ...

    def poll(self, subtask: int, attempt: int, now: float | None = None) -> Attempt:
        """The attempt as observed now (state, node, application id, timestamps, progress)."""
        ...

    def probe(self, subtask: int, attempt: int, now: float) -> bool:
        """Cheap liveness of an attempt polled before (True: still there; False: poll it now)."""
        ...

    def cancel(self, subtask: int, attempt: int, reason: str) -> None:
        """Ask the attempt to stop; its Spark work must really stop, not only its client."""
        ...

    def reap(self, subtask: int, attempt: int, now: float | None = None) -> bool:
        """Escalate a cancel after the grace period; True once nothing of the attempt is left running."""
        ...

    def invalidate(self, subtask: int, attempt: int, reason: str) -> None:
        """Withdraw an attempt for good (and its admission, if it had one)."""
        ...

    def cleanup_pending(self, subtask: int, attempt: int) -> bool:
        """True if a cancelled attempt whose client is gone still has work to stop on its target."""
        ...
