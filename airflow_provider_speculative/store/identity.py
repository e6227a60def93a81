"""Which Airflow metadata database a store belongs to: ``<store>/store.json``.

gc decides what to delete from the DagRun table; asked against another database it would take
every run for deleted. The store therefore records the database it was created for, and gc
refuses to delete runs when the database it talks to is a different one (or unknown).

The identity is a hash of the SQLAlchemy URL without its password (dialect, user, host, port,
database name): stable across restarts and password rotations, different for another server or
database. A database reset at the same URL keeps the identity; gc is safe there too because it
deletes a run only on positive evidence (the audit log records its deletion) or ``--older-than``.

``store.json`` is also the provider's ownership marker: a store root is the provider's only if the
provider created it, or found it empty, or found nothing in it but its own run files. A shared,
non-empty directory (``dags/``, ``logs/``, someone's project) is refused when a stage is planned and by
``gc --claim``, so gc can never come to treat foreign directories as deleted DAG runs. With it the root
carries the store backend's ownership marker (``_owner.json``, ``StoreBackend.claim("")``); the adoption
checks walk the store by name through a backend, and count that marker as the provider's own file.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend, StoreBackend, StoreNotOwnedError
from airflow_provider_speculative.store.layout import (
    PLAN_FILE,
    TASK_STATE_FILE,
    RunNotOwnedError,
    StageLayout,
    safe_component,
    shown_root,
    stage_key,
    store_at,
)

STORE_FILE = "store.json"
PROVIDER = "airflow-provider-speculative"
# Top-level entries of a store that are the provider's without being DAG directories.
_OWN_TOP_LEVEL = frozenset({STORE_FILE, "_targets", OWNER_FILE})
_SHOWN_ENTRIES = 5


class StoreRootNotOwnedError(StoreNotOwnedError):
    """The store root holds data that is not the provider's: nothing may be written or deleted there.

    A :class:`StoreNotOwnedError` like a refused owned delete (store/backend.py), so one ``except`` catches both.
    """


def _backend(root: str | Path | StoreBackend) -> StoreBackend:
    return store_at(root)


def _sub_prefixes(store: StoreBackend, prefix: str) -> list[str]:
    """The names of the sub-prefixes right below ``prefix`` (POSIX: directories, never a symlink), sorted."""
    return sorted(entry[:-1] for entry in store.children(prefix) if entry.endswith("/"))


def provider_plan(store: StoreBackend, run: str) -> dict[str, Any] | None:
    """A plan under run prefix ``run`` (``<dag>/<run>``) the provider wrote for exactly that DAG run; else None.

    A stage's ``plan.json`` counts when it is a JSON object whose ``dag_id``, ``run_id`` and ``stage`` map (as
    the layout maps them) to the run's and the stage's names. One listing of the run and one read per stage.
    """
    dag_name, _, run_name = run.rpartition("/")
    try:
        stages = _sub_prefixes(store, run)
    except (StoreError, OSError):
        return None
    for stage_name in stages:
        try:
            plan = store.read_json(f"{run}/{stage_name}/{PLAN_FILE}")
        except (StoreError, OSError):
            continue
        if not isinstance(plan, dict):
            continue
        names = (plan.get("dag_id"), plan.get("run_id"), plan.get("stage"))
        if not all(isinstance(n, str) and n for n in names):
            continue
        dag_id, run_id = str(names[0]), str(names[1])
        stage = stage_key(plan)  # the directory is named by store key (a grouped pipeline's task id)
        if (safe_component(dag_id), safe_component(run_id), safe_component(stage)) == (
                dag_name, run_name, stage_name):
            return plan
    return None


def _task_states_only(store: StoreBackend, run: str) -> bool:
    """True if every entry of run prefix ``run`` is a stage holding the provider's task record (failed to plan)."""
    try:
        # The run's ownership marker is the provider's too, and no stage.
        entries = [e for e in store.children(run) if e != OWNER_FILE]
    except (StoreError, OSError):
        return False
    for entry in entries:
        try:
            record = store.read_json(f"{run}/{entry}{TASK_STATE_FILE}") if entry.endswith("/") else None
        except (StoreError, OSError):
            return False
        if not isinstance(record, dict) or not {"state", "at"} <= set(record):
            return False
    return bool(entries)


