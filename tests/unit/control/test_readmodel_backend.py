"""The read model on a store that is not POSIX: plans, subtasks and attempts by name, one listing per poll."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control import readmodel
from airflow_provider_speculative.control.readmodel import (
    clear_cache,
    journal_records,
    latest_run_id,
    run_plans,
    run_report,
    stage_report,
)
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.exceptions import NotFoundError
from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend

ROOT = Path("/nowhere/store")  # never touched: every object is in memory
DAG, RUN, STAGE = "mem_dag", "manual__2026-11-28T00:00:00+00:00", "scan"
T0 = 1_700_000_000.0


class StoreReader:
    """Polls attempts by name on the same store (as the attempt observer reads them on POSIX); counts polls."""

    def __init__(self, store: MemoryBackend, stage: str) -> None:
        self.store, self.stage, self.polls = store, stage, 0

    def poll(self, subtask: int, attempt: int, now: float | None = None) -> Attempt:
        self.polls += 1
        base = f"{self.stage}/subtask={subtask}/attempt={attempt}"
        claim = self.store.read_json(f"{base}/claim.json") or {}
        status = self.store.read_json(f"{base}/status.json") or {}
        if self.store.exists(f"{base}/invalidated.json"):
            status = {**status, "state": "CANCELED"}
        return Attempt(subtask, attempt, claim.get("target", "?"), AttemptState(status.get("state", "RUNNING")),
                       created_at=claim.get("created_at"), deploying_at=status.get("deploying_at"),
                       end_at=status.get("end_at"), exit_code=status.get("exit_code"))


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    clear_cache()
    yield
    clear_cache()


def _stage(n: int) -> tuple[MemoryBackend, StageLayout, dict[str, Any], str]:
    """A stage of ``n`` ended subtasks in memory: attempt 0 of each admitted, with data objects below it."""
    store = MemoryBackend()
    plan = stage_plan(ROOT, dag_id=DAG, run_id=RUN, stage=STAGE, parallelism=n)
    layout = StageLayout(ROOT, DAG, RUN, STAGE)
    stage = layout.name(layout.dir)
    store.claim(layout.run_prefix)
    store.replace_json(f"{stage}/plan.json", plan)
    for subtask in range(n):
        base = f"{stage}/subtask={subtask}/attempt=0"
        store.create_exclusive_json(f"{base}/claim.json", {"created_at": T0, "target": "local-a",
                                                           "reason": "initial attempt"})
        store.replace_json(f"{base}/status.json", {"deploying_at": T0 + 1, "state": "FINISHED", "end_at": T0 + 6,
                                                   "exit_code": 0})
        store.replace_json(f"{base}/heartbeat.json", {"node": "n1", "at": T0 + 5})
        for part in range(3):
            store.replace(f"{base}/data/_sp={part}/part-0.parquet", b"rows")
        store.replace_json(f"{base}/_SUCCESS", {"files": [], "timings": {"write_s": 1.0}})
        store.create_exclusive_json(f"{stage}/subtask={subtask}/admitted.json", {"attempt": 0})
    store.append_record(f"{stage}/journal.jsonl", {"at": T0, "event": "launch", "subtask": 0})
    store.replace_json(f"{stage}/summary.json", {"speculation": "on"})
    return store, layout, plan, stage


def test_the_report_reads_plans_subtasks_and_attempts_by_name() -> None:
    store, layout, plan, stage = _stage(3)
    # Subtask 1 gets a failed speculative copy; subtask 2 loses its admission and its attempt is withdrawn.
    copy = f"{stage}/subtask=1/attempt=1"
    store.create_exclusive_json(f"{copy}/claim.json", {"created_at": T0, "target": "local-b",
                                                       "reason": "speculative copy"})
    store.replace_json(f"{copy}/status.json", {"deploying_at": T0 + 2, "state": "FAILED", "end_at": T0 + 3,
                                               "exit_code": 1})
    store.delete(f"{stage}/subtask=2/admitted.json")
    store.replace_json(f"{stage}/subtask=2/attempt=0/invalidated.json", {"reason": "rerun"})
    assert run_plans(ROOT, DAG, RUN, store=store) == {STAGE: plan}
    assert latest_run_id(ROOT, DAG, store=store) == RUN
    assert [r["event"] for r in journal_records(layout, store=store)] == ["launch"]
    reader = StoreReader(store, stage)
    report = stage_report(layout, plan, store=store, poller=reader, now=T0 + 100, with_claims=True)
    assert [s["admitted"] for s in report["subtasks"]] == [0, 0, None]
    assert [[a["state"] for a in s["attempts"]] for s in report["subtasks"]] == [
        ["FINISHED"], ["FINISHED", "FAILED"], ["CANCELED"]]
    assert report["subtasks"][1]["attempts"][1]["reason"] == "speculative copy"
    assert report["subtasks"][0]["attempts"][0]["phases"] is not None  # the manifest's timings were read
    assert report["subtasks"][0]["attempts"][0]["last_seen"] == T0 + 5  # the heartbeat was read
    assert report["speculation"] == "on" and report["journal_events"] == 1 and not report["committed"]


def test_run_report_finds_the_run_on_the_backend_and_refuses_a_missing_one() -> None:
    store, _, _, _ = _stage(2)
    with pytest.raises(NotFoundError):
        run_report(ROOT, DAG, "no-such-run", store=store)
    with pytest.raises(NotFoundError):
        latest_run_id(ROOT, "no-such-dag", store=store)
    # Without an attempt reader of its own, run_report polls through the observer of a layout over the store it
    # reads, which reads each attempt's records by name there (a store without paths).
    report = run_report(ROOT, DAG, RUN, store=store, liveness="heartbeat", now=T0 + 100)
    assert [s["stage"] for s in report["stages"]] == [STAGE]
    assert [s["admitted"] for s in report["stages"][0]["subtasks"]] == [0, 0]
    assert [[(a["state"], a["node"]) for a in s["attempts"]] for s in report["stages"][0]["subtasks"]] == [
        [("FINISHED", "n1")], [("FINISHED", "n1")]]


def test_a_poll_lists_the_stage_once_and_a_second_one_reads_no_attempt_object() -> None:
    n = 500
    store, layout, plan, _ = _stage(n)
    reader = StoreReader(store, layout.name(layout.dir))
    store.listings = store.reads = store.stats = 0
    first = stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    # One listing of the stage prefix for every subtask and attempt (never one per subtask or attempt).
    assert store.listings == 1 and reader.polls == n
    store.listings = store.reads = store.stats = 0
    reader.polls = 0
    second = stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    assert second == first
    assert store.listings == 1 and reader.polls == 0 and store.stats == 0
    assert store.reads <= 4  # summary and committed; no attempt's object is read again
    assert len(readmodel._CACHE) == 2 * n  # a listing per subtask, a row per ended attempt


def test_a_replaced_or_new_object_shows_at_once_on_the_next_poll() -> None:
    store, layout, plan, stage = _stage(2)
    reader = StoreReader(store, stage)
    stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    # The same size and no later mtime would not tell; the ETag does.
    base = f"{stage}/subtask=0/attempt=0"
    status = store.read_json(f"{base}/status.json")
    store.replace_json(f"{base}/status.json", {**status, "exit_code": 7})
    store.replace_json(f"{base}/invalidated.json", {"reason": "rerun"})
    store.delete(f"{stage}/subtask=0/admitted.json")
    store.create_exclusive_json(f"{stage}/subtask=1/attempt=1/claim.json", {"created_at": T0, "target": "local-a"})
    after = stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    clear_cache()
    assert after == stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    assert after["subtasks"][0]["admitted"] is None
    assert after["subtasks"][0]["attempts"][0]["exit_code"] == 7
    assert after["subtasks"][0]["attempts"][0]["state"] == "CANCELED"
    assert [a["attempt"] for a in after["subtasks"][1]["attempts"]] == [0, 1]


def test_a_live_attempt_is_never_cached() -> None:
    store, layout, plan, stage = _stage(1)
    base = f"{stage}/subtask=0/attempt=1"
    store.create_exclusive_json(f"{base}/claim.json", {"created_at": time.time(), "target": "local-a"})
    store.replace_json(f"{base}/status.json", {"deploying_at": time.time(), "state": "RUNNING"})
    reader = StoreReader(store, stage)
    stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    reader.polls = 0
    stage_report(layout, plan, store=store, poller=reader, now=T0 + 100)
    assert reader.polls == 1  # the running attempt, read again; the ended one from the cache


def test_on_posix_a_linked_subtask_or_attempt_directory_is_not_followed(tmp_path: Path) -> None:
    from airflow_provider_speculative.store.files import atomic_write_json
    from tests.factories import write_plan

    plan = stage_plan(tmp_path / "store", dag_id=DAG, run_id=RUN, stage=STAGE, parallelism=2)
    layout = write_plan(plan)
    elsewhere = tmp_path / "another-dags-attempt"
    atomic_write_json(elsewhere / "claim.json", {"created_at": T0, "target": "secret-target"})
    atomic_write_json(elsewhere / "status.json", {"state": "FINISHED", "end_at": T0, "exit_code": 0})
    atomic_write_json(layout.claim(0, 0), {"created_at": T0, "target": "local-a"})
    layout.attempt_dir(0, 1).symlink_to(elsewhere, target_is_directory=True)
    layout.subtask_dir(1).symlink_to(layout.subtask_dir(0), target_is_directory=True)
    report = stage_report(layout, plan, liveness="heartbeat", now=T0 + 100)
    assert [a["attempt"] for a in report["subtasks"][0]["attempts"]] == [0]
    assert report["subtasks"][1]["attempts"] == [] and "secret-target" not in repr(report)
