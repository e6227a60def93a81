"""Partition life cycle: gc removes losers, expired results and deleted runs, never live attempts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.control import lifecycle as gc_module
from airflow_provider_speculative.control.lifecycle import (
    DELETED_RUN,
    EXPIRED,
    LOSER,
    SINK_EXPIRED,
    STALE_BARRIER,
    STALE_TEMP,
    execute_gc,
    plan_gc,
    read_expired,
    store_dag_ids,
)
from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.files import (
    atomic_write_json,
    create_exclusive_json,
    read_json,
    read_jsonl,
)
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
from airflow_provider_speculative.store.results import admitted_results, write_committed

DAG = "etl"
RUN = "manual__2026-01-01T00:00:00+00:00"
NOW = 1_800_000_000.0
HOUR = 3600.0


# -- building a store the way the backend, controller and finalize write it ------------------------


class Store:
    """Writes plans, claims, statuses, data, manifests, admissions and commits with the real store API."""

    def __init__(self, root: Path, dag_id: str = DAG, run_id: str = RUN) -> None:
        self.root, self.dag_id, self.run_id = root, dag_id, run_id

    def layout(self, stage: str) -> StageLayout:
        return StageLayout(self.root, self.dag_id, self.run_id, stage)

    def stage(self, stage: str, *, parallelism: int = 1, consumers: tuple[str, ...] = (),
              upstreams: tuple[str, ...] = (), sink: bool = False, retention: float | None = None) -> StageLayout:
        layout = self.layout(stage)
        layout.claim_run()  # as planning does
        config = SpeculativeConfig() if retention is None else SpeculativeConfig().with_overrides(
            {"retention": retention}, "test")
        atomic_write_json(layout.plan, {
            "stage": stage, "dag_id": self.dag_id, "run_id": self.run_id, "store_root": str(self.root),
            "parallelism": parallelism, "consumers": sorted(consumers), "upstreams": list(upstreams),
            "output": {"key": [], "max_parallelism": 8, "sink": {"class": "x.Sink", "args": {}} if sink else None},
            "subtasks": [{"inputs": {}, "input_bytes": 0} for _ in range(parallelism)],
            "config": config.to_json(), "fingerprint": f"fp-{stage}"})
        return layout

    def attempt(self, layout: StageLayout, subtask: int, attempt: int, state: str, *, data: int = 0,
                manifest: bool = False, live_phase: str = "RUNNING") -> None:
        """One attempt; ``state`` LIVE means running under this test process's pid, so poll() sees it alive."""
        assert create_exclusive_json(layout.claim(subtask, attempt), {
            "target": "local-a", "node": "local-a", "speculative": attempt > 0, "created_at": NOW - 2 * HOUR})
        status: dict[str, Any] = {"pid": os.getpid(), "pgid": os.getpgid(0), "deploying_at": NOW - 2 * HOUR,
                                  "create_time": psutil.Process().create_time(), "node": "local-a"}
        if state == "LIVE":
            status["state"] = "DEPLOYING"
            atomic_write_json(layout.heartbeat(subtask, attempt), {"node": "local-a", "phase": live_phase})
        else:
            status.update(state=state, end_at=NOW - HOUR, exit_code=0 if state == "FINISHED" else 1,
                          cause=None if state == "FINISHED" else f"{state.lower()} in test")
        atomic_write_json(layout.status(subtask, attempt), status)
        if data:
            part = layout.data(subtask, attempt) / "_sp=0" / "part-00000.parquet"
            part.parent.mkdir(parents=True)
            part.write_bytes(b"x" * data)
        if manifest:
            write_manifest(layout.manifest(subtask, attempt), build_manifest(
                layout.data(subtask, attempt), stage=layout.stage, subtask=subtask, attempt=attempt, records=1))

    def admit(self, layout: StageLayout, subtask: int, attempt: int) -> None:
        assert create_exclusive_json(layout.admitted(subtask), {"attempt": attempt, "at": NOW - HOUR})

    def commit(self, layout: StageLayout, admitted: dict[int, int], at: float) -> None:
        record = admitted_results(layout, admitted)
        record.update(fingerprint=f"fp-{layout.stage}", committed_at=at, sink=None, summary={})
        write_committed(layout, record)

    def finished_stage(self, stage: str, *, committed_at: float, data: int = 1000, **kwargs: Any) -> StageLayout:
        """A committed stage: subtask 0 admitted attempt 0 with data and manifest."""
        layout = self.stage(stage, **kwargs)
        self.attempt(layout, 0, 0, "FINISHED", data=data, manifest=True)
        self.admit(layout, 0, 0)
        self.commit(layout, {0: 0}, committed_at)
        return layout


