"""gc walks the store by name through a StoreBackend: it runs on a store that has no paths at all."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control import lifecycle
from airflow_provider_speculative.control.lifecycle import (
    DELETED_RUN,
    EXPIRED,
    LOSER,
    execute_gc,
    plan_gc,
    store_dag_ids,
)
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store import files
from airflow_provider_speculative.store.backend import OWNER_FILE, ObjectInfo, PosixBackend, StoreBackend
from airflow_provider_speculative.store.layout import StageLayout
from tests.unit.control.test_lifecycle import DAG, HOUR, NOW, RUN, Store
from tests.unit.store.memory import MemoryBackend


class GcMemoryBackend(MemoryBackend):
    """test_slots' store double, grown for gc: the root prefix, modification times, journals, prefix deletes.

    Every primitive call is counted, so a test can see what a walk costs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mtimes: dict[str, float] = {}
        self.now = NOW - 2 * HOUR
        self.calls: Counter[str] = Counter()

    def _create_exclusive(self, name: str, data: bytes) -> bool:
        self.calls["create"] += 1
        created = super()._create_exclusive(name, data)
        if created:
            self.mtimes[name] = self.now
        return created

    def _replace(self, name: str, data: bytes) -> None:
        self.calls["replace"] += 1
        super()._replace(name, data)
        self.mtimes[name] = self.now

    def _read(self, name: str) -> bytes | None:
        self.calls["read"] += 1
        return super()._read(name)

    def _stat(self, name: str) -> ObjectInfo | None:
        self.calls["stat"] += 1
        data = self.objects.get(name)
        return None if data is None else ObjectInfo(name, len(data), self.mtimes.get(name, 0.0))

    def _stat_all(self, prefix: str) -> list[ObjectInfo]:
        # This double's modification times, from one listing as on S3.
        return [info for name in self._list(prefix) if (info := self._stat(name)) is not None]

    def _names(self, prefix: str) -> list[str]:
        start = f"{prefix}/" if prefix else ""  # the root prefix "" lists everything
        return sorted(n for n in self.objects if n.startswith(start))

    def _list(self, prefix: str) -> list[str]:
        self.calls["list"] += 1
        return self._names(prefix)

    def _children(self, prefix: str) -> list[str]:
        self.calls["children"] += 1
        out = set()
        for name in self._names(prefix):
            head, sep, _ = name[len(prefix) + 1 if prefix else 0:].partition("/")
            out.add(head + ("/" if sep else ""))
        return sorted(out)

    def _append(self, journal: str, record: dict[str, Any]) -> None:
        with self.lock:
            self.objects[journal] = self.objects.get(journal, b"") + files.json_line(record)
            self.mtimes[journal] = self.now

    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        data = self.objects.get(journal, b"")
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]

    def _read_marker(self, prefix: str) -> Any:
        data = self.objects.get(f"{prefix}/{OWNER_FILE}" if prefix else OWNER_FILE)
        return None if data is None else json.loads(data)

    def _delete(self, name: str) -> bool:
        self.calls["delete"] += 1
        return super()._delete(name)

    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        self.calls["delete_tree"] += 1
        with self.lock:
            return sum(self.objects.pop(n, None) is not None for n in names)


