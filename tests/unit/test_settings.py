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


@pytest.mark.parametrize(("cores", "slots"), [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8)])
def test_unset_targets_follow_the_hosts_cores(cores: int, slots: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative import settings

    monkeypatch.delenv("AIRFLOW__SPECULATIVE__TARGETS", raising=False)
    monkeypatch.setattr(settings, "host_cores", lambda: cores)
    targets = settings.airflow_config().targets
    assert [(t.name, t.slots, t.conf) for t in targets] == [
        ("local-a", slots, {"spark.ui.enabled": "false"}), ("local-b", slots, {"spark.ui.enabled": "false"})]
    # Configured targets are the operator's: the host's cores change nothing.
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__TARGETS", '[{"name": "far", "conn_id": "spark_default", "slots": 7}]')
    assert [(t.name, t.slots) for t in settings.airflow_config().targets] == [("far", 7)]


def test_host_cores_are_the_ones_this_process_may_use() -> None:
    import os

    from airflow_provider_speculative.settings import host_cores

    assert host_cores() == len(os.sched_getaffinity(0)) >= 1


def test_fault_injection_in_airflow_cfg_fails_naming_the_variable_that_replaces_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.exceptions import ConfigError

    monkeypatch.setenv("AIRFLOW__SPECULATIVE__FAULT_INJECTION", '{"targets": {"local-b": {"factor": 4}}}')
    with pytest.raises(ConfigError, match=r"^\[speculative\] fault_injection \(airflow.cfg or "
                                          r"AIRFLOW__SPECULATIVE__FAULT_INJECTION\): fault injection is a test "
                                          r"facility, not an option: set the environment variable "
                                          r"SPECULATIVE_FAULT_INJECTION"):
        settings.airflow_config()
    monkeypatch.delenv("AIRFLOW__SPECULATIVE__FAULT_INJECTION")
    assert settings.airflow_config().enabled is False
