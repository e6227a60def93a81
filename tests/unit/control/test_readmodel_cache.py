"""The read model's cache of ended attempts: the same answers as a full read, and few files read per poll."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.backends.registry import heartbeat_observer
from airflow_provider_speculative.control import readmodel
from airflow_provider_speculative.control.readmodel import clear_cache, stage_report
from airflow_provider_speculative.plugin.model import stage_view
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import remove_attempt_output
from tests.factories import stage_plan, write_plan

DAG, RUN, STAGE = "cache_dag", "manual__2026-11-27T00:00:00+00:00", "scan"
T0 = 1_700_000_000.0  # long ago: every directory aged to it is past the racy window
OLD_NS = int(T0 * 1e9)


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)  # renamed over, as every writer of the store does


def _attempt(layout: StageLayout, subtask: int, number: int, state: str | None, *, at: float = T0,
             reason: str = "initial attempt", manifest: bool = False) -> None:
    _write(layout.claim(subtask, number), {"created_at": at, "node": "n1", "target": "local-a",
                                           "speculative": number > 0, "reason": reason})
    status: dict[str, Any] = {"deploying_at": at + 1, "node": "n1", "pid": 999_999_999, "pgid": 1, "host": "h",
                              "alive_at": at + 4}
    if state:
        status.update(state=state, end_at=at + 6, exit_code=0 if state == "FINISHED" else 1)
    _write(layout.status(subtask, number), status)
    _write(layout.heartbeat(subtask, number), {"phase": state or "RUNNING", "node": "n1", "at": at + 5,
                                               "app_id": f"app-{subtask}-{number}"})
    if manifest:
        _write(layout.manifest(subtask, number), {"files": [], "timings": {
            "session_ready_at": at + 2, "write_started_at": at + 3, "write_s": 1.5, "manifest_s": 0.5}})


def _age(layout: StageLayout) -> None:
    """Set every subtask and attempt directory's mtime far in the past (their ctime stays now)."""
    for sub in layout.dir.glob("subtask=*"):
        for entry in [*sub.glob("attempt=*"), sub]:
            os.utime(entry, ns=(OLD_NS, OLD_NS))


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[StageLayout, dict[str, Any]]:
    """Subtasks with ended, admitted, failed, invalidated, withdrawn, speculative and live attempts."""
    plan = stage_plan(tmp_path / "store", dag_id=DAG, run_id=RUN, stage=STAGE, parallelism=8)
    layout = write_plan(plan)
    _attempt(layout, 0, 0, "FINISHED", manifest=True)
    _write(layout.admitted(0), {"attempt": 0})
    _attempt(layout, 1, 0, "FAILED")
    _attempt(layout, 1, 1, "FINISHED", reason="restart after failure", manifest=True)
    _write(layout.admitted(1), {"attempt": 1})
    _attempt(layout, 2, 0, "FINISHED", manifest=True)  # withdrawn: invalidated, its admission removed
    _write(layout.attempt_dir(2, 0) / "invalidated.json", {"reason": "rerun by test", "at": T0 + 9})
    _attempt(layout, 3, 0, "FINISHED", manifest=True)  # admitted, then its output lost: invalidated, still marked
    _write(layout.admitted(3), {"attempt": 0})
    _write(layout.attempt_dir(3, 0) / "invalidated.json", {"reason": "partition lost", "at": T0 + 9})
    _attempt(layout, 4, 0, "CANCELED")
    _attempt(layout, 4, 1, "FINISHED", reason="speculative copy", manifest=True)
    _write(layout.admitted(4), {"attempt": 1})
    _attempt(layout, 5, 0, None)  # launched, no end recorded: live while its heartbeat is fresh
    _attempt(layout, 6, 0, None, at=time.time())  # live now
    layout.journal.write_text("".join(json.dumps({"at": T0 + i, "event": e, "subtask": i}) + "\n"
                                      for i, e in enumerate(["launch", "admit", "block_node", "launch"])))
    _write(layout.summary, {"speculation": "on", "reused": [7]})
    _age(layout)
    return layout, plan


def _fresh(layout: StageLayout, plan: dict[str, Any], now: float, liveness: str = "heartbeat") -> dict[str, Any]:
    """The report read in full (no cached row), leaving the cache as it was not: cleared."""
    clear_cache()
    return stage_report(layout, plan, liveness=liveness, now=now)


@pytest.mark.parametrize("liveness", ["heartbeat", "process"])
def test_cached_polls_answer_exactly_what_a_full_read_answers(mixed: tuple[StageLayout, dict[str, Any]],
                                                              liveness: str) -> None:
    layout, plan = mixed
    now = time.time()
    full = _fresh(layout, plan, now, liveness)
    first = stage_report(layout, plan, liveness=liveness, now=now)
    second = stage_report(layout, plan, liveness=liveness, now=now)
    assert first == full and second == full
    assert len(readmodel._CACHE) > 0  # the second poll really came from the cache
    states = {s["subtask"]: [a["state"] for a in s["attempts"]] for s in second["subtasks"]}
    assert states[2] == ["CANCELED"] and states[3] == ["CANCELED"] and states[6][0] in ("RUNNING", "DEPLOYING")
    assert second["breakdown"] and second["subtasks"][7]["reused"] is True
    # A later clock changes the live attempts' answers only, and the cache does not freeze them.
    later = now + 3600
    assert stage_report(layout, plan, liveness=liveness, now=later) == _fresh(layout, plan, later, liveness)