def tree(root: Path) -> dict[str, int]:
    """Every file under ``root`` with its size (but store.json and the root's marker, which the CLI tests write)."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and p not in (root / "store.json", root / "_owner.json")}


def paths(items: list[Any]) -> set[Path]:
    return {i.path for i in items}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


# -- losers -----------------------------------------------------------------------------------------


def test_losers_output_is_removed_and_history_kept(store: Store) -> None:
    layout = store.stage("extract", parallelism=2, consumers=("load",))
    store.attempt(layout, 0, 0, "FINISHED", data=1000, manifest=True)
    store.admit(layout, 0, 0)
    store.attempt(layout, 0, 1, "CANCELED", data=300)  # cancelled speculative copy, partial output
    store.attempt(layout, 1, 0, "FAILED", data=200)  # failed, partial output
    store.attempt(layout, 1, 1, "FINISHED", data=500, manifest=True)
    store.admit(layout, 1, 1)
    store.attempt(layout, 1, 2, "FINISHED", data=700, manifest=True)  # finished after 1 won; output left
    # Until the stage commits, a finished attempt may still matter; finalize then passes it over for good.
    assert {i.attempt for i in plan_gc(store.root, now=NOW) if i.subtask == 1} == {0}
    store.commit(layout, {0: 0, 1: 1}, NOW - HOUR / 2)

    items = plan_gc(store.root, now=NOW)

    assert {(i.subtask, i.attempt, i.path.name) for i in items} == {
        (0, 1, "data"), (1, 0, "data"), (1, 2, "_SUCCESS"), (1, 2, "data")}
    assert {i.reason for i in items} == {LOSER}
    by_path = {(i.subtask, i.attempt, i.path.name): i for i in items}
    assert by_path[(0, 1, "data")].bytes == 300
    assert "CANCELED" in by_path[(0, 1, "data")].detail
    assert "attempt 1 was committed" in by_path[(1, 2, "data")].detail
    # The manifest goes before its data: it must never describe data that is gone.
    order = [i.path for i in items]
    assert order.index(layout.manifest(1, 2)) < order.index(layout.data(1, 2))

    summary = execute_gc(items, now=NOW)

    assert summary["removed"] == 4 and summary["errors"] == []
    assert summary["bytes"] == 300 + 200 + 700 + by_path[(1, 2, "_SUCCESS")].bytes
    for subtask, attempt in ((0, 1), (1, 0), (1, 2)):
        assert not layout.data(subtask, attempt).exists()
        assert not layout.manifest(subtask, attempt).exists()
        assert layout.claim(subtask, attempt).exists() and layout.status(subtask, attempt).exists()
    for subtask, attempt in ((0, 0), (1, 1)):  # admitted: untouched
        assert layout.manifest(subtask, attempt).exists() and layout.data(subtask, attempt).is_dir()
    gc_events = [e for e in read_jsonl(layout.journal) if e["event"] == "gc"]
    assert len(gc_events) == 1
    assert gc_events[0]["bytes"] == summary["bytes"]
    assert sorted(r["path"] for r in gc_events[0]["removed"]) == [
        "subtask=0/attempt=1/data", "subtask=1/attempt=0/data", "subtask=1/attempt=2/_SUCCESS",
        "subtask=1/attempt=2/data"]
    assert plan_gc(store.root, now=NOW) == []  # nothing left to do: gc is idempotent


def test_finished_attempt_not_yet_admitted_is_kept(store: Store) -> None:
    # The controller may not have polled it yet: it can still become the admitted attempt.
    layout = store.stage("extract")
    store.attempt(layout, 0, 0, "FINISHED", data=100, manifest=True)
    store.attempt(layout, 0, 1, "FAILED", data=50)
    assert paths(plan_gc(store.root, now=NOW)) == {layout.data(0, 1)}


def test_recovery_attempt_finished_after_the_commit_is_kept(store: Store) -> None:
    # A partition recovery re-produces a lost result after the commit; until it re-admits its
    # attempt, the old admission still stands, and the new output must survive gc.
    layout = store.finished_stage("extract", committed_at=NOW - 2 * HOUR)
    store.attempt(layout, 0, 1, "FINISHED", data=100, manifest=True)  # ended NOW - HOUR, after the commit
    assert plan_gc(store.root, now=NOW) == []


# -- live attempts ----------------------------------------------------------------------------------


def test_live_attempts_are_never_touched(store: Store) -> None:
    layout = store.stage("extract", parallelism=2, consumers=("load",))
    store.attempt(layout, 0, 0, "FINISHED", data=100, manifest=True)
    store.admit(layout, 0, 0)
    store.attempt(layout, 0, 1, "LIVE", data=40)  # speculative copy still running after the admission
    store.attempt(layout, 1, 0, "LIVE", data=40)
    atomic_write_json(layout.attempt_dir(1, 0) / "cancel.json", {"reason": "test", "at": NOW})  # CANCELING
    (layout.dir / "barrier.release.1").touch()
    backend = attempt_observer(layout)
    assert backend.poll(0, 1, NOW).state == AttemptState.RUNNING
    assert backend.poll(1, 0, NOW).state == AttemptState.CANCELING

    assert plan_gc(store.root, now=NOW) == []
    # Not even when the run is gone from Airflow: a live attempt still writes there.
    assert plan_gc(store.root, now=NOW, run_states={}) == []


def test_live_consumer_keeps_its_input(store: Store) -> None:
    extract = store.finished_stage("extract", committed_at=NOW - 10 * HOUR, consumers=("load",))
    load = store.finished_stage("load", committed_at=NOW - 5 * HOUR, upstreams=("extract",))
    store.attempt(load, 0, 1, "LIVE")  # e.g. a cleared consumer reading the result again
    items = plan_gc(store.root, now=NOW, run_states={(DAG, RUN): "success"}, retention=0)
    assert extract.data(0, 0) not in paths(items)


# -- intermediate results ---------------------------------------------------------------------------


def test_intermediate_result_lives_until_run_success_consumers_committed_and_retention(store: Store) -> None:
    extract = store.finished_stage("extract", committed_at=NOW - 10 * HOUR, data=1000, consumers=("load",))
    load = store.stage("load", upstreams=("extract",))
    store.attempt(load, 0, 0, "FINISHED", data=10, manifest=True)
    store.admit(load, 0, 0)
    success = {(DAG, RUN): "success"}

    # Consumer admitted but not committed: the result is still needed.
    assert plan_gc(store.root, now=NOW, run_states=success, retention=0) == []
    store.commit(load, {0: 0}, NOW - 2 * HOUR)
    # Run not (yet) successful: results stay for a retry or a clear.
    for state in ("running", "failed", "queued"):
        assert plan_gc(store.root, now=NOW, run_states={(DAG, RUN): state}, retention=0) == []
    # Retention counts from the newest consumer commit (2 h ago), not the producer's (10 h ago).
    assert plan_gc(store.root, now=NOW, run_states=success, retention=3 * HOUR) == []

    items = plan_gc(store.root, now=NOW, run_states=success, retention=HOUR)

    assert paths(items) == {extract.manifest(0, 0), extract.data(0, 0)}
    assert {i.reason for i in items} == {EXPIRED}
    assert sum(i.bytes for i in items if i.path.name == "data") == 1000
    execute_gc(items, now=NOW)
    assert not extract.data(0, 0).exists() and not extract.manifest(0, 0).exists()
    assert extract.committed.exists()  # the record stays: a consumer rerun sees a missing partition
    marker = read_expired(extract)
    assert marker is not None and marker["attempts"] == {"0": 0} and marker["reason"] == EXPIRED
    assert read_json(extract.dir / "expired.json")["committed_at"] == NOW - 10 * HOUR
    assert [e["event"] for e in read_jsonl(extract.journal)][-1] == "gc"
    report = run_report(store.root, DAG, RUN)
    assert {s["stage"]: bool(s["expired"]) for s in report["stages"]} == {"extract": True, "load": False}


def test_stage_retention_from_its_plan_applies_without_override(store: Store) -> None:
    extract = store.finished_stage("extract", committed_at=NOW - 10 * HOUR, consumers=("load",), retention=1800)
    store.finished_stage("load", committed_at=NOW - HOUR, upstreams=("extract",))
    success = {(DAG, RUN): "success"}
    assert paths(plan_gc(store.root, now=NOW, run_states=success)) == {extract.manifest(0, 0), extract.data(0, 0)}
    assert plan_gc(store.root, now=NOW - 0.75 * HOUR, run_states=success) == []


def test_sink_stage_data_expires_but_a_final_stage_without_sink_is_kept(store: Store, tmp_path: Path) -> None:
    written = store.finished_stage("write", committed_at=NOW - 2 * HOUR, data=800, sink=True)
    report = store.finished_stage("report", committed_at=NOW - 2 * HOUR, data=800)
    # The sink's final output hard-links the admitted file: removing the store copy frees nothing of it.
    final = tmp_path / "final.parquet"
    os.link(written.data(0, 0) / "_sp=0" / "part-00000.parquet", final)

    assert plan_gc(store.root, now=NOW, run_states={(DAG, RUN): "success"}, retention=3 * HOUR) == []
    items = plan_gc(store.root, now=NOW, run_states={(DAG, RUN): "success"}, retention=HOUR)

    assert paths(items) == {written.manifest(0, 0), written.data(0, 0)}
    assert {i.reason for i in items} == {SINK_EXPIRED}
    assert next(i for i in items if i.path.name == "data").bytes == 0
    execute_gc(items, now=NOW)
    assert final.read_bytes() == b"x" * 800
    assert read_expired(written) is not None and read_expired(report) is None
    assert report.data(0, 0).is_dir()


def test_expiry_marker_is_ignored_once_the_stage_commits_again(store: Store) -> None:
    extract = store.finished_stage("extract", committed_at=NOW - 10 * HOUR, consumers=("load",))
    store.finished_stage("load", committed_at=NOW - 5 * HOUR, upstreams=("extract",))
    execute_gc(plan_gc(store.root, now=NOW, run_states={(DAG, RUN): "success"}, retention=0), now=NOW)
    assert read_expired(extract) is not None
    store.attempt(extract, 0, 1, "FINISHED", data=10, manifest=True)
    # A partition recovery re-commits the subtask with a new attempt (committed_at unchanged) ...
    record = read_json(extract.committed)
    record["subtasks"]["0"] = admitted_results(extract, {0: 1})["subtasks"]["0"]
    write_committed(extract, record)
    assert read_expired(extract) is None
    # ... and a rerun of the whole stage commits a fresh result.
    record = admitted_results(extract, {0: 1})
    record.update(committed_at=NOW + 1)
    write_committed(extract, record)
    assert read_expired(extract) is None


# -- deleted runs, stale files ----------------------------------------------------------------------


def test_deleted_runs_are_removed_whole(tmp_path: Path) -> None:
    root = tmp_path / "store"
    kept, gone = Store(root, run_id="scheduled__1"), Store(root, run_id="manual__2026-02-02T00:00:00+00:00")
    kept.finished_stage("extract", committed_at=NOW - HOUR)
    gone_layout = gone.finished_stage("extract", committed_at=NOW - HOUR, data=5000)
    gone.attempt(gone_layout, 0, 1, "FAILED", data=100)
    assert store_dag_ids(root) == {DAG: DAG}

    # Without run states nothing counts as deleted; only the failed attempt's output goes.
    assert [(i.path, i.reason) for i in plan_gc(root, now=NOW)] == [(gone_layout.data(0, 1), LOSER)]
    states = {(DAG, "scheduled__1"): "running"}
    # Missing from the DB is not enough: a fresh or foreign database has no runs at all.
    notes: list[str] = []
    assert [(i.path, i.reason) for i in plan_gc(root, now=NOW, run_states=states, kept=notes)] == [
        (gone_layout.data(0, 1), LOSER)]
    assert any("its deletion is not recorded" in n for n in notes)
    items = plan_gc(root, now=NOW, run_states=states, deleted_runs={(DAG, gone.run_id)})

    assert [(i.path, i.reason) for i in items] == [(gone_layout.run_dir, DELETED_RUN)]
    assert "audit log records the deletion of the DAG run" in items[0].detail
    assert items[0].bytes >= 5100
    execute_gc(items, now=NOW)
    assert not gone_layout.run_dir.exists()
    assert kept.layout("extract").data(0, 0).is_dir()

    execute_gc(plan_gc(root, now=NOW, run_states={}, deleted_dags={DAG}), now=NOW)
    assert not (root / DAG).exists()  # the DAG's directory goes with its last run


def test_dag_id_restricts_gc_to_one_dag(tmp_path: Path) -> None:
    root = tmp_path / "store"
    mine = Store(root, dag_id="a").finished_stage("s", committed_at=NOW)
    other = Store(root, dag_id="b").finished_stage("s", committed_at=NOW)
    items = plan_gc(root, now=NOW, run_states={}, dag_id="a", deleted_dags={"a", "b"})
    assert [(i.path, i.reason) for i in items] == [(mine.run_dir, DELETED_RUN)]
    execute_gc(items, now=NOW)
    assert other.run_dir.exists()


def test_stale_temp_files_and_barriers_go_fresh_ones_stay(store: Store) -> None:
    layout = store.finished_stage("extract", committed_at=NOW)
    old_tmp = layout.dir / ".committed.json.abc123.tmp"
    fresh_tmp = layout.attempt_dir(0, 0) / ".status.json.def456.tmp"
    run_tmp = layout.run_dir / ".blocklist.json.0000.tmp"
    for path in (old_tmp, fresh_tmp, run_tmp):
        path.write_text("{")
    for path in (old_tmp, run_tmp):
        os.utime(path, (NOW - 2 * HOUR, NOW - 2 * HOUR))
    os.utime(fresh_tmp, (NOW - 60, NOW - 60))
    barrier = layout.dir / "barrier.release.0"
    barrier.touch()

    items = plan_gc(store.root, now=NOW)

    assert {(i.path, i.reason) for i in items} == {
        (old_tmp, STALE_TEMP), (run_tmp, STALE_TEMP), (barrier, STALE_BARRIER)}
    execute_gc(items, now=NOW)
    assert fresh_tmp.exists() and not old_tmp.exists() and not barrier.exists()


# -- CLI --------------------------------------------------------------------------------------------


DB_URL = "postgresql://airflow:secret@127.0.0.1:5432/airflow"


def run_cli(monkeypatch: pytest.MonkeyPatch, root: Path, run_states: dict[tuple[str, str], str],
            capsys: pytest.CaptureFixture[str], *, db_url: str = DB_URL, claim_as: str | None = DB_URL,
            facts: dict[str, Any] | None = None, **args: Any) -> str:
    from airflow_provider_speculative import settings
    from airflow_provider_speculative.cli import commands
    from airflow_provider_speculative.store.identity import claim_store, db_identity

    monkeypatch.setattr(settings, "store_root", lambda config: root)
    monkeypatch.setattr(settings, "airflow_config", SpeculativeConfig)
    monkeypatch.setattr(settings, "metadata_db_identity", lambda: db_identity(db_url))
    if claim_as is not None and root.is_dir():
        claim_store(root, db_identity(claim_as))
    asked: list[list[str]] = []
    known = {"run_states": run_states, "known_dags": {DAG}, **(facts or {})}
    monkeypatch.setattr(commands, "_db_facts", lambda dag_ids: asked.append(dag_ids) or commands.DbFacts(**known))
    defaults = {"dag_id": None, "dry_run": False, "retention": None, "output": "table", "older_than": None,
                "claim": False}
    commands.gc(SimpleNamespace(**{**defaults, **args}))
    assert asked == [[DAG]]  # run states are read for the DAGs found in the store
    return capsys.readouterr().out


def test_cli_dry_run_lists_paths_and_bytes_and_removes_nothing(
        store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    layout = store.stage("extract")
    store.attempt(layout, 0, 0, "FINISHED", data=1000, manifest=True)
    store.admit(layout, 0, 0)
    store.attempt(layout, 0, 1, "FAILED", data=2048)
    before = tree(store.root)

    out = run_cli(monkeypatch, store.root, {(DAG, RUN): "running"}, capsys, dry_run=True)

    assert tree(store.root) == before
    assert "subtask=0/attempt=1/data" in out and "2048" in out
    assert "dry run: would remove 1 paths, 2.0 KiB (2048 bytes)" in out

    out = run_cli(monkeypatch, store.root, {(DAG, RUN): "running"}, capsys, output="json")
    assert '"removed": 1' in out
    assert not layout.data(0, 1).exists() and layout.data(0, 0).is_dir()


def test_cli_retention_override_and_status_shows_expiry(
        store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_speculative.cli.commands import report_lines

    now = time.time()
    extract = store.finished_stage("extract", committed_at=now - 3 * HOUR, consumers=("load",))
    store.finished_stage("load", committed_at=now - 2 * HOUR, upstreams=("extract",))
    success = {(DAG, RUN): "success"}

    out = run_cli(monkeypatch, store.root, success, capsys, retention="1h")

    assert "expired" in out and not extract.data(0, 0).exists()
    assert "results expired" in "\n".join(report_lines(run_report(store.root, DAG, RUN)))
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, store.root, success, capsys, retention="soon")


def test_gc_module_has_no_airflow_import() -> None:
    source = Path(gc_module.__file__).read_text()
    assert "import airflow\n" not in source and "from airflow " not in source and "from airflow." not in source


# -- gc refuses to guess ----------------------------------------------------------------------------


def test_cli_against_another_metadata_database_deletes_nothing_and_says_why(
        store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    layout = store.finished_stage("extract", committed_at=NOW - HOUR)
    store.attempt(layout, 0, 1, "FAILED", data=100)
    before = tree(store.root)
    for claim_as, db_url, why in (
            (None, DB_URL, "has no store.json naming its metadata database"),
            (DB_URL, "sqlite:////tmp/fresh/airflow.db", "belongs to metadata database 'postgresql://airflow@")):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(monkeypatch, store.root, {}, capsys, claim_as=claim_as, db_url=db_url)
        err = capsys.readouterr().err
        assert exit_info.value.code == 1 and err.count("\n") == 1, err
        assert "gc deletes nothing" in err and why in err
        assert "secret" not in err  # the password never leaves the URL
        assert tree(store.root) == before
        assert (store.root / "store.json").exists() == (claim_as is not None)
    # --claim records this database only for a store that has none: the foreign record stays.
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, store.root, {}, capsys, claim_as=None, db_url="sqlite:////x.db", claim=True)
    (store.root / "store.json").unlink()
    out = run_cli(monkeypatch, store.root, {(DAG, RUN): "running"}, capsys, claim_as=None, claim=True)
    assert "removed 1 paths" in out and not layout.data(0, 1).exists()


def test_runs_missing_from_the_db_are_kept_unless_deleted_or_older_than(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    gone = Store(root, run_id="manual__1").finished_stage("extract", committed_at=NOW - HOUR)
    out = run_cli(monkeypatch, root, {}, capsys)
    assert gone.run_dir.exists()
    assert "kept: run etl/manual__1: not in the metadata database, but its deletion is not recorded" in out
    # Not old enough: its files were just written.
    run_cli(monkeypatch, root, {}, capsys, older_than="1h")
    assert gone.run_dir.exists()
    out = run_cli(monkeypatch, root, {}, capsys, older_than="0s")
    assert not gone.run_dir.exists() and "--older-than 0s" in out


def test_unknown_dag_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    layout = Store(root).finished_stage("extract", committed_at=NOW - HOUR)
    Store(root).attempt(layout, 0, 1, "FAILED", data=100)
    before = tree(root)
    out = run_cli(monkeypatch, root, {}, capsys, facts={"known_dags": set()})
    assert tree(root) == before
    assert "kept: DAG etl: unknown to this metadata database and its deletion is not recorded" in out
    out = run_cli(monkeypatch, root, {}, capsys, facts={"known_dags": set(), "deleted_dags": {DAG}})
    assert not layout.run_dir.exists()


def test_sink_staging_of_a_finished_stage_run_is_removed_by_the_sink(tmp_path: Path) -> None:
    from airflow_provider_speculative.control.lifecycle import SINK_STAGING, list_sink_staging
    from airflow_provider_speculative.sinks.parquet import ParquetSink, _run_key

    root = tmp_path / "store"
    store = Store(root)
    layout = store.finished_stage("write", committed_at=NOW - HOUR)
    final = tmp_path / "out" / "ds=1"
    plan = json.loads(layout.plan.read_text())
    plan["output"]["sink"] = ParquetSink(str(final)).to_json()
    atomic_write_json(layout.plan, plan)
    final.parent.mkdir(parents=True)
    orphan = final.parent / f".{final.name}.staging-{_run_key(DAG, RUN, 'write', final)}-0badf00d"
    orphan.mkdir()
    (orphan / "part-00000-000.parquet").write_bytes(b"x" * 64)
    users = final.parent / f".{final.name}.staging-mine"
    users.mkdir()

    # The run is still running and the stage not committed: staging may still be needed.
    (layout.committed).unlink()
    assert [i for i in plan_gc(root, now=NOW, run_states={(DAG, RUN): "running"},
                               sink_staging=list_sink_staging) if i.reason == SINK_STAGING] == []
    items = [i for i in plan_gc(root, now=NOW, run_states={(DAG, RUN): "failed"}, sink_staging=list_sink_staging)
             if i.reason == SINK_STAGING]
    assert [(i.path, i.bytes) for i in items] == [(str(orphan), 64)]
    summary = execute_gc(items, now=NOW)
    assert summary["by_reason"][SINK_STAGING]["removed"] == 1 and not summary["errors"]
    assert not orphan.exists() and users.is_dir()


def test_gc_never_deletes_through_a_symlinked_directory(store: Store, tmp_path: Path) -> None:
    """A stage application links its subtask directory to someone else's data: gc refuses, deletes nothing there."""
    extract = store.finished_stage("extract", committed_at=NOW - 10 * HOUR, data=1000, consumers=("load",))
    load = store.finished_stage("load", committed_at=NOW - 5 * HOUR, upstreams=("extract",))
    assert load is not None
    foreign = tmp_path / "someone-elses" / "subtask=0"
    real = extract.attempt_dir(0, 0).parent
    foreign.parent.mkdir()
    real.rename(foreign)  # the same files, now outside the store, reached through a link in it
    real.symlink_to(foreign, target_is_directory=True)
    items = plan_gc(store.root, now=NOW, run_states={(DAG, RUN): "success"}, retention=HOUR)
    assert extract.data(0, 0) in paths(items)  # planned by path, as before
    summary = execute_gc(items, now=NOW, root=store.root)
    assert (foreign / "attempt=0" / "data").is_dir() and any((foreign / "attempt=0" / "data").iterdir())
    assert [e["error"] for e in summary["errors"]] and all("symbolic link" in e["error"] for e in summary["errors"])