class MemoryStore:
    """Writes a DAG run into a store backend by name, as planning, the backend, the runtime and finalize do."""

    def __init__(self, store: StoreBackend, dag_id: str = DAG, run_id: str = RUN) -> None:
        self.store, self.dag_id, self.run_id = store, dag_id, run_id
        self.run = self.layout("any").run_prefix

    def layout(self, stage: str) -> StageLayout:
        # Only for the names (arithmetic on the root): nothing is read or written through its paths.
        return StageLayout(Path("/nowhere"), self.dag_id, self.run_id, stage)

    def name(self, layout: StageLayout, path: Path) -> str:
        return layout.name(path)

    def stage(self, stage: str, *, parallelism: int = 1, consumers: tuple[str, ...] = ()) -> StageLayout:
        layout = self.layout(stage)
        self.store.claim(self.name(layout, layout.run_dir))
        self.store.replace_json(self.name(layout, layout.plan), {
            "stage": stage, "dag_id": self.dag_id, "run_id": self.run_id, "parallelism": parallelism,
            "consumers": sorted(consumers), "output": {"key": [], "sink": None}, "config": {}})
        return layout

    def attempt(self, layout: StageLayout, subtask: int, attempt: int, state: str, *, data: int = 0,
                manifest: bool = False) -> None:
        self.store.create_exclusive_json(self.name(layout, layout.claim(subtask, attempt)), {"target": "t"})
        self.store.replace_json(self.name(layout, layout.status(subtask, attempt)),
                                {"state": state, "end_at": NOW - HOUR})
        if data:
            self.store.replace(self.name(layout, layout.data(subtask, attempt) / "_sp=0" / "part-0.parquet"),
                               b"x" * data)
            self.store.replace(self.name(layout, layout.data(subtask, attempt) / "_sp=1" / "part-0.parquet"),
                               b"y" * (data // 2))
        if manifest:
            self.store.replace_json(self.name(layout, layout.manifest(subtask, attempt)), {"files": []})

    def admit(self, layout: StageLayout, subtask: int, attempt: int) -> None:
        self.store.create_exclusive_json(self.name(layout, layout.admitted(subtask)), {"attempt": attempt})

    def commit(self, layout: StageLayout, admitted: dict[int, int], at: float) -> None:
        self.store.replace_json(self.name(layout, layout.committed), {
            "committed_at": at, "fingerprint": "fp",
            "subtasks": {str(s): {"attempt": a} for s, a in admitted.items()}})


class StoreObserver:
    """The attempt observer, reading attempt records by name from the store (the real one reads paths)."""

    def __init__(self, store: StoreBackend, layout: StageLayout) -> None:
        self.store, self.layout = store, layout

    def poll(self, subtask: int, attempt: int, now: float | None = None) -> Attempt:
        status = self.store.read_json(self.layout.name(self.layout.status(subtask, attempt))) or {}
        return Attempt(subtask, attempt, "t", AttemptState(status.get("state", "CREATED")), end_at=status.get("end_at"))


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[GcMemoryBackend]:
    store = GcMemoryBackend()
    monkeypatch.setattr(lifecycle, "attempt_observer", lambda layout: StoreObserver(store, layout))
    yield store


def no_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every file-system call gc could make by path fail: the walk must go through the backend alone."""
    def refuse(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"gc called {name}{args!r} on a store without paths")
        return call

    for name in ("walk", "scandir", "listdir", "stat", "lstat", "rmdir", "unlink", "open", "rename", "replace",
                 "link", "mkdir"):
        monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    for name in ("iterdir", "glob", "rglob", "exists", "is_dir", "is_file", "is_symlink", "stat", "lstat",
                 "rmdir", "unlink", "open", "read_text", "read_bytes"):
        monkeypatch.setattr(Path, name, refuse(f"Path.{name}"))


def test_gc_walks_plans_and_removes_on_a_store_without_paths(memory: GcMemoryBackend,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    run = MemoryStore(memory)
    extract = run.stage("extract", parallelism=2, consumers=("load",))
    run.attempt(extract, 0, 0, "FINISHED", data=1000, manifest=True)
    run.admit(extract, 0, 0)
    run.attempt(extract, 0, 1, "CANCELED", data=300)
    run.attempt(extract, 1, 0, "FINISHED", data=10, manifest=True)
    run.admit(extract, 1, 0)
    run.commit(extract, {0: 0, 1: 0}, NOW - 10 * HOUR)
    load = run.stage("load")
    run.attempt(load, 0, 0, "FINISHED", data=10, manifest=True)
    run.admit(load, 0, 0)
    run.commit(load, {0: 0}, NOW - 5 * HOUR)
    memory.replace("etl/notes.txt", b"someone's")  # not a run: never looked into
    no_paths(monkeypatch)

    assert store_dag_ids(memory) == {DAG: DAG}
    kept: list[str] = []
    items = plan_gc(memory, now=NOW, run_states={(DAG, RUN): "success"}, retention=HOUR, kept=kept)

    data = f"{run.run}/extract/subtask=0/attempt=1/data"
    assert [(i.name, i.reason, i.tree) for i in items if i.reason == LOSER] == [(data, LOSER, True)]
    # Sizes come from the backend's listing; with no links on such a store every name counts.
    assert next(i for i in items if i.name == data).bytes == 300 + 150
    assert {(i.name, i.reason) for i in items if i.reason == EXPIRED} == {
        (f"{run.run}/extract/subtask={s}/attempt=0/{what}", EXPIRED) for s in (0, 1) for what in ("_SUCCESS", "data")}
    assert all(str(i.path).startswith("memory://") for i in items)
    assert any(k.startswith("skipped etl/: 1 entries") and "notes.txt" in k for k in kept)

    summary = execute_gc(items, now=NOW)

    assert summary["errors"] == [] and summary["removed"] == len(items)
    assert not memory.list_names(f"{run.run}/extract/subtask=0/attempt=1/data")
    assert not memory.list_names(f"{run.run}/extract/subtask=0/attempt=0/data")
    assert memory.exists(f"{run.run}/extract/subtask=0/attempt=1/claim.json")  # history stays
    assert memory.exists(f"{run.run}/load/subtask=0/attempt=0/data/_sp=0/part-0.parquet")
    marker = memory.read_json(f"{run.run}/extract/expired.json")
    assert marker["attempts"] == {"0": 0, "1": 0} and marker["committed_at"] == NOW - 10 * HOUR
    events = memory.read_journal(f"{run.run}/extract/journal.jsonl")
    assert [e["event"] for e in events] == ["gc"]
    assert "subtask=0/attempt=1/data" in [r["path"] for r in events[0]["removed"]]
    assert plan_gc(memory, now=NOW, run_states={(DAG, RUN): "success"}, retention=HOUR) == []


def test_gc_deletes_a_run_on_a_store_without_paths_and_leaves_no_prefix_to_prune(
        memory: GcMemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    gone, other = MemoryStore(memory, run_id="r1"), MemoryStore(memory, dag_id="other", run_id="r1")
    layout = gone.stage("extract")
    gone.attempt(layout, 0, 0, "FINISHED", data=100, manifest=True)
    other.attempt(other.stage("extract"), 0, 0, "FAILED", data=10)
    no_paths(monkeypatch)

    # --older-than reads the objects' modification times from the backend (two hours old here).
    assert plan_gc(memory, now=NOW, run_states={}, dag_id=DAG, older_than=3 * HOUR) == []
    items = plan_gc(memory, now=NOW, run_states={}, dag_id=DAG, older_than=HOUR)
    assert [(i.name, i.reason, i.tree) for i in items] == [(f"{DAG}/r1", DELETED_RUN, True)]
    assert items[0].bytes == sum(len(memory.objects[n]) for n in memory.list_names(f"{DAG}/r1"))

    summary = execute_gc(items, now=NOW)

    assert summary["errors"] == [] and summary["removed"] == 1
    assert memory.children("") == ["other/"]  # the DAG's prefix went with its last object: nothing to prune
    assert memory.calls["delete_tree"] == 1


def test_gc_on_a_store_without_paths_skips_and_refuses_runs_without_their_own_marker(
        memory: GcMemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    owned, unmarked = MemoryStore(memory, run_id="r1"), MemoryStore(memory, run_id="r2")
    for run in (owned, unmarked):
        layout = run.stage("extract")
        run.attempt(layout, 0, 0, "FAILED", data=10)
    memory.objects.pop(f"{DAG}/r2/{OWNER_FILE}")
    memory.claim("")  # the store root's marker does not stand in for a run's
    no_paths(monkeypatch)
    kept: list[str] = []

    items = plan_gc(memory, now=NOW, kept=kept)

    assert [i.name for i in items] == [f"{DAG}/r1/extract/subtask=0/attempt=0/data"]
    assert any(k.startswith(f"run {DAG}/r2: skipped, no {OWNER_FILE} of this store") for k in kept)
    # A planned removal is refused once the run's own marker is gone, root marker or not.
    forged = [lifecycle.GcItem("x", 1, LOSER, store=memory, name=f"{DAG}/r2/extract/subtask=0/attempt=0/data",
                               tree=True)]
    summary = execute_gc(forged, now=NOW)
    assert summary["removed"] == 0 and "refused (not removed)" in summary["errors"][0]["error"]
    assert memory.list_names(f"{DAG}/r2/extract/subtask=0/attempt=0/data")


def test_the_walk_costs_a_fixed_number_of_backend_calls_per_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Think 10,000 subtasks: each costs the same few calls, whatever the number of the others."""
    def cost(n: int) -> Counter[str]:
        store = GcMemoryBackend()
        run = MemoryStore(store, run_id=f"r{n}")
        layout = run.stage("extract", parallelism=n)
        for subtask in range(n):
            run.attempt(layout, subtask, 0, "FINISHED", data=10, manifest=True)
            run.admit(layout, subtask, 0)
            run.attempt(layout, subtask, 1, "FAILED", data=10)
        store.calls.clear()
        monkeypatch.setattr(lifecycle, "attempt_observer", lambda layout: StoreObserver(store, layout))
        items = plan_gc(store, now=NOW, run_states={(DAG, f"r{n}"): "running"})
        assert len(items) == n  # every failed attempt's data
        return store.calls

    small, large = cost(50), cost(200)
    for call in ("children", "list", "stat", "read"):
        # Linear: four times the subtasks, four times the calls (give or take the per-run and per-stage ones).
        assert large[call] <= 4 * small[call] + 10, (call, small, large)
        assert large[call] >= 3 * small[call], (call, small, large)


def test_posix_sizes_still_count_hard_linked_files_once_and_only_when_every_link_goes(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_bytes(b"x" * 100)
    os.link(tmp_path / "a" / "one", tmp_path / "a" / "two")  # both names inside: counted once
    (tmp_path / "a" / "three").write_bytes(b"y" * 10)
    os.link(tmp_path / "a" / "three", tmp_path / "outside")  # a name outside: frees nothing
    infos = store.stat_all("a")
    assert sorted(i.name for i in infos) == ["a/one", "a/three", "a/two"]
    assert {i.links for i in infos} == {2} and len({i.identity for i in infos}) == 2
    assert lifecycle._freed(infos) == 100
    # On a store without links the same rule needs names only: every name is an object of its own.
    assert lifecycle._freed([ObjectInfo(i.name, i.size, i.mtime) for i in infos]) == 210


def test_stale_temporary_files_are_found_by_the_posix_backend_outside_attempt_data(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root)
    layout = store.finished_stage("extract", committed_at=NOW)
    inside = layout.data(0, 0) / ".part.tmp.tmp"  # Spark's business: never looked into
    for path in (layout.dir / ".plan.json.1.tmp", layout.attempt_dir(0, 0) / ".status.json.2.tmp", inside,
                 layout.run_dir / ".blocklist.json.3.tmp"):
        path.write_text("{")
        os.utime(path, (NOW - 2 * HOUR, NOW - 2 * HOUR))
    backend = PosixBackend(root)
    assert [i.name for i in backend.temporaries(layout.name(layout.dir), skip=("data",))] == [
        f"{layout.name(layout.dir)}/.plan.json.1.tmp",
        f"{layout.name(layout.attempt_dir(0, 0))}/.status.json.2.tmp"]
    assert [i.name for i in backend.temporaries(layout.run_prefix, recursive=False)] == [
        f"{layout.run_prefix}/.blocklist.json.3.tmp"]
    items = {i.name for i in plan_gc(root, now=NOW) if i.reason == lifecycle.STALE_TEMP}
    assert items == {f"{layout.name(layout.dir)}/.plan.json.1.tmp",
                     f"{layout.name(layout.attempt_dir(0, 0))}/.status.json.2.tmp",
                     f"{layout.run_prefix}/.blocklist.json.3.tmp"}
    assert inside.exists()


def test_gc_claim_adopts_the_runs_a_provider_plan_names_and_no_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.control.test_lifecycle import run_cli

    root = tmp_path / "store"
    older, foreign = Store(root, run_id="scheduled__1"), Store(root, run_id="scheduled__2")
    layouts = {}
    for run in (older, foreign):
        layout = run.finished_stage("extract", committed_at=NOW - HOUR)
        run.attempt(layout, 0, 1, "FAILED", data=100)
        (layout.run_dir / OWNER_FILE).unlink()  # as an older version left it
        layouts[run.run_id] = layout
    PosixBackend(root, owner="another store").claim(layouts["scheduled__2"].run_prefix)

    out = run_cli(monkeypatch, root, {(DAG, "scheduled__1"): "running", (DAG, "scheduled__2"): "running"}, capsys)
    assert "skipped, no _owner.json of this store" in out and layouts["scheduled__1"].data(0, 1).is_dir()
    assert "gc --claim adopts" in out
    stray = root / DAG / "manual__x" / "extract"  # in a store that is the provider's (store.json): not a run
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("no plan here")

    out = run_cli(monkeypatch, root, {(DAG, "scheduled__1"): "running", (DAG, "scheduled__2"): "running"}, capsys,
                  claim=True)

    assert f"claimed: run {layouts['scheduled__1'].run_prefix}" in out
    assert layouts["scheduled__1"].owns_run() and not layouts["scheduled__1"].data(0, 1).exists()
    assert layouts["scheduled__2"].data(0, 1).is_dir() and not layouts["scheduled__2"].owns_run()
    assert not (stray.parent / OWNER_FILE).exists() and (stray / "notes.txt").is_file()
