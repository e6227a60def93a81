"""Attempt logs by name on an S3 root (the in-memory backend installed): the CLI's ``logs``, the UI's log routes.

An attempt's supervisor writes its log to a local file of its host and uploads it to the attempt's
``spark-submit.log`` name when the attempt ends (backends/supervised.py). Here: the tail and a follow by ranged
reads, never a whole read of the log; a running attempt's log named where it is (its host, its local path under
``$AIRFLOW_HOME``), read from that file on the supervisor's own host under the rules of a store file; and no
file-system call on a store path anywhere (``tests/unit/store/no_store_paths.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_speculative import settings
from airflow_provider_speculative.control.attemptlog import (
    attempt_ended,
    attempt_log,
    failure_log_lines,
    open_attempt_log,
    read_log_from,
)
from airflow_provider_speculative.control.readmodel import clear_cache
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.exceptions import NotFoundError
from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.layout import LOG_FILE, StageLayout, local_attempt_dir
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S3_ROOT = "s3://lake/speculative"
HOST = socket.gethostname()  # what a supervisor records as its host
DAG, RUN = "logs_dag", "manual__2026-11-28T00:00:00+00:00"
LOG = b"".join(f"row {i}\n".encode() for i in range(2000)) + b"boom: ValueError\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$AIRFLOW_HOME``: where this host's supervisors keep an S3 attempt's local log."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def store(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryBackend]:
    """An S3 root in memory named by ``[speculative] store_path``, with every file-system call on it refused."""
    roots.forget_stores()
    clear_cache()
    memory = MemoryBackend(S3_ROOT)
    roots.install_store(memory)
    config = dataclasses.replace(SpeculativeConfig(), store_path=S3_ROOT)
    monkeypatch.setattr(settings, "airflow_config", lambda: config)
    refuse_store_paths(monkeypatch, S3_ROOT)
    yield memory
    roots.forget_stores()
    clear_cache()


def _stage(store: MemoryBackend) -> StageLayout:
    """Stage ``scan`` of two subtasks: subtask 0's attempt 0 ended (log uploaded), attempts of subtask 1 to come."""
    plan = stage_plan(S3_ROOT, dag_id=DAG, run_id=RUN, stage="scan", parallelism=2)
    layout = StageLayout.of_plan(plan)
    assert layout.store is store
    layout.claim_run()
    layout.replace_json(layout.plan, plan)
    _attempt(layout, 0, 0, host=HOST, end_at=9.0)
    store.replace(layout.name(layout.log(0, 0)), LOG)
    return layout


def _attempt(layout: StageLayout, subtask: int, attempt: int, *, host: Any, end_at: float | None = None) -> None:
    layout.create_json(layout.claim(subtask, attempt), {"target": "local-a", "created_at": 1.0})
    status: dict[str, Any] = {"deploying_at": 1.0, "pid": 999_999_999, "host": host}
    if end_at is not None:
        status.update(end_at=end_at, exit_code=1, state="FAILED")
    layout.replace_json(layout.status(subtask, attempt), status)


