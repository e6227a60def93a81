"""Where everything lives in the store (docs/architecture.md, "Store layout").

A :class:`StageLayout` is built over a store (a :class:`StoreBackend`) and computes, without any I/O, where each
object of a stage run is. **The rule: read and write the store through ``layout.store`` and the object's name
(``layout.name(path)``, or the layout's ``read_json``, ``replace_json``, ``create_json``, ``exists``,
``delete``...), never by a POSIX call on a layout path.**

- On a POSIX store the layout's paths are real :class:`~pathlib.Path` objects under the root directory, so code
  that does path I/O works there (attempt logs, the supervisor, the local sink).
- On any other store (S3) they are :class:`StorePath` objects: pure path arithmetic under an anchor that names
  the store's URL, so ``layout.name(path)`` is the object's key relative to the root and ``str(path)`` its URL
  (``s3://bucket/prefix/dag/run/stage/plan.json``, what messages show). Every file-system call on one raises
  :class:`NotALocalPathError`, a ``TypeError`` (not an ``OSError`` or ``ValueError``, which ``Path.exists`` and
  ``os.path.exists`` swallow, nor a ``StoreError``, which callers catch as an unreadable store): a caller still on
  path I/O fails loudly on S3, never reads "missing" or writes a local file. Converting one with ``Path(path)``
  gives a path holding a NUL byte (in its anchor), on which every system call fails too, but ``Path.exists()``
  answers False: never convert a layout path; ``Path(str(path))`` would make the URL a relative local path. A
  string for a local call is ``os.fspath(path)``, which refuses, never ``str(path)``.

``plan["store_root"]`` is ``str(layout.root)``: the POSIX root's path, unchanged, or the store's URL.
:meth:`StageLayout.of_plan` opens that root through the process's cache (``store/roots.py``: one backend per
root and credentials, S3 credentials from ``[speculative] s3_conn_id`` or the AWS environment); credentials
live in the backend only, never in a layout's fields, ``repr``, paths or messages.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PosixPath
from typing import Any
from urllib.parse import quote, unquote

from airflow_provider_speculative.store.backend import (
    PosixBackend,
    StoreBackend,
    StoreNotOwnedError,
    UnsafeStoreNameError,
    check_name,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


# Below the 255 bytes of a path component on common file systems, with room for a suffix.
MAX_COMPONENT_BYTES = 200

# File names in the store (docs/architecture.md, "Store layout"). Old stores are read by these names, so
# they never change. Code with a StageLayout goes through its methods; the names are for code that has
# only a directory (a supervisor with its status path, the read model walking a stage directory).
# In a DAG run's directory:
BLOCKLIST_FILE = "blocklist.json"
# In a stage run's directory:
PLAN_FILE = "plan.json"
JOURNAL_FILE = "journal.jsonl"
SUMMARY_FILE = "summary.json"
COMMITTED_FILE = "committed.json"
EXPIRED_FILE = "expired.json"
TASK_STATE_FILE = "task.json"
HYBRID_WAIT_FILE = "hybrid_wait.json"
ASSET_EVENTS_FILE = "asset_events.json"
DEMAND_FILE = "demand.json"
# In a subtask's directory:
ADMITTED_FILE = "admitted.json"
# In an attempt's directory:
CLAIM_FILE = "claim.json"
STATUS_FILE = "status.json"
HEARTBEAT_FILE = "heartbeat.json"
CANCEL_FILE = "cancel.json"
FAILURE_FILE = "failure.json"
INVALIDATED_FILE = "invalidated.json"
CONNECT_FILE = "connect.json"
CONNECT_CANCEL_FILE = "connect-cancel.json"
POD_TEMPLATE_FILE = "pod-template.json"
MANIFEST_FILE = "_SUCCESS"
LOG_FILE = "spark-submit.log"
DATA_DIR = "data"
# Below a store's root, beside the DAGs: where a Connect pool's warm-up works (devtools/warmup.py), one prefix of
# its own per warm-up (``_warm-up/<32 hex digits>``), claimed before its first write and deleted at its end.
WARM_UP_DIR = "_warm-up"


def safe_component(value: str) -> str:
    """Make ``value`` a path component Hadoop and every shell accept, keeping it unique.

    Airflow run ids contain ``:`` and ``+``, which Hadoop paths reject; a short hash keeps
    two ids that differ only in such characters apart.
    """
    cleaned = _UNSAFE.sub("_", value).strip("._") or "_"
    if cleaned == value and len(value.encode()) <= MAX_COMPONENT_BYTES:
        return value
    # A file system refuses components over 255 bytes (ENAMETOOLONG): long ids keep a prefix and the hash.
    prefix = cleaned.encode()[:MAX_COMPONENT_BYTES - 9].decode(errors="ignore")
    return f"{prefix}-{hashlib.sha1(value.encode()).hexdigest()[:8]}"


def default_store_root() -> Path:
    """``$AIRFLOW_HOME/speculative-store`` (the default of ``[speculative] store_path``)."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / "speculative-store"


