"""Attempt logs pass through Airflow's secrets masker before a user sees them, as Airflow's task logs do.

An attempt's driver log is written by Spark and the stage application, not by Airflow's task logger,
so nothing masked it on the way in. Before the UI or the CLI serves it, the secrets of every
connection its stage's plan names (Spark targets, sinks: any ``*conn_id`` value) are registered with
Airflow's masker (the password and the extra's sensitive fields, as Airflow registers them for a task)
and the text is redacted with Airflow's own ``redact``, which also masks whatever else the process
registered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

# A connection's secrets are registered again after this long, so a rotated password is masked too.
_REGISTER_TTL = 60.0
_registered: dict[str, float] = {}
_lock = threading.Lock()


def connection_ids(plan: Any, depth: int = 0) -> set[str]:
    """Every string value under a key ending in ``conn_id`` anywhere in ``plan`` (bounded depth)."""
    found: set[str] = set()
    if depth > 8:
        return found
    if isinstance(plan, Mapping):
        for key, value in plan.items():
            if str(key).endswith("conn_id") and isinstance(value, str) and value:
                found.add(value)
            else:
                found |= connection_ids(value, depth + 1)
    elif isinstance(plan, list):
        for item in plan:
            found |= connection_ids(item, depth + 1)
    return found


def register_connection_secrets(conn_ids: set[str]) -> None:
    """Register the password and sensitive extra fields of each connection with Airflow's masker."""
    from airflow.models.connection import Connection
    from airflow.sdk._shared.secrets_masker import mask_secret

    now = time.monotonic()
    for conn_id in sorted(conn_ids):
        with _lock:
            if now - _registered.get(conn_id, -_REGISTER_TTL) < _REGISTER_TTL:
                continue
            _registered[conn_id] = now
        try:
            connection = Connection.get_connection_from_secrets(conn_id)
        except Exception:  # not defined here (a worker-only secret backend): nothing to register
            continue
        if connection.password:
            mask_secret(connection.password)
        try:
            extra = connection.extra_dejson
        except Exception:  # an extra that is not JSON: masked whole
            extra = connection.extra
        if extra:
            mask_secret(extra)


def redact_text(text: str, plan: Any) -> str:
    """``text`` with the secrets of ``plan``'s connections (and any other registered secret) as ``***``."""
    from airflow.sdk._shared.secrets_masker import redact

    register_connection_secrets(connection_ids(plan))
    return str(redact(text))


def redact_lines(handle: Any, plan: Any, max_line: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of an open log, redacted line by line (a line is cut at ``max_line`` bytes), closed at the end."""
    from airflow.sdk._shared.secrets_masker import redact

    register_connection_secrets(connection_ids(plan))
    with handle:
        while line := handle.readline(max_line):
            yield str(redact(line.decode("utf-8", errors="replace"))).encode()
