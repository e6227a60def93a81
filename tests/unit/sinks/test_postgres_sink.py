"""PostgresSink's pure parts: the DSN built from a connection and the retry policy (COPY: test_postgres_staging)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import psycopg2
import pytest

from airflow_provider_speculative.exceptions import PlanError
from airflow_provider_speculative.sinks import postgres
from airflow_provider_speculative.sinks.postgres import libpq_dsn, with_retries


def _conn(**extra: Any) -> SimpleNamespace:
    return SimpleNamespace(conn_id="pg", host="db.example", port=5432, schema="sales", login="etl",
                           password="p'w\\d", extra_dejson=extra)


def test_dsn_keeps_libpq_extras_such_as_tls_settings() -> None:
    dsn = libpq_dsn(_conn(sslmode="verify-full", sslrootcert="/etc/ssl/ca.pem", options="-c search_path=x",
                          cursor="dictcursor"))
    assert dsn == ("host='db.example' port='5432' dbname='sales' user='etl' password='p\\'w\\\\d' "
                   "sslmode='verify-full' sslrootcert='/etc/ssl/ca.pem' options='-c search_path=x'")
    psycopg2.extensions.parse_dsn(dsn)  # libpq itself reads it


@pytest.mark.parametrize(("extra", "words"), [
    ({"iam": True}, "uses IAM authentication"),
    ({"sslmod": "require"}, "extras ['sslmod'] that are not libpq connection parameters"),
])
def test_dsn_refuses_extras_the_attempts_could_not_use(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(PlanError) as refused:
        libpq_dsn(_conn(**extra))
    assert words in str(refused.value) and "connection 'pg'" in str(refused.value)


def test_a_lost_connection_is_retried_and_a_lasting_one_fails_with_its_cause(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(postgres, "RETRY_WAIT_SECONDS", (0.0, 0.0))
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        return "done"

    assert with_retries(flaky, "writing staging table t") == "done" and len(calls) == 3
    assert "writing staging table t failed (server closed the connection unexpectedly); try 2 of 3" in \
        capsys.readouterr().err

    def down() -> None:
        raise psycopg2.OperationalError("connection refused")

    with pytest.raises(psycopg2.OperationalError, match="connection refused"):
        with_retries(down, "connecting")

    def wrong() -> None:
        calls.append(1)
        raise psycopg2.errors.UndefinedTable("no such table")

    calls.clear()
    with pytest.raises(psycopg2.errors.UndefinedTable):  # not transient: no second try
        with_retries(wrong, "committing")
    assert len(calls) == 1