def stage_key(plan: Mapping[str, Any], stage: str | None = None) -> str:
    """The store key (directory name) of the plan's stage, or of ``stage`` of the same pipeline.

    A pipeline compiled as a TaskGroup records its ``store_prefix`` in every plan; its stages read only
    stages of their own pipeline, so the prefix of the plan is the prefix of every producer it names.
    """
    return str(plan.get("store_prefix") or "") + (plan["stage"] if stage is None else stage)


class RunNotOwnedError(StoreNotOwnedError):
    """A removal in a DAG run whose prefix carries no ownership marker of this store: refused, nothing deleted."""


class NotALocalPathError(TypeError):
    """A file-system call on a path of a store that is not a POSIX directory (module docstring)."""


# The first component of a StorePath's anchor: a NUL byte (which no file-system path can hold) and the quoted URL.
_ANCHOR_MARK = "\0"


class StorePath(PosixPath):
    """A path of a layout on a store without a directory tree: arithmetic only, every file-system call refused.

    A ``PosixPath`` so that what is typed as a ``Path`` takes it, with every call that reaches the operating
    system going through ``__fspath__``, which raises :class:`NotALocalPathError` naming the object's URL.
    """

    @classmethod
    def anchor_of(cls, url: str) -> StorePath:
        """The root of store ``url``'s layouts."""
        return cls("/", _ANCHOR_MARK + quote(url, safe=""))

    @property
    def store_url(self) -> str:
        """The URL of the store this path is in."""
        parts = self.parts
        if len(parts) < 2 or parts[0] != "/" or not parts[1].startswith(_ANCHOR_MARK):
            raise NotALocalPathError(f"{super().__str__()!r} is not under a store's anchor")
        return unquote(parts[1][len(_ANCHOR_MARK):])

    def __str__(self) -> str:
        parts = self.parts
        if len(parts) >= 2 and parts[0] == "/" and parts[1].startswith(_ANCHOR_MARK):
            return "/".join((self.store_url, *parts[2:]))
        return super().__str__()  # a relative part, as relative_to gives it

    def __fspath__(self) -> str:
        raise NotALocalPathError(f"{str(self)!r} is an object of a store that is not a local directory: read and "
                                 "write it through layout.store by layout.name(path), not by a file-system call")

    def __bytes__(self) -> bytes:
        return self.__fspath__().encode()


def store_at(root: str | Path | StoreBackend) -> StoreBackend:
    """The backend of ``root``: a backend itself, the store a :class:`StorePath` is in, else the POSIX directory's."""
    if isinstance(root, StoreBackend):
        return root
    if isinstance(root, StorePath):
        from airflow_provider_speculative.store.roots import opened_store

        return opened_store(root.store_url)
    return PosixBackend(root)


def shown_root(store: StoreBackend) -> str:
    """How messages and reports name a store: a POSIX root's path, as always, else its URL (no credential)."""
    return str(store.root) if isinstance(store, PosixBackend) else store.url


def layout_root(store: StoreBackend) -> Path:
    """The root of ``store``'s layouts: a POSIX store's directory, else its :class:`StorePath` anchor."""
    return store.root if isinstance(store, PosixBackend) else StorePath.anchor_of(store.url)


