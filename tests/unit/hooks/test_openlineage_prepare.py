"""prepare_openlineage: the provider's import and adapter, warmed once per process in the background."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_speculative.hooks import openlineage


def test_prepare_builds_the_adapter_once_in_a_background_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.openlineage import conf as ol_conf

    built: list[str] = []

    def adapter() -> object:
        built.append(threading.current_thread().name)
        return object()

    monkeypatch.setattr(openlineage, "_prepared", threading.Event())
    monkeypatch.setattr(openlineage, "_adapter", adapter)
    monkeypatch.setattr(ol_conf, "is_disabled", lambda: False)
    thread = openlineage.prepare_openlineage()
    assert thread is not None and openlineage.prepare_openlineage() is None  # a second stage: nothing more
    thread.join(10)
    assert built == ["openlineage-prepare"]


def test_prepare_builds_nothing_when_openlineage_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.openlineage import conf as ol_conf

    checked: list[str] = []
    built: list[str] = []
    monkeypatch.setattr(openlineage, "_prepared", threading.Event())
    monkeypatch.setattr(openlineage, "_adapter", lambda: built.append("adapter"))
    monkeypatch.setattr(ol_conf, "is_disabled", lambda: checked.append("disabled?") or True)
    thread = openlineage.prepare_openlineage()
    assert thread is not None
    thread.join(10)
    assert checked == ["disabled?"] and built == []