# -- ownership ----------------------------------------------------------------------------------------


def test_gc_deletes_only_in_runs_this_store_owns_and_reports_the_others(tmp_path: Path) -> None:
    root = tmp_path / "store"
    owned, older, foreign = (Store(root, run_id=r) for r in ("scheduled__1", "scheduled__2", "scheduled__3"))
    layouts = {}
    for run in (owned, older, foreign):
        layout = run.finished_stage("extract", committed_at=NOW - HOUR)
        run.attempt(layout, 0, 1, "FAILED", data=100)  # a loser's output in every run
        layouts[run.run_id] = layout
    # A run an older version wrote carries no marker; another store (nested by mistake) marks its own.
    (layouts["scheduled__2"].run_dir / "_owner.json").unlink()
    (layouts["scheduled__3"].run_dir / "_owner.json").unlink()
    PosixBackend(root, owner="another store").claim(layouts["scheduled__3"].run_prefix)
    before = tree(root)
    notes: list[str] = []

    items = plan_gc(root, now=NOW, run_states={}, deleted_dags={DAG}, kept=notes)

    assert [(i.path, i.reason) for i in items] == [(layouts["scheduled__1"].run_dir, DELETED_RUN)]
    for run_id in ("scheduled__2", "scheduled__3"):
        assert any(n.startswith(f"run {DAG}/{run_id}: skipped, no _owner.json of this store") for n in notes), notes
    summary = execute_gc(items, now=NOW)
    assert summary["errors"] == [] and summary["removed"] == 1
    assert not layouts["scheduled__1"].run_dir.exists()
    assert tree(root) == {k: v for k, v in before.items() if not k.startswith(f"{DAG}/scheduled__1/")}


