"""Which Airflow metadata database a store belongs to: ``<store>/store.json``.

gc decides what to delete from the DagRun table; asked against another database it would take
every run for deleted. The store therefore records the database it was created for, and gc
refuses to delete runs when the database it talks to is a different one (or unknown).

The identity is a hash of the SQLAlchemy URL without its password (dialect, user, host, port,
database name): stable across restarts and password rotations, different for another server or
database. A database reset at the same URL keeps the identity; gc is safe there too because it
deletes a run only on positive evidence (the audit log records its deletion) or ``--older-than``.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.store.files import create_exclusive_json, read_json

STORE_FILE = "store.json"


def db_identity(url: str) -> dict[str, str]:
    """Identity of the database at SQLAlchemy URL ``url`` (password dropped before hashing or showing)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)._replace(password=None)  # URL.set(password=None) keeps the password
    shown = parsed.render_as_string(hide_password=False)
    return {"id": hashlib.sha256(shown.encode()).hexdigest()[:16], "dialect": parsed.get_backend_name(),
            "url": shown}


def read_store_identity(root: str | Path) -> dict[str, Any] | None:
    """The store's record of its metadata database, or None if it has none."""
    return read_json(Path(root) / STORE_FILE)


def claim_store(root: str | Path, identity: dict[str, str]) -> dict[str, Any]:
    """Record ``identity`` as the store's database unless one is recorded already; return the record."""
    path = Path(root) / STORE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    create_exclusive_json(path, {"metadata_db": identity, "created_at": time.time()})
    return read_json(path)


def mismatch(record: dict[str, Any] | None, identity: dict[str, str] | None) -> str | None:
    """Why gc may not trust ``identity``'s DagRun table for this store; None if it may."""
    if identity is None:
        return "the metadata database URL is unknown ([database] sql_alchemy_conn)"
    if record is None:
        return (f"the store has no {STORE_FILE} naming its metadata database (written when a stage is planned, "
                "or by `airflow speculative gc --claim`)")
    recorded = (record.get("metadata_db") or {})
    if recorded.get("id") != identity["id"]:
        return (f"the store belongs to metadata database {recorded.get('url')!r} (id {recorded.get('id')}), "
                f"but this Airflow uses {identity['url']!r} (id {identity['id']})")
    return None
