"""The speed check's session on a server: warmed once per process, ahead of the check when prepared."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_provider_speculative.backends import spark_connect
from airflow_provider_speculative.control import speedcheck
from airflow_provider_speculative.store.speeds import record_speeds
from tests.processes import wait_for

URL = "sc://127.0.0.1:1/;token=secret"


class _Server:
    """A stand-in server: counts sessions (channels) and queries, can hold or fail the first query."""

    def __init__(self) -> None:
        self.channels: list[str] = []
        self.queries: list[str] = []
        self.release_first = threading.Event()
        self.release_first.set()
        self.fail_first = False
        self.closed = 0

    def session(self, url: str, timeout: float) -> Any:
        server = self
        session_id = spark_connect.split_url(url)[1]["session_id"]
        server.channels.append(session_id)

        class _Session:
            channel = self

            def run_sql(self, query: str) -> None:
                first = not server.queries
                server.queries.append(session_id)
                if first:
                    assert server.release_first.wait(5)
                    if server.fail_first:
                        raise RuntimeError("UNAVAILABLE")

        return _Session()

    def close(self) -> None:
        self.closed += 1


@pytest.fixture()
def server(monkeypatch: pytest.MonkeyPatch) -> _Server:
    fake = _Server()
    monkeypatch.setattr(spark_connect, "ConnectSession", fake.session)
    monkeypatch.setattr(spark_connect, "_CHECK_SESSIONS", {})
    return fake


def test_a_check_without_preparation_warms_then_times_one_query_in_one_session(server: _Server) -> None:
    spark_connect.speed_check(URL)
    assert len(server.queries) == 2 and len(set(server.queries)) == 1
    assert len(server.channels) == 1  # the timed query reuses the warm channel: no handshake timed
    spark_connect.speed_check(URL)
    assert len(server.queries) == 3 and len(server.channels) == 1


def test_a_prepared_session_leaves_the_check_only_its_timed_query(server: _Server) -> None:
    spark_connect.prepare_speed_check(URL)
    wait_for(lambda: spark_connect._CHECK_SESSIONS[URL].warm.is_set(), 5, "the warm-up", interval=0.005)
    assert len(server.queries) == 1
    spark_connect.speed_check(URL)
    assert len(server.queries) == 2 and len(server.channels) == 1


def test_a_check_waits_for_a_warm_up_in_flight_instead_of_opening_a_second_session(server: _Server) -> None:
    server.release_first.clear()
    spark_connect.prepare_speed_check(URL)
    spark_connect.prepare_speed_check(URL)  # a second stage of the run: nothing new
    wait_for(lambda: len(server.queries) == 1, 5, "the warm-up query", interval=0.005)
    timed: list[float] = []
    checker = threading.Thread(target=lambda: timed.append(spark_connect.speed_check(URL)))
    checker.start()
    assert not timed  # blocked on the warm-up, which the server has not answered
    server.release_first.set()
    checker.join(5)
    assert timed and len(server.queries) == 2 and len(server.channels) == 1


def test_a_failed_warm_up_is_forgotten_and_the_check_starts_its_own_session(server: _Server) -> None:
    server.fail_first = True
    spark_connect.prepare_speed_check(URL)
    wait_for(lambda: URL not in spark_connect._CHECK_SESSIONS, 5, "the failed session forgotten", interval=0.005)
    spark_connect.speed_check(URL)
    assert len(server.channels) == 2 and server.queries[-1] == server.channels[-1]
    assert server.closed == 1  # the failed session's channel


def test_prepare_if_needed_follows_the_checks_own_rule(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict[str, str]] = []
    monkeypatch.setattr(speedcheck, "prepare_checks", lambda urls: started.append(dict(urls)))
    urls = {"a": "sc://a:1", "b": "sc://b:1"}
    assert speedcheck.prepare_if_needed(tmp_path, urls, "d/r", 3600.0)
    assert not speedcheck.prepare_if_needed(tmp_path, {"a": "sc://a:1"}, "d/r", 3600.0)  # one server: no check
    assert not speedcheck.prepare_if_needed(tmp_path, urls, "d/r", 0.0)  # checks off
    record_speeds(tmp_path, {"a": 1.0, "b": 1.1}, time.time(), "d/r/speed_check")
    assert not speedcheck.prepare_if_needed(tmp_path, urls, "d/r", 3600.0)  # this run already measured both
    assert started == [urls]


def test_the_operator_prepares_from_its_connections_and_never_fails_the_stage(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from airflow_provider_speculative.core.config import Target
    from airflow_provider_speculative.operators import stage as stage_operator
    from airflow_provider_speculative.store.backend import PosixBackend

    monkeypatch.setenv("AIRFLOW_CONN_SC_A", '{"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15101}')
    monkeypatch.setenv("AIRFLOW_CONN_SC_B", '{"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15102}')
    monkeypatch.setenv("AIRFLOW_CONN_LOCAL", '{"conn_type": "spark", "host": "local[1]"}')
    started: list[dict[str, str]] = []
    monkeypatch.setattr(speedcheck, "prepare_checks", lambda urls: started.append(dict(urls)))
    targets = [Target("a", "sc_a"), Target("b", "sc_b"), Target("c", "local"), Target("d", "missing")]
    planner = SimpleNamespace(store=PosixBackend(tmp_path), run=SimpleNamespace(dag_id="d", run_id="r"), stage="s",
                              config=SimpleNamespace(targets=targets, speed_check_age=3600.0))
    warnings: list[Any] = []
    log = SimpleNamespace(warning=lambda *args: warnings.append(args))
    stage_operator._prepare_speed_check(planner, log)  # type: ignore[arg-type]
    assert [sorted(u) for u in started] == [["a", "b"]] and not warnings
    (tmp_path / "file").write_text("not a store")
    planner.store = PosixBackend(tmp_path / "file")
    monkeypatch.setattr(speedcheck, "read_records", lambda *a: 1 / 0)
    stage_operator._prepare_speed_check(planner, log)  # type: ignore[arg-type]
    assert warnings and warnings[0][2] == "ZeroDivisionError"
