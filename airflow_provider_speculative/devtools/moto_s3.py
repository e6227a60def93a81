"""moto's S3 server made closer to S3 where the suite relies on it: the S3 endpoint ``devtools/services.py`` starts.

moto checks ``If-None-Match: *`` (and ``If-Match``) and stores the object later in the same request
handler, without a lock, on a threaded server: two racing conditional creates can both succeed, which
real S3 never allows. Every object put and delete runs under one lock here, so a test of the store's
exclusive create exercises S3's guarantee and not moto's race.

moto answers a ranged GET by reading the whole object from its spooled temporary file and slicing it;
real S3 reads only the range, on cores that are not the client's. Here a ranged GetObject reads only the
requested bytes, while moto's own code still decides the status, ``Content-Range``, ``Content-Length``,
the 416 and every other header. werkzeug's line per request is off unless ``SPECULATIVE_MOTO_REQUEST_LOG=1``.

    python -m airflow_provider_speculative.devtools.moto_s3 -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()


def _serialized(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return method(self, *args, **kwargs)

    return run


def read_range(key: Any, offset: int, count: int) -> bytes:
    """``count`` bytes of a moto ``FakeKey``'s value from ``offset`` (fewer at its end), not reading the rest."""
    buffer = key._value_buffer
    with key.lock:
        if not getattr(buffer, "_rolled", True):
            # In memory: BytesIO.getvalue() shares its bytes without copying, so only the slice is copied.
            return buffer._file.getvalue()[offset : offset + count]
        file = getattr(buffer, "_file", None)
        if file is None:
            return key.value[offset : offset + count]
        # pread leaves the shared file position alone (moto's etag reads it without the key's lock);
        # flush first so bytes still in the writer's buffer are on the file descriptor.
        file.flush()
        descriptor = file.fileno()
        chunks = []
        while count > 0:
            chunk = os.pread(descriptor, count, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            count -= len(chunk)
        return b"".join(chunks)


class _ObjectBytes:
    """A stored object's value as moto's range handling sees it: its length, and its bytes read only when sliced."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __len__(self) -> int:
        return int(self.key.size)

    def __getitem__(self, item: slice) -> bytes:
        start, stop, step = item.indices(len(self))
        if step != 1:
            return self.whole()[item]
        return read_range(self.key, start, max(stop - start, 0))

    def whole(self) -> bytes:
        """The whole value, read the way moto reads it."""
        return bytes(self.key.value)


class _RangedKey:
    """A ``FakeKey`` whose ``value`` is an ``_ObjectBytes``: every other attribute is the key's own."""

    __slots__ = ("_key",)

    def __init__(self, key: Any) -> None:
        self._key = key

    @property
    def value(self) -> _ObjectBytes:
        """The value, unread until moto slices the requested range out of it."""
        return _ObjectBytes(self._key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._key, name)


def _is_ranged(headers: Any) -> bool:
    # The same test moto's key_response applies before it slices the body with _handle_range_header.
    return "range" in headers and headers["range"] != ""


def _ranged_get_object(get_object: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(get_object)
    def run(self: Any) -> Any:
        if not _is_ranged(self.headers):
            return get_object(self)
        get_key = self._get_key

        def ranged_key(*args: Any, **kwargs: Any) -> Any:
            key, not_modified = get_key(*args, **kwargs)
            return _RangedKey(key), not_modified

        # An attribute of this request's S3Response (moto makes one per request), not of the class.
        self._get_key = ranged_key
        try:
            return get_object(self)
        finally:
            del self._get_key

    return run


def _materialized(key_response: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(key_response)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        response = key_response(self, *args, **kwargs)
        # A body moto did not slice (a part number, several ranges, an unparsable range) is read and sent whole.
        if isinstance(response, tuple) and len(response) == 3 and isinstance(response[2], _ObjectBytes):
            status, headers, body = response
            return status, headers, body.whole()
        return response

    return run


def _disposed_under_lock(dispose: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(dispose)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        # read_range preads the file's descriptor under the key's lock: closing it under the same lock means
        # a deleted or replaced key's descriptor number cannot be reused by another file mid-read.
        lock = self.__dict__.get("lock")
        if lock is None:
            return dispose(self, *args, **kwargs)
        with lock:
            return dispose(self, *args, **kwargs)

    return run


def _replace(owner: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]], marker: str) -> None:
    method = getattr(owner, name)
    if not getattr(method, marker, False):
        wrapped = wrap(method)
        setattr(wrapped, marker, True)
        setattr(owner, name, wrapped)


def patch() -> None:
    """Serialise moto's object puts and deletes, and make its ranged GETs read only the range (idempotent)."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    for name in ("put_object", "delete_object"):
        _replace(S3Response, name, _serialized, "_speculative_serialized")
    _replace(S3Response, "get_object", _ranged_get_object, "_speculative_ranged")
    _replace(S3Response, "key_response", _materialized, "_speculative_ranged")
    _replace(FakeKey, "dispose", _disposed_under_lock, "_speculative_ranged")


# Tests set a tiny thread switch interval to make an unlocked check-then-store race likely.
SWITCH_INTERVAL_ENV = "SPECULATIVE_MOTO_SWITCH_INTERVAL"
# "1" keeps werkzeug's line per request (method, path, status) in the server's log, e.g. to count requests.
REQUEST_LOG_ENV = "SPECULATIVE_MOTO_REQUEST_LOG"


def quiet_request_log() -> None:
    """Drop werkzeug's line per request from moto's server; errors and the start-up line are still logged."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    def log_request(self: Any, code: int | str = "-", size: int | str = "-") -> None:
        """Log nothing: the line is formatted and written on every request, CPU a real S3 does not spend here."""

    MotoRequestHandler.log_request = log_request  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    """Patch moto, then serve it with moto's own command line (``-H``, ``-p``)."""
    interval = os.environ.get(SWITCH_INTERVAL_ENV)
    if interval:
        sys.setswitchinterval(float(interval))
    patch()
    if os.environ.get(REQUEST_LOG_ENV) != "1":
        quiet_request_log()
    from moto.server import main as serve

    serve(argv)


if __name__ == "__main__":
    main()
