"""The read model, gc and the CLI on a store whose root is an S3 URL, served by the in-memory backend in the cache.

What the CLI and the UI do end to end: ``settings.configured_store`` opens ``[speculative] store_path`` (here an
``s3://`` root, set past the parse-time scheme check, which still refuses it) through ``store/roots.py``, and
every layout below is built over that backend. No file-system call is made on the way (``no_paths``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_speculative import settings
from airflow_provider_speculative.control.lifecycle import LOSER, execute_gc, plan_gc
from airflow_provider_speculative.control.readmodel import clear_cache, latest_run_id, run_plans, run_report
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.plan import PLAN_VERSION
from airflow_provider_speculative.exceptions import ConfigError
from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.layout import NotALocalPathError, StageLayout, StorePath
from tests.factories import stage_plan
from tests.unit.control.test_gc_backend import no_paths
from tests.unit.store.memory import MemoryBackend

S3_ROOT = "s3://lake/speculative"
DAG, RUN = "s3_dag", "manual__2026-11-28T00:00:00+00:00"
T0 = 1_700_000_000.0
DB = {"id": "db1", "dialect": "postgresql", "url": "postgresql://airflow@db/airflow"}


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryBackend]:
    """An S3 store root in memory, installed in the cache and named by ``[speculative] store_path``."""
    roots.forget_stores()
    clear_cache()
    memory = MemoryBackend(S3_ROOT)
    roots.install_store(memory)
    # Set past the parse-time check (core/config.py refuses s3:// until the fault tests run on S3).
    config = dataclasses.replace(SpeculativeConfig(), store_path=S3_ROOT)
    monkeypatch.setattr(settings, "airflow_config", lambda: config)
    yield memory
    roots.forget_stores()
    clear_cache()


def _write_run(store: MemoryBackend) -> StageLayout:
    """One stage of two subtasks: subtask 0 admitted attempt 0 and lost copy 1 (output left), subtask 1 running."""
    plan = stage_plan(S3_ROOT, dag_id=DAG, run_id=RUN, stage="scan", parallelism=2, version=PLAN_VERSION,
                      fingerprint="fp")
    layout = StageLayout.of_plan(plan)
    assert layout.store is store and isinstance(layout.plan, StorePath)
    layout.claim_run()
    layout.replace_json(layout.plan, plan)
    for attempt, state, end in ((0, "FINISHED", T0 + 6), (1, "CANCELED", T0 + 7)):
        layout.create_json(layout.claim(0, attempt), {"created_at": T0, "target": "local-a"})
        layout.replace_json(layout.status(0, attempt), {"deploying_at": T0 + 1, "state": state, "end_at": end,
                                                        "exit_code": 0})
        store.replace(layout.name(layout.data(0, attempt) / "part-0.parquet"), b"rows" * (attempt + 1))
    layout.replace_json(layout.manifest(0, 0), {"files": []})
    layout.create_json(layout.admitted(0), {"attempt": 0})
    layout.create_json(layout.claim(1, 0), {"created_at": T0, "target": "local-b"})
    layout.replace_json(layout.status(1, 0), {"deploying_at": T0 + 1, "state": "RUNNING"})
    layout.replace_json(layout.heartbeat(1, 0), {"node": "n2", "at": T0 + 50, "phase": "RUNNING"})
    layout.replace_json(layout.committed, {"committed_at": T0 + 8, "fingerprint": "fp",
                                           "subtasks": {"0": {"attempt": 0}}})
    return layout


def test_the_configured_store_is_opened_once_and_the_parse_check_still_refuses_s3(store: MemoryBackend) -> None:
    assert settings.configured_store() is store is settings.configured_store()
    assert settings.store_location(settings.airflow_config()) == S3_ROOT
    with pytest.raises(ConfigError, match="store scheme 's3' is not supported"):
        SpeculativeConfig().with_overrides({"store_path": S3_ROOT}, "test")


def test_the_configured_posix_store_is_the_resolved_root_as_before(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setattr(settings, "airflow_config", SpeculativeConfig)
    opened = settings.configured_store()
    assert opened.root == settings.store_root(SpeculativeConfig()) == tmp_path / "speculative-store"  # type: ignore[attr-defined]


def test_the_read_model_reads_an_s3_root_by_name(store: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _write_run(store)
    no_paths(monkeypatch)
    opened = settings.configured_store()
    assert latest_run_id(opened, DAG) == RUN and list(run_plans(opened, DAG, RUN)) == ["scan"]
    # No poller of the test's own: the read model's attempt observer reads the attempts' records by name.
    report = run_report(opened, DAG, RUN, liveness="heartbeat", now=T0 + 60)
    (stage,) = report["stages"]
    assert [s["admitted"] for s in stage["subtasks"]] == [0, None]
    assert [[a["state"] for a in s["attempts"]] for s in stage["subtasks"]] == [["FINISHED", "CANCELED"], ["RUNNING"]]
    assert stage["subtasks"][1]["attempts"][0]["node"] == "n2" and stage["committed"]
    # The same through a layout built from a plan's root alone: the backend this process opened for the URL.
    assert StageLayout(layout.root, DAG, RUN, "scan").store is store


def test_gc_removes_a_loser_on_an_s3_root_by_owned_deletes(store: MemoryBackend,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _write_run(store)
    no_paths(monkeypatch)
    opened = settings.configured_store()
    items = plan_gc(opened, now=T0 + 3600, run_states={(DAG, RUN): "running"})
    loser = layout.name(layout.data(0, 1))
    assert [(i.name, i.reason) for i in items] == [(loser, LOSER)]
    assert str(items[0].path) == f"{S3_ROOT}/{loser}"
    summary = execute_gc(items, now=T0 + 3600, root=opened)
    assert summary["errors"] == [] and summary["removed"] == 1
    assert not store.list_names(loser) and store.exists(layout.name(layout.data(0, 0) / "part-0.parquet"))


def test_the_cli_reads_and_collects_the_configured_s3_store(store: MemoryBackend, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_speculative.cli import commands

    layout = _write_run(store)
    store.replace_json("store.json", {"provider": "airflow-provider-speculative", "metadata_db": DB})
    monkeypatch.setattr(settings, "metadata_db_identity", lambda: DB)
    monkeypatch.setattr(commands, "_db_facts", lambda dag_ids: commands.DbFacts(
        run_states={(DAG, RUN): "running"}, known_dags={DAG}))
    no_paths(monkeypatch)
    commands.status(SimpleNamespace(dag_id=DAG, run_id=None, stage=None, output="json", watch=False))
    shown = json.loads(capsys.readouterr().out)
    # Subtask 1's attempt has no supervisor on this host: the process liveness the CLI uses calls it lost.
    assert [[a["state"] for a in s["attempts"]] for s in shown["stages"][0]["subtasks"]] == [
        ["FINISHED", "CANCELED"], ["FAILED"]]
    commands.gc(SimpleNamespace(dag_id=None, retention=None, older_than=None, claim=False, dry_run=False,
                                output="json"))
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert report["store"] == S3_ROOT and [i["reason"] for i in report["items"]] == [LOSER]
    assert report["summary"]["removed"] == 1 and not store.list_names(layout.name(layout.data(0, 1)))


def test_attempt_logs_of_an_s3_store_are_read_by_name(
        store: MemoryBackend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.cli import commands

    layout = _write_run(store)
    store.replace(layout.name(layout.log(0, 0)), b"driver output\n")
    no_paths(monkeypatch)
    commands.logs(SimpleNamespace(dag_id=DAG, run_id=RUN, stage="scan", subtask=0, attempt=0, tail_bytes=1024,
                                  follow=False, interval=1.0, output="json"))
    shown = json.loads(capsys.readouterr().out)
    assert (shown["text"], shown["path"]) == ("driver output\n", f"{S3_ROOT}/{layout.name(layout.log(0, 0))}")
    assert issubclass(NotALocalPathError, TypeError)


def test_the_airflow_layer_resolves_a_plans_connection_for_its_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import BaseHook

    assert roots._resolver is settings.connection_credentials  # registered when settings.py is imported
    conn = SimpleNamespace(login="AKIDCONN", password="conn-secret", extra_dejson={"endpoint_url": "http://s3:9000"})
    monkeypatch.setattr(BaseHook, "get_connection", classmethod(lambda cls, conn_id: conn))
    credentials = settings.connection_credentials("spec_s3")
    assert (credentials.access_key, credentials.secret_key, credentials.endpoint_url) == (
        "AKIDCONN", "conn-secret", "http://s3:9000")
    assert "conn-secret" not in repr(credentials)


def test_a_plan_is_read_at_the_url_triggers_and_events_carry(store: MemoryBackend) -> None:
    from airflow_provider_speculative.exceptions import StoreError
    from airflow_provider_speculative.operators import stage as operator_stage
    from airflow_provider_speculative.triggers.controller import StageControllerTrigger

    layout = _write_run(store)
    assert str(layout.plan) == f"{S3_ROOT}/{layout.name(layout.plan)}"
    assert settings.read_plan_at(str(layout.plan))["run_id"] == RUN
    assert StageControllerTrigger(plan_path=str(layout.plan), deferred_at=T0)._plan()["stage"] == "scan"
    assert operator_stage._plan_at(str(layout.plan), "stage task")["dag_id"] == DAG  # the worker, resumed
    assert settings.read_plan_at(f"{S3_ROOT}/{DAG}/no-run/scan/plan.json") is None
    with pytest.raises(StoreError, match=r"not the URL of a stage's plan\.json"):
        settings.read_plan_at("s3://lake/plan.json")


def test_lineage_reads_the_plans_of_an_s3_root(store: MemoryBackend) -> None:
    from airflow_provider_speculative.control.lineage import lineage_of_stage
    from airflow_provider_speculative.exceptions import NotFoundError

    _write_run(store)
    inputs, outputs = lineage_of_stage(settings.configured_store(), DAG, RUN, "scan", None)
    assert inputs == [] and [(d.namespace, d.name) for d in outputs] == [("speculative", f"{DAG}/scan")]
    with pytest.raises(NotFoundError, match=f"stage 'nope' has no plan under {S3_ROOT}$"):
        lineage_of_stage(store, DAG, RUN, "nope", None)
