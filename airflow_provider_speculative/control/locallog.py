"""A running attempt's log on a store without paths: its supervisor's local file, readable on that host only.

On S3 an attempt's supervisor writes the driver log to a local file of its host (``store/layout.py``'s
``local_attempt_dir``) and uploads it by name when the attempt ends (``backends/supervised.py``). A reader on the
supervisor's own host can follow that file meanwhile; the CLI and UI (``control/attemptlog.py``) and the task log's
stream (``control/logstream.py``) decide this alike from the attempt's status record, and open the file under the
rules of a store file, since the attempt's code on this host can write its directory too.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any, BinaryIO

from airflow_provider_speculative.store.files import open_in_store
from airflow_provider_speculative.store.layout import LOG_FILE, StageLayout, local_attempt_dir, local_root

# A host name as a status record may show it: anything else (the record is writable by an attempt's code) is not.
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")


def supervisor_host(status: dict[str, Any]) -> str | None:
    """The host a status record names, if it is a plain host name (an attempt's code can write the record)."""
    host = status.get("host")
    return host if isinstance(host, str) and _HOST_NAME.match(host) else None


def runs_here(status: dict[str, Any]) -> bool:
    """Whether a status record is of a running attempt whose supervisor is on this host (its log is local here)."""
    host = supervisor_host(status)
    return status.get("end_at") is None and host is not None and host == socket.gethostname()


def local_log(layout: StageLayout, subtask: int, attempt: int) -> Path:
    """The supervisor's local log of an attempt on this host (computed from the store's URL and the names only)."""
    return local_attempt_dir(layout, subtask, attempt) / LOG_FILE


def open_local(local: Path) -> BinaryIO:
    """A supervisor's local log on this host, opened as ``open_in_store`` opens a store file under its root."""
    return open_in_store(local_root(), local)
