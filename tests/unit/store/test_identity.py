"""The store root's claim, and the adoption checks walking the store through a StoreBackend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json
from airflow_provider_speculative.store.identity import (
    STORE_FILE,
    StoreNotOwnedError,
    foreign_entries,
    own_run,
    own_store,
    provider_plan,
)
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout
from tests.unit.store.memory import MemoryBackend


class RootMemory(MemoryBackend):
    """test_slots' store double, listing the root prefix too (``""``) and reading the root's marker."""

    def _list(self, prefix: str) -> list[str]:
        start = f"{prefix}/" if prefix else ""
        return sorted(n for n in self.objects if n.startswith(start))

    def _children(self, prefix: str) -> list[str]:
        out = set()
        for name in self._list(prefix):
            head, sep, _ = name[len(prefix) + 1 if prefix else 0:].partition("/")
            out.add(head + ("/" if sep else ""))
        return sorted(out)

    def _read_marker(self, prefix: str) -> object:
        data = self.objects.get(f"{prefix}/{OWNER_FILE}" if prefix else OWNER_FILE)
        return None if data is None else json.loads(data)


def test_a_new_store_claims_its_root_before_writing_its_record(tmp_path: Path) -> None:
    root = tmp_path / "new" / "store"
    record = own_store(root)
    marker = json.loads((root / OWNER_FILE).read_text())
    assert marker["prefix"] == "" and marker["owner"] == PosixBackend(root).url
    assert record["provider"] == "airflow-provider-speculative"
    assert marker["at"] <= json.loads((root / STORE_FILE).read_text())["created_at"]
    assert foreign_entries(root) == []  # the root's marker is the provider's own file
    assert own_store(root) == record  # and owning it again changes nothing
    assert json.loads((root / OWNER_FILE).read_text()) == marker


def test_a_store_from_before_the_root_marker_is_adopted_and_claimed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    layout = StageLayout(root, "etl", "manual__1", "scan")
    layout.claim_run()
    atomic_write_json(layout.plan, {"dag_id": "etl", "run_id": "manual__1", "stage": "scan"})
    assert foreign_entries(root) == []
    own_store(root)  # no record, no marker: provider runs only, adopted as before
    assert (root / OWNER_FILE).is_file() and (root / STORE_FILE).is_file()

    recorded = tmp_path / "recorded"
    recorded.mkdir()
    atomic_write_json(recorded / STORE_FILE, {"provider": "airflow-provider-speculative", "created_at": 1.0})
    assert own_store(recorded)["created_at"] == 1.0  # a record but no marker (an earlier version)
    assert json.loads((recorded / OWNER_FILE).read_text())["prefix"] == ""


def test_a_root_claimed_under_another_name_stays_usable_and_is_left_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "store"
    PosixBackend(root, owner="file:///mnt/elsewhere").claim("")
    before = (root / OWNER_FILE).read_bytes()
    assert own_store(root)["provider"] == "airflow-provider-speculative"
    assert (root / OWNER_FILE).read_bytes() == before


def test_a_root_marker_does_not_make_a_foreign_directory_the_providers(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    PosixBackend(root).claim("")
    (root / "dags").mkdir()
    (root / "dags" / "x.py").write_text("print('dag')")
    with pytest.raises(StoreNotOwnedError, match=r"holds 1 entries that are not provider run files \('dags/'\)"):
        own_store(root)
    assert not (root / STORE_FILE).exists()


def test_the_roots_marker_does_not_stand_in_for_a_runs(tmp_path: Path) -> None:
    """Runs an older version (or anyone) left under a claimed root are still not the provider's to delete."""
    root = tmp_path / "store"
    own_store(root)
    foreign = StageLayout(root, "etl", "manual__1", "scan")
    (foreign.run_dir / "someone").mkdir(parents=True)
    (foreign.run_dir / "someone" / "notes.txt").write_text("not the provider's")
    assert PosixBackend(root).owns(foreign.run_prefix)  # the backend's walk up reaches the root's marker ...
    assert not foreign.owns_run()  # ... but a run is owned by its own marker only
    with pytest.raises(RunNotOwnedError):
        foreign.delete(foreign.run_dir / "someone" / "notes.txt")
    with pytest.raises(RunNotOwnedError, match="holds files"):
        own_run(foreign)
    assert (foreign.run_dir / "someone" / "notes.txt").is_file() and not (foreign.run_dir / OWNER_FILE).exists()


def test_adoption_checks_walk_any_backend_by_name() -> None:
    store = RootMemory()
    store.replace_json("etl/manual__1/scan/plan.json", {"dag_id": "etl", "run_id": "manual__1", "stage": "scan"})
    store.replace_json("etl/manual__2/scan/task.json", {"state": "failed", "at": 1.0})  # failed to plan
    store.claim("etl/manual__2")
    store.replace_json("_targets/t/speed.json", {})
    store.claim("")
    assert provider_plan(store, "etl/manual__1") == {"dag_id": "etl", "run_id": "manual__1", "stage": "scan"}
    assert provider_plan(store, "etl/manual__2") is None
    assert foreign_entries(store) == []
    store.replace_json("etl/manual__3/scan/plan.json", {"dag_id": "etl", "run_id": "manual__9", "stage": "scan"})
    store.replace("notes.txt", b"mine")
    assert foreign_entries(store) == ["etl/", "notes.txt"]


def test_temporary_files_in_flight_are_no_foreign_entries(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / f".{STORE_FILE}.1234.tmp").write_text("{")
    (root / f".{OWNER_FILE}.5678.tmp").write_text("{")
    assert foreign_entries(root) == []
    assert create_exclusive_json(root / "etl" / "r" / "s" / "task.json", {"state": "planning", "at": 1.0})
    assert foreign_entries(root) == []


def test_an_existing_store_that_cannot_take_the_root_marker_is_used_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.exceptions import StoreNotWritableError

    root = tmp_path / "store"
    root.mkdir()
    atomic_write_json(root / STORE_FILE, {"provider": "airflow-provider-speculative", "created_at": 1.0})

    def read_only(self: PosixBackend, prefix: str = "") -> dict[str, object]:
        raise StoreNotWritableError(f"store is not writable: {self.describe(prefix)}")

    monkeypatch.setattr(PosixBackend, "claim", read_only)
    assert own_store(root)["created_at"] == 1.0
    assert not (root / OWNER_FILE).exists()
    with pytest.raises(StoreNotWritableError):  # a new store must take it: nothing is created without it
        own_store(tmp_path / "new")
    assert not (tmp_path / "new" / STORE_FILE).exists()
