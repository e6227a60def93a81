"""Sink API in the terms of FLIP-281: opt-in marker and master-side ``finalize_global``."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SupportsConcurrentExecutionAttempts:
    """Marker: this sink tolerates several attempts of one subtask writing at once (opt-in to speculation)."""


@dataclass(frozen=True)
class AttemptResult:
    """The admitted (finished) attempt of one subtask and the files it wrote."""

    subtask: int
    attempt: int
    data_dir: Path
    files: list[dict[str, Any]]
    records: int | None = None
    sink_info: dict[str, Any] = field(default_factory=dict)
    # The data prefix's name in ``FinalizationContext.store``; None: read ``data_dir`` on the local disk.
    data_name: str | None = None


@dataclass(frozen=True)
class FinalizationContext:
    """What ``finalize_global`` gets: the parallelism and the finished attempt of every subtask."""

    parallelism: int
    attempts: dict[int, AttemptResult]
    dag_id: str
    run_id: str
    stage: str
    logical_date: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The result store holding the attempts' output (a StoreBackend), when the caller has one.
    store: Any = None

    def finished_attempt(self, subtask: int) -> int:
        """The attempt number of ``subtask`` that finished and must be committed."""
        return self.attempts[subtask].attempt


@dataclass(frozen=True)
class InitializationContext:
    """What a sink writer is opened with (FLIP-281 ``OutputFormat.InitializationContext``)."""

    task_number: int
    num_tasks: int
    attempt_number: int
    dag_id: str
    run_id: str
    stage: str
    data_dir: Path
    logical_date: str | None = None
    # Where Spark writes ``data_dir`` (the store's URL for it: the path itself on POSIX, s3a:// on S3).
    data_url: str | None = None


@dataclass(frozen=True)
class PlanContext:
    """What ``validate_plan`` gets: the stage run about to be planned and what it must not overwrite.

    Called by the operator before any attempt is launched, with the sink's templates rendered.
    """

    dag_id: str
    run_id: str
    stage: str
    where: str
    # The store's layout root: a POSIX directory, or a ``store.layout.StorePath`` (S3: no file-system call on it).
    store_root: Path
    # Absolute local paths of the stage's sources (a glob's fixed directory part).
    source_paths: tuple[Path, ...] = ()
    # The sink's arguments as declared, before rendering (``describe()``): what a template produced is
    # told apart from what the author wrote. None: not known.
    declared: dict[str, Any] | None = None


@dataclass(frozen=True)
class StagingScope:
    """Which staging objects a clean-up is about: one stage run, optionally only some attempts."""

    dag_id: str
    run_id: str
    stage: str
    # (subtask, attempt) pairs; None: every attempt of the stage run.
    attempts: tuple[tuple[int, int], ...] | None = None
    # Resolved secrets (e.g. a DSN) when the caller has them; else the sink resolves its connection.
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StagingObject:
    """A staging object a sink left outside the store: a directory or a table, and its size if known."""

    name: str
    bytes: int = 0


class SinkWriter(ABC):
    """Runtime side of a sink: runs in the Spark driver of one attempt, isolated from other attempts."""

    @abstractmethod
    def write(self, df: Any) -> dict[str, Any]:
        """Write the attempt's DataFrame; return what finalize needs (recorded in the attempt's manifest)."""


class Sink(ABC):
    """Where a final stage's output goes.

    Attempts write through :meth:`create_writer` into attempt-isolated places; :meth:`finalize_global`
    runs once on the master (the Airflow worker) and commits exactly the admitted attempts.
    Subclass :class:`SupportsConcurrentExecutionAttempts` too, to allow speculative attempts.
    """


    @abstractmethod
    def create_writer(self, context: InitializationContext) -> SinkWriter:
        """Open the writer of one attempt (task number, number of tasks, attempt number)."""

    @property
    def supports_concurrent_attempts(self) -> bool:
        """True if the sink opted in with :class:`SupportsConcurrentExecutionAttempts`."""
        return isinstance(self, SupportsConcurrentExecutionAttempts)

    def runtime_connections(self) -> list[str]:
        """Airflow connection ids the attempts' writers need (resolved by the controller, never stored)."""
        return []

    def runtime_env(self, connections: dict[str, Any]) -> dict[str, str]:
        """Environment for the attempts, built from the resolved ``connections`` (conn_id -> Connection)."""
        return {}

    def validate(self, where: str) -> None:
        """Check the arguments when the DAG is parsed, without I/O; raise ``PipelineError`` naming ``where``.

        Templated arguments (``{{ ... }}``) are checked again by :meth:`validate_plan` once rendered.
        """
        return None

    def validate_plan(self, context: PlanContext) -> None:
        """Check the rendered sink before any compute (I/O allowed); raise ``PlanError`` naming ``context.where``."""
        self.validate(context.where)

    def staging(self, scope: StagingScope) -> list[StagingObject]:
        """Staging objects this sink holds for ``scope`` outside the store (for gc and clean-up)."""
        return []

    def cleanup_staging(self, scope: StagingScope) -> list[str]:
        """Remove what this sink staged for ``scope`` and nothing else; idempotent; return what was removed.

        Called for discarded or cancelled attempts (the controller), for every attempt of a stage run
        that failed (the operator), and by ``airflow speculative gc`` for orphans of finished runs.
        """
        return []

    @abstractmethod
    def finalize_global(self, context: FinalizationContext) -> dict[str, Any]:
        """Commit exactly the attempts in ``context``; must be idempotent; return a summary."""

    def asset_uri(self) -> str | None:
        """URI of the Airflow asset this sink's commits update, known when the DAG is parsed; None: no asset.

        The operator declares it as an outlet and emits one asset event per commit (docs/assets.md).
        """
        return None

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-able constructor arguments (after template rendering), for plan.json."""

    def to_json(self) -> dict[str, Any]:
        """Serialise as class path plus arguments."""
        return {"class": f"{type(self).__module__}.{type(self).__qualname__}", "kwargs": self.describe()}

    def lineage_uri(self) -> str | None:
        """The URI OpenLineage names this sink's output by: its asset URI (None: no output dataset)."""
        return self.asset_uri()

    @staticmethod
    def from_json(data: dict[str, Any]) -> Sink:
        """Rebuild a sink serialised by :meth:`to_json`."""
        module, _, name = data["class"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        return cls(**data["kwargs"])
