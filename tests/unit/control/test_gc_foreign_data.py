"""The store root is owned: a shared directory is refused, and gc removes nothing it did not write."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_speculative.control.lifecycle import DELETED_RUN, execute_gc, plan_gc
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.store.identity import (
    STORE_FILE,
    StoreNotOwnedError,
    claim_store,
    db_identity,
    foreign_entries,
    own_store,
)
from tests.unit.control.test_lifecycle import DAG, Store

DB_URL = "postgresql://airflow:secret@127.0.0.1:5432/airflow"
DAY = 86400.0
OLD = 400 * DAY


def files(root: Path) -> set[str]:
    """Every file under ``root`` (relative), the marker aside."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != STORE_FILE}


def age(root: Path, seconds: float) -> None:
    """Make every file and directory under ``root`` look ``seconds`` old."""
    past = os.path.getmtime(root) - seconds
    for path in [root, *root.rglob("*")]:
        os.utime(path, (past, past), follow_symlinks=False)


def shared_directory(root: Path) -> set[str]:
    """A directory other people use: DAG files, Airflow task logs, a thesis; all untouched for a long time."""
    for rel, text in {"dags/team_a/x.py": "print('dag')", "logs/dag_id=etl/run_id=manual__1/task_id=t/attempt=1.log":
                      "log", "projects/thesis/chapter1.tex": "\\chapter{One}", "notes.txt": "mine",
                      # Shaped like a run but with no plan naming it: not ours either.
                      "etl2/manual__9/scan/journal.jsonl": "{}\n"}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    age(root, OLD)
    return files(root)


def gc_cli(monkeypatch: pytest.MonkeyPatch, root: Path, capsys: pytest.CaptureFixture[str], **args: Any) -> str:
    """Run `airflow speculative gc` on ``root`` against a metadata DB that knows DAG etl but none of its runs."""
    from airflow_provider_speculative import settings
    from airflow_provider_speculative.cli import commands

    monkeypatch.setattr(settings, "store_root", lambda config: root)
    monkeypatch.setattr(settings, "airflow_config", SpeculativeConfig)
    monkeypatch.setattr(settings, "metadata_db_identity", lambda: db_identity(DB_URL))
    asked: list[list[str]] = []
    monkeypatch.setattr(commands, "_db_facts", lambda dag_ids: asked.append(dag_ids) or commands.DbFacts(
        run_states={}, known_dags={DAG}))
    defaults = {"dag_id": None, "dry_run": False, "retention": None, "output": "table", "older_than": None,
                "claim": False}
    commands.gc(SimpleNamespace(**{**defaults, **args}))
    # Only DAG directories holding provider runs are looked up: never 'dags', 'logs' or 'projects'.
    assert all(set(a) <= {DAG} for a in asked), asked
    return capsys.readouterr().out


def test_a_shared_non_empty_directory_is_refused_naming_what_is_there(tmp_path: Path):
    root = tmp_path / "shared"
    before = shared_directory(root)
    with pytest.raises(StoreNotOwnedError, match=r"is not the provider's: it has no store.json and holds 5 entries "
                                                 r"that are not provider run files \('dags/', 'etl2/', 'logs/', "
                                                 r"'notes.txt', 'projects/'\)"):
        own_store(root)
    with pytest.raises(StoreNotOwnedError):
        claim_store(root, db_identity(DB_URL))
    assert files(root) == before and not (root / STORE_FILE).exists()


def test_gc_claim_refuses_a_shared_directory_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]):
    root = tmp_path / "shared"
    before = shared_directory(root)
    with pytest.raises(SystemExit) as exit_info:
        gc_cli(monkeypatch, root, capsys, claim=True, older_than="30d")
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: gc --claim refused, nothing written or deleted: store root ")
    assert "'dags/'" in err and "store_path" in err
    assert files(root) == before and not (root / STORE_FILE).exists()
    # Without --claim: no marker, so nothing is trusted and nothing deleted either.
    with pytest.raises(SystemExit):
        gc_cli(monkeypatch, root, capsys, older_than="30d")
    assert files(root) == before


