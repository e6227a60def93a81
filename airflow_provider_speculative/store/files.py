"""Atomic file primitives: nothing a reader sees is ever half-written."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.exceptions import StoreError, StoreFullError, StoreNotWritableError


def _raise_for(path: Path, exc: OSError) -> None:
    if exc.errno == errno.ENOSPC:
        raise StoreFullError(f"store is full: cannot write {path}: {exc.strerror}") from exc
    if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        raise StoreNotWritableError(f"store is not writable: cannot write {path}: {exc.strerror}") from exc
    raise StoreError(f"cannot write {path}: {exc}") from exc


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write JSON to a temporary file in the same directory, fsync it, then rename over ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(obj, handle, indent=1, sort_keys=True, default=str)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _raise_for(path, exc)


def create_exclusive_json(path: str | Path, obj: Any) -> bool:
    """Create ``path`` with JSON content only if it does not exist; return False if it did.

    The content is written to a temporary file first and hard-linked into place, so a reader
    never sees an empty or partial claim even though creation is exclusive.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(obj, handle, sort_keys=True, default=str)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except OSError as exc:
        _raise_for(path, exc)
    return False  # unreachable: _raise_for always raises


def read_json(path: str | Path, default: Any = None) -> Any:
    """Read JSON from ``path``; return ``default`` if it does not exist, else raise StoreError naming it."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (FileNotFoundError, NotADirectoryError):  # a file where a directory should be: not there either
        return default
    except ValueError as exc:  # JSON errors, undecodable bytes, a NUL byte in the path
        raise StoreError(f"corrupt JSON in {path}: {exc}" if isinstance(exc, json.JSONDecodeError | UnicodeError)
                         else f"cannot read {path!r}: {exc}") from exc
    except OSError as exc:  # a directory, no permission, a name too long: one error naming the path
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON line; a single ``write`` on an O_APPEND file keeps concurrent lines whole."""
    path = Path(path)
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        _raise_for(path, exc)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read every complete JSON line of ``path`` (a torn last line is ignored)."""
    records = []
    try:
        with open(path) as handle:
            for line in handle:
                with contextlib.suppress(json.JSONDecodeError):
                    records.append(json.loads(line))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {path!r}: {exc}") from exc
    return records


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def wait_for_file(path: str | Path, timeout: float, interval: float,
                  stop: Callable[[], bool] | None = None) -> bool:
    """Poll until ``path`` exists (True), ``stop()`` is true or ``timeout`` passes (False): fault-injection holds."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() >= deadline or (stop is not None and stop()):
            return False
        time.sleep(interval)
    return True