def test_the_plugin_view_is_the_same_with_and_without_the_cache(mixed: tuple[StageLayout, dict[str, Any]]) -> None:
    layout, _ = mixed
    now = time.time()
    clear_cache()
    full = stage_view(layout.root, DAG, RUN, STAGE, now=now, offset=0, limit=5)
    stage_view(layout.root, DAG, RUN, STAGE, now=now, offset=0, limit=5)
    assert stage_view(layout.root, DAG, RUN, STAGE, now=now, offset=0, limit=5) == full
    by_subtask = {s["subtask"]: s for s in full["subtasks"]}
    assert by_subtask[1]["attempts"][1]["restart"] is True and by_subtask[4]["attempts"][1]["reason"] == \
        "speculative copy"


def test_an_ended_attempt_invalidated_between_two_polls_shows_at_once(
        mixed: tuple[StageLayout, dict[str, Any]]) -> None:
    layout, plan = mixed
    now = time.time()
    before = stage_report(layout, plan, liveness="heartbeat", now=now)
    stage_report(layout, plan, liveness="heartbeat", now=now)  # every ended row is cached now
    assert before["subtasks"][0]["admitted"] == 0
    heartbeat_observer(layout).invalidate(0, 0, "rerun by a user")
    # Even with the directories' mtimes put back (a change within one tick of the file system's clock),
    # their ctime moved: the cached rows are not trusted.
    os.utime(layout.attempt_dir(0, 0), ns=(OLD_NS, OLD_NS))
    os.utime(layout.subtask_dir(0), ns=(OLD_NS, OLD_NS))
    after = stage_report(layout, plan, liveness="heartbeat", now=now)
    assert after == _fresh(layout, plan, now)
    sub = after["subtasks"][0]
    assert sub["admitted"] is None and sub["attempts"][0]["state"] == "CANCELED"
    assert sub["attempts"][0]["cause"] == "invalidated: rerun by a user" and sub["attempts"][0]["admitted"] is False


def test_a_removed_manifest_a_new_attempt_and_a_replaced_admission_show_at_once(
        mixed: tuple[StageLayout, dict[str, Any]]) -> None:
    layout, plan = mixed
    now = time.time()
    stage_report(layout, plan, liveness="heartbeat", now=now)
    assert stage_report(layout, plan, liveness="heartbeat", now=now)["subtasks"][4]["attempts"][1]["phases"]
    remove_attempt_output(layout, 4, 1)  # a loser's output removed: its manifest timings are gone
    _attempt(layout, 0, 1, "FINISHED", reason="speculative copy", manifest=True)  # a new attempt
    _write(layout.admitted(1), {"attempt": 0, "replaces": 1})  # recovery re-admits another attempt
    after = stage_report(layout, plan, liveness="heartbeat", now=now)
    assert after == _fresh(layout, plan, now)
    assert after["subtasks"][4]["attempts"][1]["phases"]["spark"] is None
    assert [a["attempt"] for a in after["subtasks"][0]["attempts"]] == [0, 1]
    assert after["subtasks"][1]["admitted"] == 0


def test_a_directory_changed_within_the_racy_window_is_read_again(tmp_path: Path) -> None:
    plan = stage_plan(tmp_path / "store", dag_id=DAG, run_id=RUN, stage=STAGE, parallelism=1)
    layout = write_plan(plan)
    _attempt(layout, 0, 0, "FINISHED")  # just written: not aged
    now = time.time()
    stage_report(layout, plan, liveness="heartbeat", now=now)
    # Rewritten in place (no rename): the directory's stat does not move, so only not caching it shows this.
    layout.heartbeat(0, 0).write_text(json.dumps({"node": "n2", "at": T0 + 5}))
    (a,) = stage_report(layout, plan, liveness="heartbeat", now=now)["subtasks"][0]["attempts"]
    assert a["node"] == "n2"


