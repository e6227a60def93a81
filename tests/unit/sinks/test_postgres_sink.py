"""PostgresSink's pure parts: the DSN built from a connection and the retry policy (COPY: test_postgres_staging)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from airflow_provider_speculative.exceptions import PlanError
from airflow_provider_speculative.sinks import postgres
from airflow_provider_speculative.sinks.postgres import libpq_dsn, with_retries


def _conn(**extra: Any) -> SimpleNamespace:
    return SimpleNamespace(conn_id="pg", host="db.example", port=5432, schema="sales", login="etl",
                           password="p'w\\d", extra_dejson=extra)


def test_dsn_is_what_postgres_hook_connects_with_tls_extras_kept_and_its_own_dropped() -> None:
    dsn = libpq_dsn(_conn(sslmode="verify-full", sslrootcert="/etc/ssl/ca.pem", options="-c search_path=x",
                          cursor="dictcursor", sqlalchemy_scheme="postgresql+psycopg2"))
    # libpq itself reads it back; the hook's own extras (cursor, sqlalchemy_scheme) are not parameters.
    assert psycopg2.extensions.parse_dsn(dsn) == {
        "host": "db.example", "port": "5432", "dbname": "sales", "user": "etl", "password": "p'w\\d",
        "sslmode": "verify-full", "sslrootcert": "/etc/ssl/ca.pem", "options": "-c search_path=x"}


def test_dsn_follows_the_hooks_rules_and_never_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.postgres.hooks import postgres as hook_module

    def no_connecting(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("building a DSN connected to the database")

    monkeypatch.setattr(hook_module, "ppg2_connect", no_connecting)
    monkeypatch.setattr(psycopg2, "connect", no_connecting)
    # An extra the hook keeps to itself stays out of the DSN: the DSN is the hook's, not a copy of its rules.
    monkeypatch.setattr(hook_module.PostgresHook, "ignored_extra_options",
                        hook_module.PostgresHook.ignored_extra_options | {"application_name"})
    dsn = libpq_dsn(_conn(application_name="etl-job", connect_timeout=5))
    assert psycopg2.extensions.parse_dsn(dsn)["connect_timeout"] == "5"
    assert "application_name" not in psycopg2.extensions.parse_dsn(dsn)


def test_master_side_dsn_resolves_the_connection_through_postgres_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PG_TLS", "postgresql://etl:s3cret@db.example:5433/sales?sslmode=require")
    sink = postgres.PostgresSink("sales", postgres_conn_id="pg_tls")
    assert psycopg2.extensions.parse_dsn(sink._dsn()) == {
        "host": "db.example", "port": "5433", "dbname": "sales", "user": "etl", "password": "s3cret",
        "sslmode": "require"}
    # A trigger hands the DSN it resolved itself: no lookup then.
    assert sink._dsn({postgres.dsn_env_var("pg_tls"): "host=elsewhere"}) == "host=elsewhere"


@pytest.mark.parametrize(("extra", "words"), [
    ({"iam": True}, "uses IAM authentication"),
    ({"iam": "yes", "aws_conn_id": "aws"}, "uses IAM authentication"),
    ({"sslmod": "require"}, "extras ['sslmod'] that are not libpq connection parameters"),
    ({"enable_log_db_messages": True}, "extras ['enable_log_db_messages'] that are not libpq"),
])
def test_dsn_refuses_extras_the_attempts_could_not_use(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(PlanError) as refused:
        libpq_dsn(_conn(**extra))
    assert words in str(refused.value) and "connection 'pg'" in str(refused.value)
    assert "p'w" not in str(refused.value)  # never the password


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