def _own_dag_dir(store: StoreBackend, dag: str) -> bool:
    """True if every entry of prefix ``dag`` is a provider run (for adopting a store without marker)."""
    try:
        runs = store.children(dag)
    except (StoreError, OSError):
        return False
    return bool(runs) and all(r.endswith("/") and (provider_plan(store, f"{dag}/{r[:-1]}") is not None
                                                   or _task_states_only(store, f"{dag}/{r[:-1]}")) for r in runs)


def foreign_entries(root: str | Path | StoreBackend) -> list[str]:
    """Names of the entries of the store root that are not provably the provider's (sorted; [] if none or no root).

    The provider's own: ``store.json``, ``_targets/``, the root's ownership marker (``_owner.json``, claimed when
    the store is created) and DAG prefixes holding only provider runs. A backend's in-flight temporary objects
    never show in a listing. Sub-prefixes are shown with a trailing ``/``.
    """
    store = _backend(root)
    try:
        # In name order, as the directory walk listed them (a sub-prefix's trailing "/" aside).
        entries = sorted(store.children(""), key=lambda entry: entry.rstrip("/"))
    except OSError as exc:
        raise StoreError(f"cannot list store root {store.describe('')}: {exc}") from None
    foreign = []
    for entry in entries:
        if entry.rstrip("/") in _OWN_TOP_LEVEL:
            continue
        if entry.endswith("/") and _own_dag_dir(store, entry[:-1]):
            continue
        foreign.append(entry)
    return foreign


def _claim_root(store: StoreBackend) -> None:
    """Claim the store root (its ``_owner.json``) unless this store has: the marker of the whole store.

    A root whose marker names another store (the same directory reached by another path, which the ownership
    check takes for another store) is left as it is: the store stays usable, and only deletes that would need
    the root's marker refuse, as every delete of another store's prefix does.
    """
    with contextlib.suppress(StoreNotOwnedError):
        if not store.claimed(""):
            store.claim("")


def own_store(root: str | Path | StoreBackend) -> dict[str, Any]:
    """Make sure ``root`` is the provider's store and return its ``store.json`` record.

    Creates the root, claims it (``_owner.json``) and writes the record when the root is missing or empty,
    or holds only the provider's own run files (a store whose record was never written). A store that has
    the record but not the root's marker (made by an earlier version) is claimed as it is. Raises
    :class:`StoreRootNotOwnedError` naming what is there otherwise.
    """
    store = store_at(root)
    # A directory tree's root is a directory the provider creates; a store without directories has none.
    directory = store.root if isinstance(store, PosixBackend) else None
    named = shown_root(store)
    record = store.read_json(STORE_FILE)
    if isinstance(record, dict):
        # An existing store: its root's marker is added if missing, but a store that cannot take it (read-only,
        # a marker the ownership check refuses) is used without a root marker.
        with contextlib.suppress(StoreError, OSError):
            _claim_root(store)
        return record
    if directory is not None and directory.exists() and not directory.is_dir():
        raise StoreRootNotOwnedError(f"store root {named!r} is not a directory")
    foreign = foreign_entries(store)
    if foreign:
        record = store.read_json(STORE_FILE)
        if isinstance(record, dict):
            # Another stage created the store between our two looks (stages plan concurrently, e.g. at a run's
            # start in the triggerer): its marker came first, then the run directory we just saw.
            with contextlib.suppress(StoreError, OSError):
                _claim_root(store)
            return record
        shown = ", ".join(repr(n) for n in foreign[:_SHOWN_ENTRIES])
        shown += ", ..." if len(foreign) > _SHOWN_ENTRIES else ""
        raise StoreRootNotOwnedError(
            f"store root {named!r} is not the provider's: it has no {STORE_FILE} and holds {len(foreign)} "
            f"entries that are not provider run files ({shown}); set [speculative] store_path to a new or empty "
            "directory (the provider creates it)")
    try:
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create store root {named}: {exc}") from None
    # The root's marker before the provider's first write there, as a DAG run's prefix is claimed.
    _claim_root(store)
    store.create_exclusive_json(STORE_FILE, {"provider": PROVIDER, "created_at": time.time()})
    return store.read_json(STORE_FILE) or {}


