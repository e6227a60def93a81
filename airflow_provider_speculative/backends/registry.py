"""Which backend implements which target kind, and the factories the controller and tools use.

The one place that imports the implementations: the interface (:mod:`.base`) imports none, and every
implementation imports only the interface, so imports run one way. The error text for an unknown
connection type or kind is derived from the maps below.
"""

from __future__ import annotations

import importlib
from typing import Any

from airflow_provider_speculative.backends.base import Backend
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.exceptions import TargetError
from airflow_provider_speculative.store.layout import StageLayout

# Backend kind (as recorded in plan.json) -> "module:class" (imported on first use: a triggerer running
# only Connect stages never imports the spark-submit backend).
CONNECT_KIND = "spark_connect"
IMPLEMENTATIONS: dict[str, str] = {
    "spark_submit": "airflow_provider_speculative.backends.spark_submit:SparkSubmitBackend",
    CONNECT_KIND: "airflow_provider_speculative.backends.spark_connect:SparkConnectBackend",
}
# Airflow connection type -> backend kind.
CONN_TYPE_KINDS: dict[str, str] = {"spark": "spark_submit", "spark_connect": "spark_connect"}


def _implementation(kind: str) -> type:
    module, name = IMPLEMENTATIONS[kind].split(":")
    return getattr(importlib.import_module(module), name)


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
    if kind not in IMPLEMENTATIONS:
        raise TargetError(f"unknown backend kind {kind!r} in the plan of stage {layout.stage!r}; "
                          f"known: {', '.join(sorted(IMPLEMENTATIONS))}")
    cls = _implementation(kind)
    backend: Any = cls(layout, env=env)
    backend.fork_server = fork_server
    return backend


def plan_backends(plan: StagePlan, layout: StageLayout,
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


def heartbeat_observer(layout: StageLayout) -> Backend:
    """A reader that judges liveness from the store's timestamps alone (the UI's; no pid lookups)."""
    from airflow_provider_speculative.backends.supervised import HeartbeatObserver

    return HeartbeatObserver(layout)


def prestart_fork_server() -> None:
    """Start this host's fork server in the background (warm attempt starts)."""
    from airflow_provider_speculative.backends import forkserver

    forkserver.prestart()


def connect_speed_check(url: str) -> float:
    """Seconds one Spark Connect server takes for the speed probe (backends/spark_connect.py)."""
    from airflow_provider_speculative.backends.spark_connect import speed_check

    return speed_check(url)


def prepare_connect_speed_check(url: str) -> None:
    """Warm this process's speed-check session on one Spark Connect server in the background."""
    from airflow_provider_speculative.backends.spark_connect import prepare_speed_check

    prepare_speed_check(url)
