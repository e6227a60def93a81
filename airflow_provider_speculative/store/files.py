"""Atomic file primitives: nothing a reader sees is ever half-written."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from airflow_provider_speculative.exceptions import (
    StoreError,
    StoreFullError,
    StoreNotWritableError,
    UnsafeStorePathError,
)

# A link where a directory or file of the store should be: open(2) with O_NOFOLLOW answers ELOOP
# (or ENOTDIR for O_DIRECTORY on some kernels) instead of following it.
_LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


def _raise_for(path: Path, exc: OSError) -> None:
    if exc.errno == errno.ENOSPC:
        raise StoreFullError(f"store is full: cannot write {path}: {exc.strerror}") from exc
    if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        raise StoreNotWritableError(f"store is not writable: cannot write {path}: {exc.strerror}") from exc
    raise StoreError(f"cannot write {path}: {exc}") from exc


def json_document(obj: Any) -> bytes:
    """The bytes :func:`atomic_write_json` writes for ``obj`` (indented, sorted keys): every backend writes these."""
    return json.dumps(obj, indent=1, sort_keys=True, default=str).encode()


def json_claim(obj: Any) -> bytes:
    """The bytes :func:`create_exclusive_json` writes for ``obj`` (compact, sorted keys)."""
    return json.dumps(obj, sort_keys=True, default=str).encode()


def json_line(record: dict[str, Any]) -> bytes:
    """One journal line for ``record``, newline included."""
    return (json.dumps(record, sort_keys=True, default=str) + "\n").encode()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file in the same directory, fsync it, then rename over ``path``."""
    atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str | Path, chunks: Iterable[bytes]) -> None:
    """:func:`atomic_write_bytes` of the concatenated ``chunks``, written as they come (a streamed copy)."""
    path = Path(os.fspath(path))  # a layout path of a store without paths refuses here
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _raise_for(path, exc)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write JSON to a temporary file in the same directory, fsync it, then rename over ``path``."""
    atomic_write_bytes(path, json_document(obj))


def create_exclusive_bytes(path: str | Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist; return False if it did.

    The content is written to a temporary file first and hard-linked into place, so a reader
    never sees an empty or partial claim even though creation is exclusive. Empty content (a change
    notice) cannot be seen partial: it is created in place with ``O_EXCL``, without a temporary file or fsync.
    """
    path = Path(os.fspath(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not data:
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644))
            except FileExistsError:
                return False
            return True
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
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


def create_exclusive_json(path: str | Path, obj: Any) -> bool:
    """Create ``path`` with JSON content only if it does not exist; return False if it did (a hard link)."""
    return create_exclusive_bytes(path, json_claim(obj))


def _store_parts(root: str | Path, path: str | Path) -> tuple[str, ...]:
    try:
        parts = Path(os.fspath(path)).relative_to(Path(os.fspath(root))).parts
    except ValueError:
        raise UnsafeStorePathError("a path outside the store was refused") from None
    if not parts or any(part in ("", ".", "..") for part in parts):
        raise UnsafeStorePathError("a path outside the store was refused")
    return parts


