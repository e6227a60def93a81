"""The suite's PostgreSQL and Redis: started on first use on free loopback ports, stopped when the session ends.

A test or fixture asks for them (``postgres()``, ``redis()``); nothing assumes a server that was running
before, nor port 5432 or 6379. When a server cannot start, the test fails with the reason (what to
install): the suite provides these servers, so their absence is never a skip.
"""

from __future__ import annotations

import threading

from airflow_provider_speculative.devtools.services import PostgresServer, RedisServer, start_postgres, start_redis

_lock = threading.Lock()
_postgres: PostgresServer | None = None
_redis: RedisServer | None = None


def postgres() -> PostgresServer:
    """The session's PostgreSQL server (started on the first call)."""
    global _postgres
    with _lock:
        if _postgres is None or not _postgres.alive:
            _postgres = start_postgres()
        return _postgres


def redis() -> RedisServer:
    """The session's Redis server (started on the first call)."""
    global _redis
    with _lock:
        if _redis is None or not _redis.alive:
            _redis = start_redis()
        return _redis


def stop_all() -> None:
    """Stop whatever this session started."""
    global _postgres, _redis
    with _lock:
        for server in (_postgres, _redis):
            if server is not None:
                server.stop()
        _postgres = _redis = None
