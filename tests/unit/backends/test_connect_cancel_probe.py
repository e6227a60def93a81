"""Cancelling on a server that is gone or unreachable: a short probe first, never an RPC deadline per attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.backends import spark_connect
from airflow_provider_speculative.backends.spark_connect import SparkConnectBackend, probe_server
from airflow_provider_speculative.store.files import atomic_write_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests.processes import free_port

SID = "0b5c6a1e-7a3f-4b0e-9a55-6f0d1b2c3d4e"


def _backend(tmp_path: Path, port: int) -> SparkConnectBackend:
    layout = StageLayout(tmp_path, "d", "r", "s")
    atomic_write_json(layout.attempt_dir(0, 0) / "connect.json",
                      {"server": f"sc://127.0.0.1:{port}/;user_id=speculative", "user_id": "speculative",
                       "session_id": SID, "at": 0.0})
    return SparkConnectBackend(layout)


class _NoSession:
    def __init__(self, url: str) -> None:
        raise AssertionError(f"no RPC may be tried on a server that does not answer ({url})")


def test_a_refused_port_has_no_server_so_the_attempt_is_gone_at_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(spark_connect, "ConnectSession", _NoSession)
    backend = _backend(tmp_path, free_port())  # nothing listens there
    record = backend.connect_record(0, 0)

    assert backend._server_step(0, 0, record, release=True, now=1000.0) is True
    state = read_json(backend.layout.attempt_dir(0, 0) / "connect-cancel.json")
    assert state["server_gone_at"] and "refused" in state["error"]
    assert not backend.cleanup_pending(0, 0)
    assert [e["event"] for e in read_jsonl(backend.layout.journal)] == ["connect_server_gone"]


def test_an_unreachable_server_costs_a_probe_then_is_given_up_after_the_deadline(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(spark_connect, "ConnectSession", _NoSession)
    monkeypatch.setattr(spark_connect, "probe_server", lambda url: ("unreachable", "10.0.0.9:15002 timed out"))
    backend = _backend(tmp_path, 15002)
    record = backend.connect_record(0, 0)

    assert backend._server_step(0, 0, record, release=True, now=1000.0) is False
    assert backend.cleanup_pending(0, 0)  # a partition may heal: keep trying until the give-up
    assert backend._server_step(0, 0, record, release=True,
                                now=1000.0 + spark_connect.UNREACHABLE_GIVE_UP) is True
    state = read_json(backend.layout.attempt_dir(0, 0) / "connect-cancel.json")
    assert state["errors"] == 2 and state["gave_up_at"] and "timed out" in state["error"]
    assert [e["event"] for e in read_jsonl(backend.layout.journal)] == ["connect_unreachable",
                                                                         "connect_cancel_gave_up"]


def test_a_server_that_answers_is_interrupted_and_released(tmp_path, monkeypatch) -> None:
    calls: list[str] = []

    class Session:
        def __init__(self, url: str) -> None:
            calls.append("open")

        def __enter__(self) -> Session:
            return self

        def __exit__(self, *exc: object) -> None:
            calls.append("close")

        def interrupt_all(self) -> list[str]:
            calls.append("interrupt")
            return ["op-1"]

        def running_operations(self) -> list[str]:
            return []

        def release(self) -> None:
            calls.append("release")

    monkeypatch.setattr(spark_connect, "ConnectSession", Session)
    monkeypatch.setattr(spark_connect, "probe_server", lambda url: None)
    backend = _backend(tmp_path, 15002)
    assert backend._server_step(0, 0, backend.connect_record(0, 0), release=True) is True
    assert calls == ["open", "interrupt", "release", "close"]
    assert read_json(backend.layout.attempt_dir(0, 0) / "connect-cancel.json")["interrupted"] == ["op-1"]


@pytest.mark.parametrize("url", ["sc://127.0.0.1:{port}/;user_id=u;session_id=s", "sc://127.0.0.1:{port}"])
def test_probe_reads_the_address_of_a_connect_url(url: str) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert probe_server(url.format(port=port)) is None
    assert probe_server(url.format(port=port))[0] == "refused"