def own_run(layout: StageLayout) -> None:
    """Claim the DAG run's prefix before the provider's first write there, so its removals are owned deletes.

    A prefix with this store's marker is kept as it is. One without a marker is claimed when nothing is
    there yet (the provider is about to write the run's first file), or when it holds a run an older
    version wrote: a stage directory with a plan naming exactly this run, or only the provider's task
    records (:func:`provider_plan`, the test the store root's adoption applies). Anything else, or
    another store's marker, raises RunNotOwnedError naming the DAG run, stage and directory.
    """
    if layout.owns_run():
        return
    store, prefix = layout.store, layout.run_prefix
    # Another store's marker: claim() below refuses naming it.
    marked = store.exists(f"{prefix}/{OWNER_FILE}")
    if not marked and store.list_names(prefix) and provider_plan(store, prefix) is None \
            and not _task_states_only(store, prefix):
        # Another stage of this run may have claimed the prefix and written its first files after the marker
        # was looked for above: its marker is created before anything else it writes, so it is there now.
        if layout.owns_run():
            return
        raise RunNotOwnedError(
            f"DAG {layout.dag_id!r} run {layout.run_id!r} stage {layout.stage!r}: {str(layout.run_dir)!r} "
            f"holds files but no {OWNER_FILE} of this store and no plan of this provider naming the run; "
            "nothing is written or deleted there")
    try:
        store.claim(prefix)
    except StoreError as exc:
        raise RunNotOwnedError(f"DAG {layout.dag_id!r} run {layout.run_id!r} stage {layout.stage!r}: "
                               f"{exc}") from None


def db_identity(url: str) -> dict[str, str]:
    """Identity of the database at SQLAlchemy URL ``url`` (password dropped before hashing or showing)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)._replace(password=None)  # URL.set(password=None) keeps the password
    shown = parsed.render_as_string(hide_password=False)
    return {"id": hashlib.sha256(shown.encode()).hexdigest()[:16], "dialect": parsed.get_backend_name(),
            "url": shown}


def read_store_identity(root: str | Path | StoreBackend) -> dict[str, Any] | None:
    """The store's record of its metadata database, or None if it has none."""
    record: dict[str, Any] | None = store_at(root).read_json(STORE_FILE)
    return record


def store_present(root: str | Path | StoreBackend) -> bool:
    """True if the store's root exists: a POSIX root's directory, elsewhere any object under the root."""
    store = store_at(root)
    return store.root.is_dir() if isinstance(store, PosixBackend) else bool(store.children(""))


def claim_store(root: str | Path | StoreBackend, identity: dict[str, str]) -> dict[str, Any]:
    """Own the store (see :func:`own_store`) and record ``identity`` as its database unless one is recorded.

    Returns the record; a database recorded already is kept, whichever it is.
    """
    record = own_store(root)
    if not record.get("metadata_db"):
        # Written by a process that did not know the database (an Airflow 3 task): add it now.
        record = {**record, "provider": PROVIDER, "metadata_db": identity}
        store_at(root).replace_json(STORE_FILE, record)
    return record


def mismatch(record: dict[str, Any] | None, identity: dict[str, str] | None) -> str | None:
    """Why gc may not trust ``identity``'s DagRun table for this store; None if it may."""
    if identity is None:
        return "the metadata database URL is unknown ([database] sql_alchemy_conn)"
    if record is None:
        return (f"the store has no {STORE_FILE} naming its metadata database (written when a stage is planned, "
                "or by `airflow speculative gc --claim`)")
    recorded = (record.get("metadata_db") or {})
    if not recorded:
        return (f"the store's {STORE_FILE} names no metadata database (written when a stage is planned where "
                "the database is configured, or by `airflow speculative gc --claim`)")
    if recorded.get("id") != identity["id"]:
        return (f"the store belongs to metadata database {recorded.get('url')!r} (id {recorded.get('id')}), "
                f"but this Airflow uses {identity['url']!r} (id {identity['id']})")
    return None