def test_gc_refuses_a_planned_removal_once_the_run_is_not_provably_its_own(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    layout = store.finished_stage("extract", committed_at=NOW - HOUR)
    store.attempt(layout, 0, 1, "FAILED", data=100)
    items = plan_gc(store.root, now=NOW)
    assert [(i.path, i.reason) for i in items] == [(layout.data(0, 1), LOSER)]
    (layout.run_dir / "_owner.json").unlink()  # between planning and execution (a --dry-run's list reused)

    summary = execute_gc(items, now=NOW)

    assert summary["removed"] == 0 and layout.data(0, 1).is_dir()
    assert len(summary["errors"]) == 1 and "refused (not removed)" in summary["errors"][0]["error"]


# -- pool warm-ups ----------------------------------------------------------------------------------


def test_gc_removes_a_pool_warm_ups_prefix_only_when_it_is_this_stores_and_an_hour_old(tmp_path: Path) -> None:
    from airflow_provider_speculative.control.lifecycle import STALE_WARM_UP, STALE_WARM_UP_AFTER

    root = tmp_path / "store"
    store = PosixBackend(root)
    store.claim()
    stale, fresh, foreign, unmarked = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)
    for name in (stale, fresh, foreign, unmarked):
        store.replace(f"_warm-up/{name}/r0/a/part-0.parquet", b"x" * 10)
    store.replace("_warm-up/theirs/data.bin", b"not the provider's")
    store.claim(f"_warm-up/{stale}")
    claimed = store.claimed_at(f"_warm-up/{stale}")
    assert claimed is not None and abs(claimed - time.time()) < 60
    now = claimed + STALE_WARM_UP_AFTER + 1
    # The fresh one was claimed just now by the warm-up's clock: an hour before `now` has not passed.
    (root / "_warm-up" / fresh / "_owner.json").write_text(json.dumps(
        {"owner": store.owner, "prefix": f"_warm-up/{fresh}", "token": "t", "at": now - 60}))
    PosixBackend(root, owner="another store").claim(f"_warm-up/{foreign}")
    notes: list[str] = []

    items = plan_gc(root, now=now, kept=notes)

    assert [(i.name, i.reason, i.bytes) for i in items] == [(f"_warm-up/{stale}", STALE_WARM_UP, 10 + len(
        (root / "_warm-up" / stale / "_owner.json").read_bytes()))]
    assert any(n.startswith(f"_warm-up/{fresh}: a pool warm-up's, claimed 60 s ago") for n in notes), notes
    skipped = next(n for n in notes if n.startswith("skipped _warm-up/"))
    assert all(name in skipped for name in (foreign, unmarked, "theirs")) and fresh not in skipped, skipped
    # A run of one DAG (--dag-id) leaves the warm-ups alone.
    assert plan_gc(root, now=now, dag_id=DAG) == []

    summary = execute_gc(items, now=now)

    assert summary["errors"] == [] and summary["removed"] == 1
    assert sorted(p.name for p in (root / "_warm-up").iterdir()) == sorted([fresh, foreign, unmarked, "theirs"])
    assert (root / "_warm-up" / "theirs" / "data.bin").read_bytes() == b"not the provider's"


def test_claimed_at_is_the_markers_time_and_only_for_this_stores_own_marker(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path / "store")
    store.claim()
    assert store.claimed_at("x") is None  # no marker of its own: the root's does not count
    store.claim("x")
    assert isinstance(store.claimed_at("x"), float)
    PosixBackend(tmp_path / "store", owner="another store").claim("y")
    assert store.claimed_at("y") is None
    (tmp_path / "store" / "z").mkdir()
    (tmp_path / "store" / "z" / "_owner.json").write_text(json.dumps({"owner": store.owner, "prefix": "z",
                                                                      "at": True}))
    assert store.claimed_at("z") is None  # ours, but no time in it