def _open_directories(root: str | Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``root/parts...``, each component opened with O_NOFOLLOW relative to its parent."""
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = child
    except OSError as exc:
        os.close(directory)
        if exc.errno in _LINK_ERRNOS:
            raise UnsafeStorePathError("a symbolic link in the store was refused") from None
        raise
    return directory


def check_store_directory(root: str | Path, path: str | Path) -> None:
    """Raise UnsafeStorePathError if any component of directory ``path`` below ``root`` is a symlink.

    A stage's run, stage or subtask directory linked to another DAG's would show that DAG's attempts to
    a user allowed to read this one. FileNotFoundError when a component does not exist.
    """
    os.close(_open_directories(root, _store_parts(root, path)))


def open_in_store(root: str | Path, path: str | Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file under ``root`` reached without any symlink.

    Attempt logs and records are written by stage applications (DAG authors' code on Spark hosts): one
    could replace its log with a link to the api-server's airflow.cfg, link an ``attempt=N`` directory
    elsewhere, or leave a FIFO that blocks a reader for ever. So every component below ``root`` is
    opened with O_NOFOLLOW relative to its parent's descriptor (no check-then-open race), the file
    without blocking, and only a regular file with one link is returned. FileNotFoundError when it
    does not exist; UnsafeStorePathError, naming no path, for everything refused.
    """
    parts = _store_parts(root, path)
    directory = _open_directories(root, parts[:-1])
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=directory)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise UnsafeStorePathError("a symbolic link in the store was refused") from None
        raise
    finally:
        os.close(directory)
    info = os.fstat(fd)
    # A hard link shares the inode of a file someone else wrote (it may be airflow.cfg): refused as well.
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise UnsafeStorePathError("a store entry that is not a regular file of its own was refused")
    return os.fdopen(fd, "rb")


def read_json_in_store(root: str | Path, path: str | Path) -> Any:
    """JSON of ``path`` under ``root`` reached without any symlink (None if missing); for ownership markers.

    Unlike :func:`open_in_store` a second link is allowed: an exclusively created file has two for a moment.
    """
    parts = _store_parts(root, path)
    try:
        directory = _open_directories(root, parts[:-1])
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise UnsafeStorePathError("a symbolic link in the store was refused") from None
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(directory)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise UnsafeStorePathError("a store entry that is not a regular file was refused")
        data = handle.read()
    try:
        return json.loads(data)
    except ValueError as exc:
        raise StoreError(f"corrupt JSON in {path}: {exc}") from None


def remove_in_store(root: str | Path, path: str | Path, *, tree: bool = False) -> bool:
    """Remove file ``path`` (or, with ``tree``, directory ``path`` and all below it) under ``root``; False if missing.

    Every directory on the way is opened with O_NOFOLLOW relative to its parent and the removal is done
    relative to that descriptor, so a directory swapped for a symlink never redirects a delete outside.
    """
    parts = _store_parts(root, path)
    try:
        directory = _open_directories(root, parts[:-1])
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        mode = os.lstat(parts[-1], dir_fd=directory).st_mode
        if tree and stat.S_ISLNK(mode):
            raise UnsafeStorePathError("a symbolic link in the store was refused")
        if tree and stat.S_ISDIR(mode):
            shutil.rmtree(parts[-1], dir_fd=directory)
        else:
            os.unlink(parts[-1], dir_fd=directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise UnsafeStorePathError("a symbolic link in the store was refused") from None
        _raise_for(Path(path), exc)
    finally:
        os.close(directory)
    return True


def _open_regular_fd(path: str | Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link in the store was refused") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _open_regular(path: str | Path) -> Any:
    """``path`` opened as UTF-8 text without blocking; OSError unless it is a regular file, not a link.

    A FIFO or device where a record should be (an attempt's code can make one) would block the reader,
    the controller or an api-server thread, for ever; a record replaced by a symlink would show another
    file's content (a secret of the api-server's host) as if the attempt had written it.
    """
    return os.fdopen(_open_regular_fd(path), encoding="utf-8")


def open_regular_bytes(path: str | Path) -> BinaryIO:
    """``path`` opened for reading bytes without blocking; OSError(EINVAL) unless it is a regular file."""
    return os.fdopen(_open_regular_fd(path), "rb")


def read_json(path: str | Path, default: Any = None) -> Any:
    """Read JSON from ``path``; ``default`` if it does not exist, StoreError naming it if it is not a plain file.

    The file itself must not be a symlink; a reader that knows the store's root and must not follow a
    linked directory either uses :func:`read_json_in_store`.
    """
    try:
        with _open_regular(path) as handle:
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
    path = Path(os.fspath(path))
    line = json_line(record)
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
        with _open_regular(path) as handle:
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