def _whole_reads(store: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names the store reads whole from now on (a log must only ever be read by ranges)."""
    names: list[str] = []
    read = store._read

    def counted(name: str) -> bytes | None:
        names.append(name)
        return read(name)

    monkeypatch.setattr(store, "_read", counted)
    return names


# -- the tail, the follow, the end -------------------------------------------------------------------


def test_the_tail_of_an_uploaded_log_is_one_stat_and_one_ranged_read(
        store: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _stage(store)
    whole = _whole_reads(store, monkeypatch)
    before = store.ranged_reads
    log = attempt_log(store, DAG, RUN, "scan", 0, max_bytes=100)
    assert log.exists and not log.elsewhere and log.note == "" and log.local is None
    assert log.text.endswith("boom: ValueError\n") and log.text.startswith("row ")  # whole lines only
    assert log.truncated and log.size == len(LOG) and len(log.text) <= 100
    assert str(log.path) == f"{S3_ROOT}/{layout.name(layout.log(0, 0))}"
    assert store.ranged_reads == before + 1 and layout.name(layout.log(0, 0)) not in whole
    assert attempt_ended(store, log)
    # A StorePath root (what the CLI handed before) names the same store.
    assert attempt_log(layout.root, DAG, RUN, "scan", 0, 0, max_bytes=100) == log


def test_a_follow_reads_what_the_log_gained_past_an_offset(store: MemoryBackend) -> None:
    layout = _stage(store)
    log = attempt_log(store, DAG, RUN, "scan", 0, 0, max_bytes=10)
    assert read_log_from(store, log, log.size) == (log.size, "")
    store.replace(layout.name(layout.log(0, 0)), LOG + b"one more\nand a half")
    assert read_log_from(store, log, log.size) == (log.size + 19, "one more\nand a half")
    # A full buffer ending mid-line stops at its last newline: the cut line comes whole next time.
    assert read_log_from(store, log, log.size, max_bytes=12) == (log.size + 9, "one more\n")
    assert read_log_from(store, log, 0, max_bytes=14) == (12, "row 0\nrow 1\n")


def test_the_whole_log_downloads_as_a_stream_of_the_object(store: MemoryBackend) -> None:
    _stage(store)
    log = attempt_log(store, DAG, RUN, "scan", 0, 0, max_bytes=1)
    with open_attempt_log(store, log) as handle:
        assert handle.read() == LOG


# -- a log not in the store: running, or ended without an upload -------------------------------------


def test_a_running_attempt_on_another_host_says_where_its_log_is(store: MemoryBackend) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host="spark-7.example")
    log = attempt_log(store, DAG, RUN, "scan", 1)
    assert (log.attempt, log.exists, log.elsewhere, log.text, log.local) == (0, False, True, "", None)
    where = local_attempt_dir(layout, 1, 0).relative_to(local_attempt_dir(layout, 1, 0).parents[6])
    assert where.parts[0] == "speculative-local" and where.name == "attempt=0"
    assert log.note == (f"attempt 0 is running: its log is in the store once it ends; until then it is a local "
                        f"file on host spark-7.example, in {where.as_posix()}/{LOG_FILE} under its $AIRFLOW_HOME")
    assert not attempt_ended(store, log) and read_log_from(store, log, 0) == (0, "")
    with pytest.raises(NotFoundError, match="is running: its log is in the store once it ends"):
        open_attempt_log(store, log)
    # Ended: the upload comes before the end is recorded, so a reader that sees the end finds the log.
    store.replace(layout.name(layout.log(1, 0)), b"done\n")
    _attempt_end(layout, 1, 0)
    assert attempt_ended(store, log) and read_log_from(store, log, 0) == (5, "done\n")


def _attempt_end(layout: StageLayout, subtask: int, attempt: int) -> None:
    status = layout.read_json(layout.status(subtask, attempt))
    layout.replace_json(layout.status(subtask, attempt), {**status, "end_at": 20.0, "exit_code": 0})


@pytest.mark.parametrize("host", ["<script>alert(1)</script>", "evil\nhost", "", None, 7, "-leading-dash",
                                  "a" * 300])
def test_a_host_a_status_record_names_is_shown_only_if_it_is_a_plain_host_name(
        store: MemoryBackend, host: Any) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host=host)
    log = attempt_log(store, DAG, RUN, "scan", 1, 0)
    assert "on its supervisor's host, in speculative-local/" in log.note and log.elsewhere
    assert "script" not in log.note and "evil" not in log.note


def test_an_attempt_not_started_yet_has_no_output_and_no_note(store: MemoryBackend) -> None:
    layout = _stage(store)
    layout.create_json(layout.claim(1, 0), {"target": "local-a"})
    log = attempt_log(store, DAG, RUN, "scan", 1, 0)
    assert (log.exists, log.elsewhere, log.note) == (False, False, "")


def test_an_ended_attempt_without_an_uploaded_log_says_so(store: MemoryBackend) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host="spark-7", end_at=5.0)
    log = attempt_log(store, DAG, RUN, "scan", 1, 0)
    assert log.elsewhere and not log.exists and attempt_ended(store, log)
    assert log.note.startswith("attempt 0 ended but its log is not in the store (its upload failed, or gc removed "
                               "it); its supervisor's local copy may still be on host spark-7, in speculative-local/")


def test_on_the_supervisors_host_a_running_attempts_local_log_is_read_and_followed(
        store: MemoryBackend, home: Path) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host=HOST)
    local = local_attempt_dir(layout, 1, 0) / LOG_FILE
    local.parent.mkdir(parents=True)
    local.write_bytes(b"starting\nreading\n")
    log = attempt_log(store, DAG, RUN, "scan", 1, 0)
    assert (log.exists, log.elsewhere, log.local, log.text) == (True, False, local, "starting\nreading\n")
    assert "is running: its log is read from its supervisor's local file on this host" in log.note
    assert str(home) not in log.note  # relative to $AIRFLOW_HOME: no absolute path of this host in a message
    with open_attempt_log(store, log) as handle:
        assert handle.read() == b"starting\nreading\n"
    # The follow goes on in the local file, then in the uploaded copy at the same offsets.
    with local.open("ab") as out:
        out.write(b"more\n")
    assert read_log_from(store, log, log.size) == (log.size + 5, "more\n")
    store.replace(layout.name(layout.log(1, 0)), local.read_bytes() + b"uploaded\n")
    assert read_log_from(store, log, log.size + 5) == (log.size + 14, "uploaded\n")


@pytest.mark.parametrize("hostile", ["log-link", "dir-link", "fifo", "hard-link"])
def test_a_local_log_that_is_a_link_or_a_fifo_is_never_read(
        store: MemoryBackend, tmp_path: Path, hostile: str) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host=HOST)
    secret = tmp_path / "airflow.cfg"
    secret.write_text("fernet_key = s3cr3t\n")
    local = local_attempt_dir(layout, 1, 0) / LOG_FILE
    local.parent.mkdir(parents=True)
    if hostile == "log-link":
        local.symlink_to(secret)
    elif hostile == "fifo":
        os.mkfifo(local)
    elif hostile == "hard-link":
        os.link(secret, local)
    else:  # the attempt's directory itself links elsewhere
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / LOG_FILE).write_text("fernet_key = s3cr3t\n")
        local.parent.rmdir()
        local.parent.symlink_to(elsewhere)
    log = attempt_log(store, DAG, RUN, "scan", 1, 0)
    assert (log.exists, log.elsewhere, log.local, log.text) == (False, True, None, "")
    assert "s3cr3t" not in json.dumps(log.to_json())
    with pytest.raises(NotFoundError):
        open_attempt_log(store, log)


# -- the task log's lines of a failed stage -----------------------------------------------------------


def test_a_failed_attempts_lines_name_the_logs_url_and_read_its_end_by_range(
        store: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _stage(store)
    whole = _whole_reads(store, monkeypatch)
    lines = failure_log_lines(layout, [(0, 0)])
    assert lines[0].startswith(f"attempt logs are in the store under {S3_ROOT}/{DAG}/")
    assert lines[-1] == "  | boom: ValueError" and len(lines) == 2 + 20
    assert layout.name(layout.log(0, 0)) not in whole
    _attempt(layout, 1, 0, host="spark-7", end_at=5.0)
    missing = failure_log_lines(layout, [(1, 0)])
    assert missing[-1].startswith(f"subtask 1 attempt 0's log {S3_ROOT}/{layout.name(layout.log(1, 0))}: attempt 0 "
                                  "ended but its log is not in the store")


# -- the CLI ----------------------------------------------------------------------------------------------


def _logs(**overrides: Any) -> None:
    from airflow_provider_speculative.cli import commands

    args = {"dag_id": DAG, "run_id": RUN, "stage": "scan", "subtask": 0, "attempt": None, "tail_bytes": 100,
            "output": "table", "follow": False, "interval": 0.01, **overrides}
    commands.logs(SimpleNamespace(**args))


def test_logs_prints_the_tail_of_an_uploaded_log(store: MemoryBackend, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _stage(store)
    _logs()
    captured = capsys.readouterr()
    assert captured.out.endswith("row 1999\nboom: ValueError\n") and "row 0\n" not in captured.out
    assert f"stage scan subtask 0 attempt 0: {S3_ROOT}/{layout.name(layout.log(0, 0))}, last" in captured.err
    _logs(output="json", run_id=None)
    body = json.loads(capsys.readouterr().out)
    assert (body["exists"], body["note"], body["path"]) == (True, "", f"{S3_ROOT}/{layout.name(layout.log(0, 0))}")


def test_logs_of_a_running_attempt_elsewhere_exits_1_naming_where_the_log_is(
        store: MemoryBackend, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host="spark-7")
    with pytest.raises(SystemExit) as exit_:
        _logs(subtask=1)
    captured = capsys.readouterr()
    assert exit_.value.code == 1 and captured.out == ""
    assert "(not in the store)" in captured.err and "on host spark-7, in speculative-local/" in captured.err
    assert "run with --follow to wait for the attempt's end" in captured.err
    with pytest.raises(SystemExit):
        _logs(subtask=1, output="json")
    body = json.loads(capsys.readouterr().out)
    assert (body["exists"], body["elsewhere"]) == (False, True) and "spark-7" in body["note"]


def test_logs_follow_of_a_running_attempt_elsewhere_prints_the_log_once_uploaded(
        store: MemoryBackend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host="spark-7")
    sleeps: list[float] = []

    def the_attempt_ends(seconds: float) -> None:
        sleeps.append(seconds)
        store.replace(layout.name(layout.log(1, 0)), b"first\nlast\n")
        _attempt_end(layout, 1, 0)

    monkeypatch.setattr("time.sleep", the_attempt_ends)
    _logs(subtask=1, follow=True)
    captured = capsys.readouterr()
    assert captured.out == "first\nlast\n" and len(sleeps) == 1 and "is running" in captured.err


def test_logs_follow_of_an_attempt_that_ended_without_an_upload_exits_1(
        store: MemoryBackend, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host="spark-7", end_at=5.0)
    with pytest.raises(SystemExit) as exit_:
        _logs(subtask=1, follow=True)
    assert exit_.value.code == 1 and "ended and its log is not in the store" in capsys.readouterr().err


# -- the UI's log routes -------------------------------------------------------------------------------


def _ui(store: MemoryBackend) -> Any:
    from fastapi.testclient import TestClient

    from airflow_provider_speculative.plugin.app import create_app

    app = create_app(store=store)
    for dependency in app.state.access.values():
        app.dependency_overrides[dependency] = lambda: None
    return TestClient(app)


def test_the_log_routes_serve_an_uploaded_log_and_say_where_a_running_one_is(store: MemoryBackend) -> None:
    layout = _stage(store)
    _attempt(layout, 1, 0, host="spark-7")
    client = _ui(store)
    params = {"dag_id": DAG, "run_id": RUN, "task_id": "scan", "subtask": 0, "tail_bytes": 100}
    body = client.get("/api/log", params=params).json()
    assert body["text"].endswith("boom: ValueError\n") and body["truncated"] and body["ended"] is True
    # Relative to the store: neither the bucket nor the root's prefix is shown to every DAG reader.
    assert body["path"] == layout.name(layout.log(0, 0)) and body["note"] == ""
    download = client.get("/api/log/download", params=params)
    assert download.status_code == 200 and download.content == LOG
    assert download.headers["content-type"] == "text/plain; charset=utf-8"

    running = client.get("/api/log", params={**params, "subtask": 1}).json()
    assert (running["exists"], running["elsewhere"], running["done"], running["text"]) == (False, True, False, "")
    assert "on host spark-7, in speculative-local/" in running["note"]
    refused = client.get("/api/log/download", params={**params, "subtask": 1})
    assert refused.status_code == 404 and "is running: its log is in the store once it ends" in refused.text


def test_the_log_page_shows_the_note_as_text() -> None:
    from airflow_provider_speculative.plugin.app import STATIC

    script = (STATIC / "speculative.js").read_text()
    # Through h(), which appends text nodes only: the note is never parsed as markup.
    assert 'h("p", {class: "message", id: "log-note"}, d.note)' in script
    assert "innerHTML" not in script


# -- on moto's S3, with credentials that must never be shown ---------------------------------------------

ACCESS_KEY, SECRET_KEY, TOKEN = "AKIALOGSTESTACCESSID", "logs-test-secret-KEY/xyz", "logs-test-session-TOKEN"


def test_no_credential_appears_in_what_logs_show_on_s3(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import boto3
    import moto

    from airflow_provider_speculative.exceptions import StoreError
    from airflow_provider_speculative.store.backend import S3Backend

    credentials = SimpleNamespace(endpoint_url=None, region="us-east-1", access_key=ACCESS_KEY,
                                  secret_key=SECRET_KEY, session_token=TOKEN)
    config = dataclasses.replace(SpeculativeConfig(), store_path=S3_ROOT)
    monkeypatch.setattr(settings, "airflow_config", lambda: config)
    roots.forget_stores()
    clear_cache()
    shown: list[str] = []
    try:
        with moto.mock_aws():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="lake")
            s3 = S3Backend(S3_ROOT, credentials)
            roots.install_store(s3)
            plan = stage_plan(S3_ROOT, dag_id=DAG, run_id=RUN, stage="scan", parallelism=2)
            layout = StageLayout.of_plan(plan)
            assert layout.store is s3
            layout.claim_run()
            layout.replace_json(layout.plan, plan)
            _attempt(layout, 0, 0, host="spark-7", end_at=9.0)
            s3.replace(layout.name(layout.log(0, 0)), LOG)
            _attempt(layout, 1, 0, host="spark-7", end_at=9.0)  # ended, its upload failed

            log = attempt_log(s3, DAG, RUN, "scan", 0, 0, max_bytes=64)
            assert log.text.endswith("boom: ValueError\n") and str(log.path).startswith(f"{S3_ROOT}/{DAG}/")
            shown += [json.dumps(log.to_json()), json.dumps(attempt_log(s3, DAG, RUN, "scan", 1, 0).to_json())]
            lines = failure_log_lines(layout, [(1, 0), (0, 0)])
            assert f"{S3_ROOT}/{layout.name(layout.log(1, 0))}" in lines[-1]
            shown += lines
            _logs(output="json", attempt=0)
            with pytest.raises(SystemExit):
                _logs(subtask=1)
            captured = capsys.readouterr()
            shown += [captured.out, captured.err]
            client = _ui(s3)
            for route, subtask in (("/api/log", 0), ("/api/log", 1), ("/api/log/download", 0),
                                   ("/api/log/download", 1)):
                shown.append(client.get(route, params={"dag_id": DAG, "run_id": RUN, "task_id": "scan",
                                                       "subtask": subtask}).text)
            # A store the service refuses: the error names the object and the service's code, nothing else.
            with pytest.raises(StoreError) as refused:
                attempt_log(S3Backend("s3://no-such-bucket/x", credentials), DAG, RUN, "scan", 0, 0)
            shown.append(str(refused.value))
            assert "s3://no-such-bucket/x" in shown[-1]
    finally:
        roots.forget_stores()
        clear_cache()
    assert any("boom: ValueError" in text for text in shown)
    for text in shown:
        assert ACCESS_KEY not in text and SECRET_KEY not in text and TOKEN not in text