@dataclass(frozen=True)
class StageLayout:
    """Paths of one stage run: ``<root>/<dag_id>/<run_id>/<stage>/...``, in the store ``store``.

    ``stage`` is the stage's store key: its name, or in a pipeline compiled as a TaskGroup its task id. Built
    from a root ``Path``, the store is a ``PosixBackend`` of it (a :class:`StorePath` root: the backend this
    process opened for its URL); :meth:`over` and :meth:`of_plan` build it over a backend (module docstring).
    """

    root: Path
    dag_id: str
    run_id: str
    stage: str
    backend: StoreBackend | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.root, Path):  # a root given as a string (older callers, tests)
            object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def over(cls, store: StoreBackend, dag_id: str, run_id: str, stage: str) -> StageLayout:
        """The layout of a stage run in ``store``."""
        return cls(layout_root(store), dag_id, run_id, stage, store)

    @classmethod
    def at(cls, root: str | Path | StoreBackend, dag_id: str, run_id: str, stage: str) -> StageLayout:
        """The layout of a stage run in ``root``: a store's backend, or a root path (a POSIX one or a StorePath)."""
        if isinstance(root, StoreBackend):
            return cls.over(root, dag_id, run_id, stage)
        return cls(root if isinstance(root, Path) else Path(root), dag_id, run_id, stage)

    @classmethod
    def of_plan(cls, plan: Mapping[str, Any], stage: str | None = None,
                root: Path | StoreBackend | None = None) -> StageLayout:
        """The layout of the plan's stage (or of ``stage`` of its pipeline) in the plan's DAG run.

        Without ``root`` the plan's ``store_root`` is opened through the process's cache (``store/roots.py``),
        with the plan's ``s3_conn_id`` for an S3 root where the Airflow layer resolves connections.
        """
        dag_id, run_id, key = str(plan["dag_id"]), str(plan["run_id"]), stage_key(plan, stage)
        if isinstance(root, StoreBackend):
            return cls.over(root, dag_id, run_id, key)
        if root is not None:
            return cls.at(root, dag_id, run_id, key)
        from airflow_provider_speculative.store.roots import open_store

        config = plan.get("config")
        conn_id = str(config.get("s3_conn_id") or "") if isinstance(config, Mapping) else ""
        return cls.over(open_store(str(plan["store_root"]), conn_id=conn_id), dag_id, run_id, key)

    @property
    def store(self) -> StoreBackend:
        """The store these paths are in, as a backend (names relative to ``root``)."""
        if self.backend is None:
            # Built from a root path: the backend is made once, on first use (the dataclass is frozen).
            object.__setattr__(self, "backend", store_at(self.root))
        assert self.backend is not None
        return self.backend

    @property
    def store_root(self) -> str:
        """What ``plan.json`` records as ``store_root``: the POSIX root's path, or the store's URL."""
        return str(self.root)

    def name(self, path: Path) -> str:
        """The store name of ``path``, one of this layout's paths (arithmetic on the root: no I/O)."""
        store = self.store
        if isinstance(store, PosixBackend):
            return store.name_of(path)
        try:
            relative = path.relative_to(self.root)
        except ValueError:
            raise UnsafeStoreNameError(f"{str(path)!r} is not in the store {store.url!r}") from None
        return check_name("/".join(relative.parts))

    def read_json(self, path: Path, default: Any = None) -> Any:
        """The JSON document at ``path`` (one of this layout's paths) read by name; ``default`` if missing."""
        return self.store.read_json(self.name(path), default)

    def replace_json(self, path: Path, obj: Any) -> None:
        """Make ``obj`` the JSON document at ``path`` by the store's atomic replace."""
        self.store.replace_json(self.name(path), obj)

    def create_json(self, path: Path, obj: Any) -> bool:
        """Create the JSON document at ``path`` by the store's exclusive create; True for the one writer that did."""
        return self.store.create_exclusive_json(self.name(path), obj)

    def exists(self, path: Path) -> bool:
        """True if the object at ``path`` exists in the store."""
        return self.store.exists(self.name(path))

    @property
    def run_prefix(self) -> str:
        """The store name of the DAG run's directory: the prefix whose ownership marker covers the run's removals."""
        return self.name(self.run_dir)

    def claim_run(self) -> None:
        """Own the DAG run's prefix (its ``_owner.json``); a no-op once this store owns it.

        Raises StoreNotOwnedError when another store's marker is there. Whether an unmarked prefix that
        already holds files may be claimed is the caller's decision (``store/identity.py``'s ``own_run``).
        """
        self.store.claim(self.run_prefix)

    def owns_run(self) -> bool:
        """True if the DAG run's prefix carries this store's own ownership marker.

        The run's own marker only: the store root's marker (claimed when the store is created) covers runs an
        older version or another writer left there too, which the provider must not take for its own.
        """
        return self.store.claimed(self.run_prefix)

    def require_owned_run(self, path: Path | None = None) -> None:
        """Raise RunNotOwnedError naming the DAG run, stage and ``path`` unless this store owns the run's prefix."""
        if not self.owns_run():
            raise RunNotOwnedError(self._not_owned(self.run_dir if path is None else path))

    def delete(self, path: Path) -> bool:
        """Delete the object at ``path`` by the store's owned delete; False if it was not there.

        Raises RunNotOwnedError (nothing deleted) unless this store owns the DAG run's prefix.
        """
        return bool(self._owned_delete(self.store.delete, path))

    def delete_tree(self, path: Path) -> int:
        """Delete everything below ``path`` (a directory of this layout) by an owned delete; the objects deleted.

        A missing ``path`` deletes nothing (0). Raises RunNotOwnedError (nothing deleted) unless this store
        owns the DAG run's prefix.
        """
        return self._owned_delete(self.store.delete_prefix, path)

    def _owned_delete(self, delete: Callable[[str], int | bool], path: Path) -> int:
        """Run the backend's ``delete`` on ``path``'s name once the run is proven ours; refusals name the run."""
        self.require_owned_run(path)
        try:
            return int(delete(self.name(path)))
        except StoreNotOwnedError as exc:
            raise RunNotOwnedError(f"{self._not_owned(path)} ({exc})") from None

    def _not_owned(self, path: Path) -> str:
        return (f"DAG {self.dag_id!r} run {self.run_id!r} stage {self.stage!r}: {str(path)!r} not deleted: "
                f"the run's prefix {str(self.run_dir)!r} has no ownership marker of this store "
                f"({self.store.owner!r}); a run written by an older version or by another store is never "
                "deleted from")

    def wait_for(self, path: Path, timeout: float, interval: float) -> bool:
        """Poll until the object at ``path`` exists (True) or ``timeout`` passes (False): fault-injection holds."""
        name = self.name(path)
        deadline = time.monotonic() + timeout
        while not self.store.exists(name):
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
        return True

    @property
    def run_dir(self) -> Path:
        """Directory of the whole DAG run."""
        return self.root / safe_component(self.dag_id) / safe_component(self.run_id)

    @property
    def dir(self) -> Path:
        """Directory of this stage run."""
        return self.run_dir / safe_component(self.stage)

    @property
    def plan(self) -> Path:
        """The resolved plan the operator wrote before deferring."""
        return self.dir / PLAN_FILE

    @property
    def journal(self) -> Path:
        """Append-only log of every controller decision."""
        return self.dir / JOURNAL_FILE

    @property
    def committed(self) -> Path:
        """The admitted attempt of every subtask, written atomically by finalize."""
        return self.dir / COMMITTED_FILE

    @property
    def blocklist(self) -> Path:
        """Blocked nodes of the whole run (a slow node stays blocked for the next stage too)."""
        return self.run_dir / BLOCKLIST_FILE

    @property
    def summary(self) -> Path:
        """Last stage summary (metrics, speculation status) for the CLI and UI."""
        return self.dir / SUMMARY_FILE

    @property
    def expired(self) -> Path:
        """gc's marker of a stage run whose outputs it removed."""
        return self.dir / EXPIRED_FILE

    @property
    def task_state(self) -> Path:
        """The stage task's own state (planning, deferred, failed, committed), which hybrid consumers go by."""
        return self.dir / TASK_STATE_FILE

    @property
    def hybrid_wait(self) -> Path:
        """When a hybrid consumer began waiting for its producers' plans."""
        return self.dir / HYBRID_WAIT_FILE

    @property
    def asset_events(self) -> Path:
        """The asset events recorded through the api-server for this stage run's commit."""
        return self.dir / ASSET_EVENTS_FILE

    @property
    def demand(self) -> Path:
        """The slots this stage run waits for, at its priority (store/demand.py, ``slot_priority``)."""
        return self.dir / DEMAND_FILE

    def subtask_dir(self, subtask: int) -> Path:
        """Directory of one subtask."""
        return self.dir / f"subtask={subtask}"

    def barrier_release(self, subtask: int) -> Path:
        """The fault-injection barrier release of a subtask: its attempts wait until it exists."""
        return self.dir / f"barrier.release.{subtask}"

    def commit_hold(self) -> tuple[Path, Path]:
        """Fault injection hold_commit: (written when the hold starts, the release a test writes)."""
        return self.dir / "commit.held", self.dir / "commit.release"

    def admitted(self, subtask: int) -> Path:
        """Marker naming the admitted attempt, created exclusively so only one attempt wins."""
        return self.subtask_dir(subtask) / ADMITTED_FILE

    def attempt_dir(self, subtask: int, attempt: int) -> Path:
        """Directory of one attempt."""
        return self.subtask_dir(subtask) / f"attempt={attempt}"

    def claim(self, subtask: int, attempt: int) -> Path:
        """Created exclusively before a launch: no restart or double-run launches a number twice."""
        return self.attempt_dir(subtask, attempt) / CLAIM_FILE

    def status(self, subtask: int, attempt: int) -> Path:
        """Launcher-side status: pid, target, node, timestamps, exit code."""
        return self.attempt_dir(subtask, attempt) / STATUS_FILE

    def heartbeat(self, subtask: int, attempt: int) -> Path:
        """Runtime-side heartbeat: progress and node."""
        return self.attempt_dir(subtask, attempt) / HEARTBEAT_FILE

    def cancel(self, subtask: int, attempt: int) -> Path:
        """A cancel was requested: the attempt's supervisor, wherever it runs, stops its child."""
        return self.attempt_dir(subtask, attempt) / CANCEL_FILE

    def failure(self, subtask: int, attempt: int) -> Path:
        """The error of a failed attempt, written by its runtime."""
        return self.attempt_dir(subtask, attempt) / FAILURE_FILE

    def invalidated(self, subtask: int, attempt: int) -> Path:
        """An admitted attempt withdrawn by the controller (its output must not be read)."""
        return self.attempt_dir(subtask, attempt) / INVALIDATED_FILE

    def connect(self, subtask: int, attempt: int) -> Path:
        """A Spark Connect attempt's server, session and operation tag (what a cancel needs)."""
        return self.attempt_dir(subtask, attempt) / CONNECT_FILE

    def connect_cancel(self, subtask: int, attempt: int) -> Path:
        """How far the interrupt of a Spark Connect attempt's operations on its server got."""
        return self.attempt_dir(subtask, attempt) / CONNECT_CANCEL_FILE

    def pod_template(self, subtask: int, attempt: int) -> Path:
        """The Kubernetes pod template of a spark-submit attempt."""
        return self.attempt_dir(subtask, attempt) / POD_TEMPLATE_FILE

    def data(self, subtask: int, attempt: int) -> Path:
        """Attempt-isolated output."""
        return self.attempt_dir(subtask, attempt) / DATA_DIR

    def manifest(self, subtask: int, attempt: int) -> Path:
        """Manifest (files, sizes, checksums), written last by a successful attempt."""
        return self.attempt_dir(subtask, attempt) / MANIFEST_FILE

    def log(self, subtask: int, attempt: int) -> Path:
        """spark-submit output of the attempt."""
        return self.attempt_dir(subtask, attempt) / LOG_FILE

    def attempt_numbers(self, subtask: int) -> list[int]:
        """Attempt numbers that exist (claimed) for ``subtask``, ascending."""
        return self.subtask_listing(subtask)[0]

    def subtask_listing(self, subtask: int) -> tuple[list[int], bool]:
        """From one listing of ``subtask``: its attempt numbers, ascending, and whether its admitted marker is there."""
        numbers = []
        entries = self.store.children(self.name(self.subtask_dir(subtask)))
        for entry in entries:
            if entry.startswith("attempt="):
                try:
                    numbers.append(int(entry.rstrip("/").split("=", 1)[1]))
                except ValueError:
                    continue
        return sorted(numbers), ADMITTED_FILE in entries


def local_root() -> Path:
    """Where this host keeps attempts' local working directories: ``$AIRFLOW_HOME/speculative-local`` (else tmp's)."""
    home = os.environ.get("AIRFLOW_HOME")
    return (Path(home) if home else Path(tempfile.gettempdir())) / "speculative-local"


def local_attempt_dir(layout: StageLayout, subtask: int, attempt: int) -> Path:
    """The local working directory of an attempt whose store has no paths: its supervisor's log, never the store.

    :func:`local_root`, then a digest of the store's URL (two stores never share a directory; the URL carries no
    credential) and the attempt's name there. Computed without I/O, the same on every host (``backends/supervised.py``
    launches there; ``control/attemptlog.py`` says where a running attempt's log is, and reads it on that host).
    """
    digest = hashlib.sha256(layout.store.url.encode()).hexdigest()[:16]
    return local_root() / digest / layout.name(layout.attempt_dir(subtask, attempt))
