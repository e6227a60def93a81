"""Reruns withdraw admissions, outputs and the commit of a region by owned deletes only."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.control.rerun import invalidate_region
from airflow_provider_speculative.core.failover import Region
from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json, read_jsonl
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout


def committed_stage(root: Path, *, claim: bool = True) -> StageLayout:
    """A stage whose subtask 0 committed attempt 1 (attempt 0 lost and was discarded)."""
    layout = StageLayout(root, "etl", "manual__1", "scan")
    if claim:
        layout.claim_run()
    atomic_write_json(layout.plan, {"dag_id": "etl", "run_id": "manual__1", "stage": "scan"})
    assert create_exclusive_json(layout.claim(0, 1), {"target": "local-a"})
    layout.data(0, 1).mkdir(parents=True)
    (layout.data(0, 1) / "part-0.parquet").write_bytes(b"rows")
    atomic_write_json(layout.manifest(0, 1), {"files": []})
    assert create_exclusive_json(layout.admitted(0), {"attempt": 1})
    atomic_write_json(layout.committed, {"stage": "scan", "subtasks": {"0": {"attempt": 1}}})
    return layout


def test_a_rerun_withdraws_the_commit_and_the_admitted_output(tmp_path: Path) -> None:
    layout = committed_stage(tmp_path)

    done = invalidate_region(tmp_path, "etl", "manual__1", Region(subtasks={"scan": {0}}), "rerun by test")

    assert done == {"scan": [0]}
    assert not layout.committed.exists() and not layout.admitted(0).exists()
    assert not layout.data(0, 1).exists() and not layout.manifest(0, 1).exists()
    assert layout.invalidated(0, 1).is_file() and layout.claim(0, 1).is_file()
    assert [e["event"] for e in read_jsonl(layout.journal)] == ["rerun_invalidated"]


def test_a_rerun_of_a_run_an_older_version_planned_claims_it_first(tmp_path: Path) -> None:
    layout = committed_stage(tmp_path, claim=False)

    invalidate_region(tmp_path, "etl", "manual__1", Region(subtasks={"scan": {0}}), "rerun by test")

    assert (layout.run_dir / OWNER_FILE).is_file()
    assert not layout.committed.exists() and not layout.data(0, 1).exists()


def test_a_rerun_of_a_run_another_store_owns_withdraws_nothing(tmp_path: Path) -> None:
    layout = committed_stage(tmp_path, claim=False)
    PosixBackend(tmp_path, owner="another store").claim(layout.run_prefix)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    with pytest.raises(RunNotOwnedError, match=r"DAG 'etl' run 'manual__1' stage 'scan'.*another store"):
        invalidate_region(tmp_path, "etl", "manual__1", Region(subtasks={"scan": {0}}), "rerun by test")

    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