def test_two_stores_with_the_same_names_never_share_rows(mixed: tuple[StageLayout, dict[str, Any]],
                                                         tmp_path: Path) -> None:
    layout, plan = mixed
    other_root = tmp_path / "other"
    shutil.copytree(layout.root, other_root)  # same names, same mtimes (copystat)
    other = StageLayout(other_root, DAG, RUN, STAGE)
    status = json.loads(other.status(0, 0).read_text())
    other.status(0, 0).write_text(json.dumps({**status, "exit_code": 42}))
    os.utime(other.attempt_dir(0, 0), ns=(OLD_NS, OLD_NS))
    now = time.time()
    stage_report(layout, plan, liveness="heartbeat", now=now)
    stage_report(layout, plan, liveness="heartbeat", now=now)
    other_plan = {**plan, "store_root": str(other_root)}
    assert stage_report(other, other_plan, liveness="heartbeat", now=now)["subtasks"][0]["attempts"][0][
        "exit_code"] == 42
    assert stage_report(layout, plan, liveness="heartbeat", now=now)["subtasks"][0]["attempts"][0]["exit_code"] == 0


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = readmodel._Cache(3)
    for i in range(3):
        cache.put((f"d{i}", "x"), (1, 2, 3), i, 0.0)
    assert cache.get(("d0", "x"), (1, 2, 3), 0.0) == 0  # d0 used: d1 is now the oldest
    cache.put(("d3", "x"), (1, 2, 3), 3, 0.0)
    assert len(cache) == 3 and cache.get(("d1", "x"), (1, 2, 3), 0.0) is None
    assert cache.get(("d0", "x"), (9, 9, 9), 0.0) is None  # another stat: dropped
    assert cache.get(("d2", "x"), (1, 2, 3), readmodel.MAX_AGE_SECONDS + 1) is None  # expired


def _big_ended_stage(root: Path, n: int) -> tuple[StageLayout, dict[str, Any]]:
    plan = stage_plan(root, dag_id=DAG, run_id=RUN, stage=STAGE, parallelism=n)
    layout = write_plan(plan)
    for subtask in range(n):
        base = layout.attempt_dir(subtask, 0)
        base.mkdir(parents=True)
        for name, obj in (("claim.json", {"created_at": T0, "target": "local-a", "reason": "initial attempt"}),
                          ("status.json", {"deploying_at": T0 + 1, "state": "FINISHED", "end_at": T0 + 6,
                                           "exit_code": 0, "pid": 1, "host": "h"}),
                          ("heartbeat.json", {"node": "n1", "at": T0 + 5}),
                          ("_SUCCESS", {"files": [], "timings": {"write_s": 1.0}})):
            (base / name).write_text(json.dumps(obj))
        (layout.subtask_dir(subtask) / "admitted.json").write_text('{"attempt": 0}')
    layout.journal.write_text("".join(json.dumps({"event": "admit", "subtask": i}) + "\n" for i in range(n)))
    _age(layout)
    return layout, plan


def test_a_second_poll_of_an_unchanged_ended_stage_reads_almost_no_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    n = 4096
    layout, plan = _big_ended_stage(tmp_path / "store", n)
    first = stage_report(layout, plan, liveness="heartbeat")
    view_now = time.time()
    first_view = stage_view(layout.root, DAG, RUN, STAGE, offset=0, limit=500, now=view_now)
    counts = {"open": 0, "listdir": 0, "stat": 0}

    def counting(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(os, "open", counting("open", os.open))
    monkeypatch.setattr(builtins, "open", counting("open", builtins.open))
    monkeypatch.setattr(os, "listdir", counting("listdir", os.listdir))
    monkeypatch.setattr(os, "scandir", counting("listdir", os.scandir))
    monkeypatch.setattr(os, "stat", counting("stat", os.stat))
    second = stage_report(layout, plan, liveness="heartbeat")
    assert second == first
    # A constant number of stage-level files (summary, committed, expired, journal), one listing of the stage
    # directory, and one stat per subtask directory and per attempt directory: no attempt file is opened.
    assert counts["open"] <= 10, counts
    assert counts["listdir"] <= 2, counts
    assert counts["stat"] <= 2 * n + 10, counts
    counts.update(open=0, listdir=0, stat=0)
    assert stage_view(layout.root, DAG, RUN, STAGE, offset=0, limit=500, now=view_now) == first_view
    assert counts["open"] <= 40 and counts["listdir"] <= 4, counts


def test_journal_records_reads_what_was_appended_and_starts_again_on_a_replaced_journal(tmp_path: Path) -> None:
    from airflow_provider_speculative.store import journal

    layout = StageLayout(tmp_path / "store", DAG, RUN, STAGE)
    assert readmodel.journal_records(layout) == []
    journal.record_stage(layout, "launch", at=T0, subtask=0)
    assert [r["event"] for r in readmodel.journal_records(layout)] == ["launch"]
    with open(layout.journal, "a") as handle:
        handle.write(json.dumps({"at": T0, "event": "admit"}))  # no newline yet: counted, as read_journal does
    assert [r["event"] for r in readmodel.journal_records(layout)] == ["launch", "admit"]
    with open(layout.journal, "a") as handle:
        handle.write("\n")
    journal.record_stage(layout, "stage_complete", at=T0)
    assert [r["event"] for r in readmodel.journal_records(layout)] == ["launch", "admit", "stage_complete"]
    _write(layout.journal, {"at": T0, "event": "plan_decided"})  # renamed over: another file
    with open(layout.journal, "a") as handle:
        handle.write("\n")
    assert [r["event"] for r in readmodel.journal_records(layout)] == ["plan_decided"]
    layout.journal.unlink()
    assert readmodel.journal_records(layout) == []
