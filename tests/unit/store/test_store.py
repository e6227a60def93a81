"""Store primitives: atomic JSON, exclusive claims, JSONL journal, manifests, errors, layout and owned deletes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend
from airflow_provider_speculative.store.files import (
    StoreError,
    append_jsonl,
    atomic_write_json,
    create_exclusive_json,
    read_json,
    read_jsonl,
    wait_for_file,
)
from airflow_provider_speculative.store.identity import own_run
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout, safe_component
from airflow_provider_speculative.store.manifest import PartitionError, build_manifest, verify_files
from airflow_provider_speculative.store.results import discard_attempt_output, remove_attempt_output


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- atomic files ---------------------------------------------------------------------------------


def test_atomic_write_json_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "plan.json"
    atomic_write_json(path, {"version": 1, "files": ["a"]})
    atomic_write_json(path, {"version": 2})
    assert json.loads(path.read_text()) == {"version": 2}
    assert names(path.parent) == ["plan.json"]


def test_create_exclusive_json_only_creates_once(tmp_path: Path) -> None:
    path = tmp_path / "attempt=0" / "claim.json"
    assert create_exclusive_json(path, {"owner": "first"}) is True
    assert create_exclusive_json(path, {"owner": "second"}) is False
    assert read_json(path) == {"owner": "first"}
    assert names(path.parent) == ["claim.json"]


def test_read_json_default_and_corrupt_file(tmp_path: Path) -> None:
    assert read_json(tmp_path / "missing.json", default={"x": 1}) == {"x": 1}
    bad = tmp_path / "bad.json"
    bad.write_text('{"half": ')
    with pytest.raises(StoreError, match=str(bad)):
        read_json(bad)


def test_read_jsonl_ignores_a_torn_last_line(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    append_jsonl(journal, {"event": "launch", "attempt": 0})
    append_jsonl(journal, {"event": "admit", "attempt": 0})
    with open(journal, "a") as handle:
        handle.write('{"event": "canc')  # the writer died mid-line
    assert read_jsonl(journal) == [{"event": "launch", "attempt": 0}, {"event": "admit", "attempt": 0}]


def test_read_jsonl_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize(
    "write",
    [
        lambda p: atomic_write_json(p, {"a": 1}),
        lambda p: create_exclusive_json(p, {"a": 1}),
        lambda p: append_jsonl(p, {"a": 1}),
    ],
    ids=["atomic_write_json", "create_exclusive_json", "append_jsonl"],
)
def test_unwritable_location_raises_store_error_naming_the_path(tmp_path: Path, write) -> None:
    # Tests run as root, so chmod cannot make a directory unwritable: put the path under a regular file.
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    target = blocker / "sub" / "x.json"
    with pytest.raises(StoreError) as info:
        write(target)
    assert str(target) in str(info.value)
    assert blocker.read_text() == "not a directory"


# -- manifests ------------------------------------------------------------------------------------


def make_data(data: Path) -> None:
    (data / "_sp=3").mkdir(parents=True)
    (data / "_sp=3" / "part-0.parquet").write_bytes(b"PAR1-three-PAR1")
    (data / "part-1.parquet").write_bytes(b"PAR1-plain-data-PAR1")
    (data / "_SUCCESS").write_text("")  # Spark bookkeeping is not data
    (data / ".part-1.parquet.crc").write_bytes(b"crc")
    (data / "part-1.parquet.crc").write_bytes(b"crc")


def test_build_manifest_lists_data_files_with_size_checksum_and_subpartition(tmp_path: Path) -> None:
    make_data(tmp_path / "data")
    manifest = build_manifest(tmp_path / "data", records=7)
    files = {f["path"]: f for f in manifest["files"]}
    assert sorted(files) == ["_sp=3/part-0.parquet", "part-1.parquet"]
    assert files["_sp=3/part-0.parquet"]["subpartition"] == 3
    assert files["part-1.parquet"]["subpartition"] is None
    assert files["part-1.parquet"]["size"] == len(b"PAR1-plain-data-PAR1")
    assert all(len(f["sha256"]) == 64 for f in files.values())
    assert manifest["bytes"] == sum(f["size"] for f in files.values())
    assert manifest["records"] == 7


def test_build_manifest_of_missing_dir_is_empty(tmp_path: Path) -> None:
    assert build_manifest(tmp_path / "nothing")["files"] == []


def test_verify_files_accepts_intact_output(tmp_path: Path) -> None:
    make_data(tmp_path / "data")
    verify_files(tmp_path / "data", build_manifest(tmp_path / "data")["files"])


def test_verify_files_detects_a_missing_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_data(data)
    files = build_manifest(data)["files"]
    (data / "_sp=3" / "part-0.parquet").unlink()
    with pytest.raises(PartitionError, match=r"missing partition file .*_sp=3/part-0\.parquet") as info:
        verify_files(data, files, stage="agg", subtask=2, attempt=1)
    assert (info.value.stage, info.value.subtask, info.value.attempt) == ("agg", 2, 1)
    assert "stage 'agg' subtask 2 attempt 1" in str(info.value)


def test_verify_files_detects_a_corrupted_byte(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_data(data)
    files = build_manifest(data)["files"]
    target = data / "part-1.parquet"
    content = bytearray(target.read_bytes())
    content[5] ^= 0xFF  # same size, different content
    target.write_bytes(bytes(content))
    with pytest.raises(PartitionError, match=r"corrupt partition file .*part-1.parquet.*checksum"):
        verify_files(data, files)
    verify_files(data, files, checksums=False)  # a size-only check cannot see it


def test_verify_files_detects_a_size_change(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_data(data)
    files = build_manifest(data)["files"]
    with open(data / "part-1.parquet", "ab") as handle:
        handle.write(b"x")
    with pytest.raises(PartitionError, match=r"part-1.parquet.*size 21 != manifest 20"):
        verify_files(data, files, checksums=False)


# -- layout ---------------------------------------------------------------------------------------


def test_safe_component_makes_run_ids_safe() -> None:
    run_id = "manual__2026-01-01T00:00:00+00:00"
    safe = safe_component(run_id)
    assert ":" not in safe and "+" not in safe and "/" not in safe
    assert safe.startswith("manual__2026-01-01T00_00_00_00_00")


def test_safe_component_keeps_distinct_ids_distinct() -> None:
    ids = ["manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00:00:00-00:00",
           "manual__2026-01-01T00_00_00_00_00", "manual__2026-01-01T00+00+00+00+00", "a:b", "a+b", "a_b"]
    assert len({safe_component(i) for i in ids}) == len(ids)


def test_safe_component_leaves_safe_values_alone_and_is_stable() -> None:
    assert safe_component("scheduled__2026-01-01") == "scheduled__2026-01-01"
    assert safe_component("my_dag.v2") == "my_dag.v2"
    assert safe_component("a:b") == safe_component("a:b")


@pytest.mark.parametrize("value", ["..", ".", "", "a/../../etc", "/abs"])
def test_safe_component_never_escapes_its_directory(value: str) -> None:
    safe = safe_component(value)
    assert safe not in ("", ".", "..") and "/" not in safe


def test_stage_layout_paths_use_safe_components(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "manual__2026-01-01T00:00:00+00:00", "agg")
    assert layout.dir.parent == layout.run_dir
    assert layout.run_dir.parent == tmp_path / "dag"
    assert ":" not in str(layout.dir.relative_to(tmp_path))
    assert layout.manifest(1, 2) == layout.dir / "subtask=1" / "attempt=2" / "_SUCCESS"


def test_attempt_numbers_lists_claimed_attempts(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "agg")
    assert layout.attempt_numbers(0) == []
    for name in ("attempt=2", "attempt=0", "attempt=10", "attempt=x", "admitted.json"):
        (layout.subtask_dir(0) / name).mkdir(parents=True)
    assert layout.attempt_numbers(0) == [0, 2, 10]


def test_wait_for_file_ends_on_the_file_on_stop_or_at_the_timeout(tmp_path: Path) -> None:
    release = tmp_path / "release"
    assert not wait_for_file(release, timeout=0.05, interval=0.01)
    asked = []
    assert not wait_for_file(release, timeout=60, interval=0.01, stop=lambda: asked.append(1) or len(asked) > 2)
    assert len(asked) == 3
    release.touch()
    assert wait_for_file(release, timeout=0, interval=0.01)


def test_safe_component_keeps_long_ids_below_the_file_systems_limit(tmp_path: Path) -> None:
    # Found by the plugin's fuzz test: a 2,000-character run id was a 500 (ENAMETOOLONG) on every read.
    long_id = "a" * 2000
    safe = safe_component(long_id)
    assert len(safe.encode()) <= 200 and safe != safe_component("a" * 1999)
    assert not (tmp_path / safe).exists()  # a lookup answers "not there" instead of raising
    assert safe_component("é" * 150).encode().decode() == safe_component("é" * 150)


def test_stages_claiming_a_new_store_at_once_all_succeed(tmp_path) -> None:
    """Stages plan concurrently (all of a run's stages start in the triggerer at once): each owns the store, then
    writes its run directory; none may take another's fresh run directory for foreign data."""
    import threading

    from airflow_provider_speculative.store.identity import own_store

    for round_ in range(30):
        root = tmp_path / f"store{round_}"
        barrier = threading.Barrier(6)
        errors: list[BaseException] = []

        def stage(name: str, root=root, barrier=barrier, errors=errors) -> None:
            barrier.wait()
            try:
                own_store(root)
                (root / "dag" / "run" / name).mkdir(parents=True, exist_ok=True)
            except BaseException as exc:  # collected for the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=stage, args=(f"s{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], errors


def test_a_marker_written_between_the_two_looks_is_accepted(tmp_path, monkeypatch) -> None:
    from airflow_provider_speculative.store import identity

    root = tmp_path / "store"

    def concurrent_stage(path):  # another stage: marker first, then its run directory, while we look
        root.mkdir(exist_ok=True)
        create_exclusive_json(root / identity.STORE_FILE, {"provider": identity.PROVIDER, "created_at": 1.0})
        (root / "dag").mkdir()
        return ["dag/"]

    monkeypatch.setattr(identity, "foreign_entries", concurrent_stage)
    assert identity.own_store(root)["provider"] == identity.PROVIDER


# -- owned deletes of run data ----------------------------------------------------------------------


def _attempt_output(layout: StageLayout, subtask: int = 0, attempt: int = 1) -> None:
    """A finished attempt's claim, status, data and manifest, as the backend and the runtime write them."""
    create_exclusive_json(layout.claim(subtask, attempt), {"target": "local-a"})
    atomic_write_json(layout.status(subtask, attempt), {"state": "FINISHED"})
    part = layout.data(subtask, attempt) / "_sp=0" / "part-00000.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"rows")
    atomic_write_json(layout.manifest(subtask, attempt), {"files": [{"path": "_sp=0/part-00000.parquet", "size": 4}]})


def test_a_losers_output_is_removed_under_a_claimed_run_prefix_and_history_kept(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "etl", "manual__1", "scan")
    layout.claim_run()
    _attempt_output(layout)

    assert remove_attempt_output(layout, 0, 1) is True

    assert not layout.data(0, 1).exists() and not layout.manifest(0, 1).exists()
    assert layout.claim(0, 1).is_file() and layout.status(0, 1).is_file()
    assert (layout.run_dir / OWNER_FILE).is_file()
    # Idempotent: what is gone already is fine.
    assert remove_attempt_output(layout, 0, 1) is False


@pytest.mark.parametrize("marker", [None, "another store"])
def test_a_removal_in_a_run_without_this_stores_marker_refuses_and_deletes_nothing(
        tmp_path: Path, marker: str | None) -> None:
    layout = StageLayout(tmp_path / "store", "etl", "manual__1", "scan")
    if marker is not None:
        PosixBackend(layout.root, owner=marker).claim(layout.run_prefix)
    _attempt_output(layout)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    with pytest.raises(RunNotOwnedError) as refused:
        remove_attempt_output(layout, 0, 1)

    message = str(refused.value)
    assert "DAG 'etl' run 'manual__1'" in message and "stage 'scan'" in message and str(layout.run_dir) in message
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    # The controller's clean-up keeps the output rather than failing the stage.
    assert discard_attempt_output(layout, 0, 1) is False
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    with pytest.raises(RunNotOwnedError):
        layout.delete(layout.status(0, 1))
    with pytest.raises(RunNotOwnedError):
        layout.delete_tree(layout.subtask_dir(0))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_own_run_claims_a_new_run_and_a_run_an_older_version_planned(tmp_path: Path) -> None:
    fresh = StageLayout(tmp_path, "etl", "new", "scan")
    own_run(fresh)
    assert fresh.owns_run() and json.loads((fresh.run_dir / OWNER_FILE).read_text())["prefix"] == "etl/new"
    own_run(fresh)  # a second stage of the run: already ours

    older = StageLayout(tmp_path, "etl", "manual__1", "scan")
    atomic_write_json(older.plan, {"dag_id": "etl", "run_id": "manual__1", "stage": "scan"})
    _attempt_output(older)
    assert not older.owns_run()
    own_run(older)
    assert older.owns_run() and remove_attempt_output(older, 0, 1) is True


def test_own_run_accepts_a_run_another_stage_claimed_while_it_looked(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Every stage of a DAG run plans at once in the triggerer: between this planner's look for the marker and
    # its listing, another stage claims the run and writes its task record. That is this store's run, not a
    # foreign one.
    scan, top = StageLayout(tmp_path, "etl", "r1", "scan"), StageLayout(tmp_path, "etl", "r1", "top")
    listed = top.store.list_names

    def list_after_the_other_stage_wrote(prefix: str) -> list[str]:
        if not scan.owns_run():
            scan.claim_run()
            atomic_write_json(scan.dir / "task.json", {"state": "planning"})
            (scan.dir / "changes").mkdir()
        return listed(prefix)

    monkeypatch.setattr(top.store, "list_names", list_after_the_other_stage_wrote)
    own_run(top)
    assert top.owns_run() and scan.owns_run()


def test_own_run_refuses_a_run_directory_it_cannot_prove_it_wrote(tmp_path: Path) -> None:
    foreign = StageLayout(tmp_path, "etl", "manual__1", "scan")
    (foreign.run_dir / "someone").mkdir(parents=True)
    (foreign.run_dir / "someone" / "notes.txt").write_text("not the provider's")
    # A plan naming another run is no proof either.
    atomic_write_json(foreign.plan, {"dag_id": "etl", "run_id": "manual__2", "stage": "scan"})

    with pytest.raises(RunNotOwnedError, match=r"DAG 'etl' run 'manual__1' stage 'scan'.*holds files"):
        own_run(foreign)
    assert not (foreign.run_dir / OWNER_FILE).exists()

    other = StageLayout(tmp_path, "etl", "manual__3", "scan")
    PosixBackend(tmp_path, owner="another store").claim(other.run_prefix)
    with pytest.raises(RunNotOwnedError, match="owned by another store"):
        own_run(other)
