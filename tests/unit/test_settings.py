"""settings.metadata_db_identity in the places Airflow runs provider code."""

from __future__ import annotations

import pytest

from airflow_provider_speculative import settings


def test_a_task_process_with_the_database_blocked_has_no_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    # What Airflow 3's supervisor sets in every task process (supervisor.block_orm_access).
    monkeypatch.setattr(settings, "airflow_conf", lambda: type("Conf", (), {
        "get": staticmethod(lambda section, key: "airflow-db-not-allowed:///")})())
    assert settings.metadata_db_identity() is None


def test_a_configured_database_has_a_password_free_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "airflow_conf", lambda: type("Conf", (), {
        "get": staticmethod(lambda section, key: "postgresql+psycopg2://u:secret@127.0.0.1:5432/airflow")})())
    identity = settings.metadata_db_identity()
    assert identity is not None and "secret" not in identity["url"] and identity["dialect"] == "postgresql"
