"""The suite's PostgreSQL, Redis and S3 endpoint: started on first use on free loopback ports, stopped at the end.

A test or fixture asks for them (``postgres()``, ``redis()``, ``s3()``); nothing assumes a server that was running
before, nor port 5432 or 6379. When a server cannot start, the test fails with the reason (what to
install): the suite provides these servers, so their absence is never a skip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from airflow_provider_speculative.devtools.services import (
    PostgresServer,
    RedisServer,
    S3Server,
    start_postgres,
    start_redis,
    start_s3,
)

_lock = threading.Lock()
_running: dict[str, Any] = {}


def _started(name: str, start: Callable[[], Any]) -> Any:
    with _lock:
        server = _running.get(name)
        if server is None or not server.alive:
            server = _running[name] = start()
        return server


def postgres() -> PostgresServer:
    """The session's PostgreSQL server (started on the first call)."""
    return cast(PostgresServer, _started("postgres", start_postgres))


def redis() -> RedisServer:
    """The session's Redis server (started on the first call)."""
    return cast(RedisServer, _started("redis", start_redis))


def s3() -> S3Server:
    """The session's S3 endpoint (started on the first call)."""
    return cast(S3Server, _started("s3", start_s3))


def stop_all() -> None:
    """Stop whatever this session started."""
    with _lock:
        for server in _running.values():
            server.stop()
        _running.clear()
