"""The speed check of Spark Connect targets before a stage's first wave (control/speedcheck.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.control.speedcheck import check_speeds
from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.speeds import claim_speed_check, record_speeds, speed_path
from tests.factories import Clock, stage_plan, write_plan
from tests.unit.control.test_controller import FakeBackend

URLS = {"local-a": "sc://a:15002/", "local-b": "sc://b:15002/"}


class Servers:
    """Fake checks: ``fast`` answer at once; a blocked one answers only when the test releases it."""

    def __init__(self, answers: dict[str, float | None]) -> None:
        self.answers = answers
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(self, url: str) -> float:
        self.calls.append(url)
        seconds = self.answers[url]
        if seconds is None:
            self.release.wait(10)  # a throttled server: still busy when the check stops waiting
            return 9.9
        if seconds < 0:
            raise ConnectionError("refused")
        return seconds


@pytest.fixture
def servers() -> Iterator[Callable[[dict[str, float | None]], Servers]]:
    made: list[Servers] = []

    def make(answers: dict[str, float | None]) -> Servers:
        made.append(Servers(answers))
        return made[-1]

    yield make
    for fake in made:
        fake.release.set()


def connect_controller(tmp_path: Path, check: Servers, parallelism: int = 8, stage: str = "scan",
                       kind: str = "spark_connect",
                       **config: object) -> tuple[StageController, FakeBackend, StageLayout]:
    plan = stage_plan(tmp_path / "store", stage=stage, parallelism=parallelism, config=config)
    for spec in plan["targets"].values():
        spec["kind"] = kind
    layout = write_plan(plan)
    clock = Clock()
    backend = FakeBackend(layout, clock)
    controller = StageController.open(plan, clock=clock, backends={"local-a": backend, "local-b": backend},
                                 observer=backend, target_env={n: {REMOTE_ENV: u} for n, u in URLS.items()},
                                 speed_check=check)
    return controller, backend, layout


def test_the_wait_ends_a_few_fastest_answers_after_the_start_not_when_the_slow_server_answers(servers) -> None:
    fake = servers({"sc://a:15002/": 0.005, "sc://b:15002/": None})
    result = check_speeds(URLS, fake)
    # Returned while local-b's check was still blocked (waiting for it would have given its 9.9 s).
    assert result.durations == {"local-a": 0.005, "local-b": None}
    assert result.slowness["local-a"] == 1.0 and result.slowness["local-b"] >= 2.0


def test_a_first_answer_late_in_the_timeout_still_leaves_the_others_the_full_wait() -> None:
    release = threading.Event()

    def check(url: str) -> float:
        if url == URLS["local-a"]:
            release.wait(0.15)  # the fast server's whole check (a cold session) takes most of the timeout
            return 0.15
        release.wait(10)  # the throttled server: still busy
        return 9.9

    try:
        result = check_speeds(URLS, check, timeout=0.2)
    finally:
        release.set()
    assert result.durations == {"local-a": 0.15, "local-b": None}
    # Waited twice the fast answer, past the 0.2 s timeout: the busy server reads as slow, not as noise.
    assert result.waited >= 0.3 and result.slowness["local-b"] >= 2.0, result


def test_a_server_that_refuses_is_a_failure_not_a_speed(servers) -> None:
    fake = servers({"sc://a:15002/": 0.01, "sc://b:15002/": -1.0})
    result = check_speeds(URLS, fake)
    assert result.failed == {"local-b": "ConnectionError: refused"}
    assert result.slowness == {}  # one answer: nothing to compare it with


def test_no_answer_within_the_timeout_gives_no_result(servers) -> None:
    fake = servers({"sc://a:15002/": None, "sc://b:15002/": None})
    result = check_speeds(URLS, fake, timeout=0.05)
    assert result.durations == {"local-a": None, "local-b": None} and result.slowness == {}


def test_a_slow_nodes_first_run_holds_its_first_wave_for_the_fast_server(tmp_path: Path, servers) -> None:
    # local-b never answers: its slowness is the wait over local-a's whole check, about 2x. local-a answers in
    # 0.25 s so that the wait overshooting its deadline on a loaded machine (tens of ms) keeps that ratio
    # under 2.5x, where holding for local-a would start to pay (HOLD_MARGIN).
    fake = servers({"sc://a:15002/": 0.25, "sc://b:15002/": None})
    controller, backend, layout = connect_controller(tmp_path, fake)
    check = [e for e in read_jsonl(layout.journal) if e["event"] == "speed_check"]
    assert len(check) == 1 and check[0]["seconds"] == {"local-a": 0.25, "local-b": None}
    assert check[0]["slowness"]["local-b"] >= 2.0
    record = read_json(speed_path(tmp_path / "store", "local-b"))
    assert record["from"] == "d/r/speed-check" and record["slowness"] >= 2.0
    controller.step()
    targets = [spec.target for spec in backend.launched]
    # local-a's four slots, then one original on local-b (at least 2x slower: waiting for local-a would
    # not end sooner), and no more there: a slow target runs one attempt at a time. No probe either
    # (the check measured local-b in this run).
    assert targets == ["local-a"] * 4 + ["local-b"] and sorted(controller.scheduler.held_back) == [5, 6, 7]
    assert controller.scheduler.probe_targets == frozenset()
    assert controller.summary()["target_speeds"]["local-b"]["source"] == "speed check"
    assert "speed check" in controller.scheduler.held_back[7][1]


def test_equal_servers_are_filled_as_without_a_check(tmp_path: Path, servers) -> None:
    fake = servers({"sc://a:15002/": 0.10, "sc://b:15002/": 0.19})
    controller, backend, _ = connect_controller(tmp_path, fake)
    controller.step()
    assert sorted(spec.target for spec in backend.launched) == ["local-a"] * 4 + ["local-b"] * 4


def test_a_second_stage_of_the_run_waits_for_the_first_ones_check_instead_of_checking(tmp_path, servers) -> None:
    assert claim_speed_check(tmp_path / "store", URLS, "d/r", 1000.0)  # another stage of the run holds it
    record_speeds(tmp_path / "store", {"local-a": 1.0, "local-b": 6.0}, 1000.0, "d/r/speed-check")
    fake = servers({})
    controller, _, _ = connect_controller(tmp_path, fake, stage="other")
    assert fake.calls == []
    assert controller.scheduler.target_history == {"local-a": 1.0, "local-b": 6.0}


def test_no_check_when_turned_off_or_when_history_is_fresh_and_healthy(tmp_path: Path, servers) -> None:
    fake = servers({})
    connect_controller(tmp_path / "off", fake, speed_check_age=0)
    record_speeds(tmp_path / "fresh" / "store", {"local-a": 1.0, "local-b": 1.2}, Clock().now - 60, "d/r0/scan")
    connect_controller(tmp_path / "fresh", fake)
    assert fake.calls == []


def test_spark_submit_targets_are_never_checked(tmp_path: Path, servers) -> None:
    fake = servers({})  # any call fails: no answer is known for any URL
    _, _, layout = connect_controller(tmp_path, fake, kind="spark_submit")  # same URLs, but a JVM per check
    assert fake.calls == []
    assert [e for e in read_jsonl(layout.journal) if e["event"] == "speed_check"] == []


def test_the_fork_server_starts_before_the_check_waits_and_only_once(servers, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.control import controller as controller_module

    order: list[str] = []
    fake = servers({"sc://a:15002/": 0.01, "sc://b:15002/": 0.01})
    monkeypatch.setattr(controller_module, "prestart_fork_server", lambda: order.append("fork server"))
    monkeypatch.setattr(FakeBackend, "fork_server", True, raising=False)

    def check(url: str) -> float:
        order.append("check")
        return fake(url)

    controller, _, _ = connect_controller(tmp_path, check)  # type: ignore[arg-type]
    assert order[0] == "fork server" and order.count("check") == 2, order
    controller.step()
    controller.step()
    assert order.count("fork server") == 1, order
    # A stage of a run already checked neither checks nor starts anything before its first step.
    order.clear()
    connect_controller(tmp_path, check, stage="aggregate")  # type: ignore[arg-type]
    assert order == [], order
