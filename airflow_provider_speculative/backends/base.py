"""The backend interface: claim, launch, poll, cancel, reap and invalidate attempts, and its factory.

A *target* names where attempts run; its Airflow connection type picks the backend kind when the
stage is planned (``hooks/targets.py`` resolves the connection on the worker and writes a launch
template into plan.json). The controller then only needs the kind: it never touches Airflow
connections, so it runs unchanged in the triggerer, in tests and in :mod:`..control.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from airflow_provider_speculative.core.states import Attempt
from airflow_provider_speculative.exceptions import TargetError
from airflow_provider_speculative.store.layout import StageLayout

# Airflow connection type -> backend kind.
CONN_TYPE_KINDS: dict[str, str] = {"spark": "spark_submit", "spark_connect": "spark_connect"}


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


def kind_for_conn_type(conn_type: str | None, *, target: str, conn_id: str) -> str:
    """The backend kind of an Airflow connection type, or a :class:`TargetError` naming the target."""
    kind = CONN_TYPE_KINDS.get(conn_type or "")
    if kind is None:
        raise TargetError(f"target {target!r}: connection {conn_id!r} has type {conn_type!r}; "
                          f"supported: {', '.join(sorted(CONN_TYPE_KINDS))}")
    return kind


def create_backend(kind: str, layout: StageLayout, env: dict[str, str] | None = None, *,
                   fork_server: bool = False) -> Backend:
    """The backend implementation for ``kind`` (as recorded in plan.json) over one stage run's store.

    ``env`` is the target's launch environment resolved by the trigger (e.g. a Connect server's URL with
    its token): a backend that must reach its target outside an attempt (a Connect cancel) keeps it in memory.
    ``fork_server``: start attempts through the per-host fork server (``backends/forkserver.py``).
    """
    backend: Any
    if kind == "spark_submit":
        from airflow_provider_speculative.backends.spark_submit import SparkSubmitBackend

        backend = SparkSubmitBackend(layout)
    elif kind == "spark_connect":
        from airflow_provider_speculative.backends.spark_connect import SparkConnectBackend

        backend = SparkConnectBackend(layout, env=env)
    else:
        raise TargetError(f"unknown backend kind {kind!r} in the plan of stage {layout.stage!r}; "
                          "known: spark_submit, spark_connect")
    backend.fork_server = fork_server
    return backend


def plan_backends(plan: dict[str, Any], layout: StageLayout,
                  target_env: dict[str, dict[str, str]] | None = None) -> dict[str, Backend]:
    """One backend per target of a plan (targets of the same kind share nothing but the store)."""
    fork_server = bool(plan.get("config", {}).get("fork_server", False))
    return {name: create_backend(spec["kind"], layout, (target_env or {}).get(name), fork_server=fork_server)
            for name, spec in plan["targets"].items()}


def attempt_observer(layout: StageLayout) -> Backend:
    """A backend for reading and withdrawing attempts whatever their kind (CLI, UI, gc, reruns).

    Every backend records an attempt the same way in the store (claim, status, heartbeat, cancel and
    invalidation files), so polling and invalidating need no knowledge of the target.
    """
    from airflow_provider_speculative.backends.supervised import SupervisedBackend

    return SupervisedBackend(layout)