def test_gc_older_than_removes_only_provider_runs_even_in_a_marked_shared_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """The worst case: a marker got there anyway (an older version wrote it without looking)."""
    root = tmp_path / "shared"
    foreign = shared_directory(root)
    (root / STORE_FILE).write_text(json.dumps({"metadata_db": db_identity(DB_URL), "created_at": 0}))
    ours = Store(root, run_id="manual__old").finished_stage("extract", committed_at=0)
    (root / "_targets" / "local-a" / "slots").mkdir(parents=True)
    (root / "_targets" / "local-a" / "slots" / "slot-0.json").write_text("{}")
    # A run directory whose plan names another run: copied or hand-made, not this run's.
    alien = root / DAG / "manual__alien" / "extract"
    alien.mkdir(parents=True)
    (alien / "plan.json").write_text(json.dumps({**json.loads(ours.plan.read_text()), "run_id": "manual__other"}))
    age(root, OLD)
    keep = {f for f in files(root) if not f.startswith(f"{DAG}/manual__old/")}

    out = gc_cli(monkeypatch, root, capsys, older_than="30d")

    assert not ours.run_dir.exists()  # the provider's own old run is gone
    assert files(root) >= foreign and (alien / "plan.json").is_file()
    assert files(root) == keep
    assert "skipped etl/: 1 entries hold no plan.json of this provider naming them (manual__alien/)" in out
    assert "removed 1 paths" in out


def test_plan_gc_lists_nothing_foreign(tmp_path: Path):
    root = tmp_path / "shared"
    shared_directory(root)
    kept: list[str] = []
    items = plan_gc(root, now=os.path.getmtime(root) + OLD + DAY, run_states={}, older_than=30 * DAY,
                    deleted_dags={"dags", "logs", "projects", "etl2"}, kept=kept)
    assert items == []
    assert {k.split(":")[0] for k in kept} == {"skipped dags/", "skipped logs/", "skipped projects/", "skipped etl2/"}


def test_a_store_of_provider_runs_without_marker_is_adopted(tmp_path: Path):
    """Stores planned before the marker existed (Airflow 3 tasks never wrote store.json) keep working."""
    root = tmp_path / "store"
    layout = Store(root).finished_stage("extract", committed_at=0)
    (root / "_targets" / "local-a").mkdir(parents=True)
    assert foreign_entries(root) == []
    record = own_store(root)
    assert record["provider"] == "airflow-provider-speculative" and "metadata_db" not in record
    # gc --claim later adds the database to the marker a task wrote.
    assert claim_store(root, db_identity(DB_URL))["metadata_db"]["id"] == db_identity(DB_URL)["id"]
    assert json.loads((root / STORE_FILE).read_text())["metadata_db"]["url"].startswith("postgresql://airflow@")
    assert layout.plan.is_file()
    # An empty or missing root is created and marked.
    assert own_store(tmp_path / "new" / "store")["provider"] == "airflow-provider-speculative"
    (tmp_path / "empty").mkdir()
    assert own_store(tmp_path / "empty")["provider"] == "airflow-provider-speculative"


def test_gc_with_marker_but_no_database_recorded_deletes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]):
    root = tmp_path / "store"
    layout = Store(root, run_id="manual__old").finished_stage("extract", committed_at=0)
    own_store(root)
    age(root, OLD)
    with pytest.raises(SystemExit):
        gc_cli(monkeypatch, root, capsys, older_than="30d")
    assert "names no metadata database" in capsys.readouterr().err and layout.run_dir.exists()
    out = gc_cli(monkeypatch, root, capsys, older_than="30d", claim=True)
    assert DELETED_RUN in out and not layout.run_dir.exists()


def test_execute_gc_leaves_a_foreign_dag_directory_in_place(tmp_path: Path):
    """Removing a DAG's last run removes its directory only if that is then empty."""
    root = tmp_path / "store"
    layout = Store(root, run_id="manual__old").finished_stage("extract", committed_at=0)
    (layout.run_dir.parent / "README").write_text("someone's note")
    items = plan_gc(root, now=1e12, run_states={}, deleted_dags={DAG})
    assert [i.reason for i in items] == [DELETED_RUN]
    execute_gc(items, now=1e12)
    assert (root / DAG / "README").read_text() == "someone's note"
