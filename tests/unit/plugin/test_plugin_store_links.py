"""The log routes and views serve only regular files of the store, reached without a link (SECURITY.md).

A stage application is DAG authors' code on a Spark host that can write its attempt directory: it can
replace its log with a link to the api-server's airflow.cfg, link its ``attempt=N`` or ``subtask=N``
directory elsewhere, link a whole run or stage directory to another DAG's, or leave a FIFO that would
block every reader.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.exceptions import StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.files import open_in_store, read_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.unit.plugin.test_plugin_hostile import DAG, PARAMS, RUN, _client, hostile_store

SECRET = "fernet_key = s3cr3t-FERNET-value\nsql_alchemy_conn = postgresql://airflow:pw@db/airflow\n"
LOG = {"subtask": 0, "attempt": 0}


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, Path]:
    """A store with one finished attempt, and a secret file beside it (outside the store)."""
    root = tmp_path / "store"
    hostile_store(root, history="")
    secret = tmp_path / "airflow.cfg"
    secret.write_text(SECRET)
    StageLayout(root, DAG, RUN, "scan").log(0, 0).write_text("driver says hello\n")
    return root, secret


def _served(root: Path, path: str, **params: Any) -> Any:
    return _client(root).get(path, params={**PARAMS, **params})


def _assert_refused(root: Path, secret: Path) -> None:
    for route in ("/api/log", "/api/log/download"):
        response = _served(root, route, **LOG)
        assert response.status_code == 404, (route, response.text)
        assert "s3cr3t" not in response.text and "fernet" not in response.text
        assert str(root) not in response.text and str(secret.parent) not in response.text


def test_the_log_itself_is_served(store: tuple[Path, Path]) -> None:
    root, _ = store
    assert _served(root, "/api/log", **LOG).json()["text"] == "driver says hello\n"
    download = _served(root, "/api/log/download", **LOG)
    assert download.status_code == 200 and download.text == "driver says hello\n"
    assert download.headers["content-disposition"].startswith("attachment; filename=")


def test_a_log_that_is_a_link_to_a_secret_is_refused(store: tuple[Path, Path]) -> None:
    root, secret = store
    log = StageLayout(root, DAG, RUN, "scan").log(0, 0)
    log.unlink()
    log.symlink_to(secret)
    _assert_refused(root, secret)
    log.unlink()
    log.symlink_to("/etc/passwd")
    assert "root:" not in _served(root, "/api/log", **LOG).text


def test_a_log_that_is_a_hard_link_is_refused(store: tuple[Path, Path]) -> None:
    root, secret = store
    log = StageLayout(root, DAG, RUN, "scan").log(0, 0)
    log.unlink()
    os.link(secret, log)
    _assert_refused(root, secret)


@pytest.mark.parametrize("level", ["attempt", "subtask"])
def test_an_attempt_or_subtask_directory_that_is_a_link_is_refused(store: tuple[Path, Path], level: str) -> None:
    root, secret = store
    layout = StageLayout(root, DAG, RUN, "scan")
    directory = layout.attempt_dir(0, 0) if level == "attempt" else layout.subtask_dir(0)
    outside = secret.parent / f"elsewhere-{level}"
    shutil.copytree(directory, outside)
    (outside / ("spark-submit.log" if level == "attempt" else "attempt=0/spark-submit.log")).write_text(SECRET)
    shutil.rmtree(directory)
    directory.symlink_to(outside, target_is_directory=True)
    _assert_refused(root, secret)


def test_a_run_or_stage_directory_linked_to_another_dags_is_not_served(store: tuple[Path, Path]) -> None:
    root, _ = store
    other = root / "other_dag"
    hostile_store(other.parent / "other-root", history="")
    layout = StageLayout(root, DAG, RUN, "scan")
    # This DAG's run directory becomes a link to another DAG's run (with its stage "scan").
    foreign = StageLayout(other.parent / "other-root", DAG, RUN, "scan").run_dir
    StageLayout(other.parent / "other-root", DAG, RUN, "scan").log(0, 0).write_text(SECRET)
    shutil.rmtree(layout.run_dir)
    layout.run_dir.symlink_to(foreign, target_is_directory=True)
    for route in ("/api/stage", "/api/log", "/api/run"):
        response = _served(root, route, **LOG)
        assert response.status_code == 404, (route, response.text)
        assert "s3cr3t" not in response.text


def test_a_fifo_in_place_of_a_log_or_record_never_blocks_a_reader(tmp_path: Path) -> None:
    root = hostile_store(tmp_path / "store", history="", log_host="10.1.2.3")  # subtask 1 runs
    layout = StageLayout(root, DAG, RUN, "scan")
    for path in (layout.log(1, 0), layout.log(0, 0), layout.heartbeat(0, 0)):
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    answers: dict[str, Any] = {}

    def poll() -> None:
        client = _client(root)
        answers["stage"] = client.get("/api/stage", params=PARAMS)
        answers["log"] = client.get("/api/log", params={**PARAMS, **LOG})
        answers["download"] = client.get("/api/log/download", params={**PARAMS, **LOG})

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    reader.join(timeout=30)  # a blocked open() would never return; the daemon thread dies with the test
    assert not reader.is_alive(), "a request blocked on a FIFO"
    # A record that is a FIFO is a damaged store: a 409 naming the file relative to the store, at once.
    assert answers["stage"].status_code == 409, answers["stage"].text
    message = answers["stage"].json()["detail"]["message"]
    assert "heartbeat.json: not a regular file" in message and str(root) not in message
    with pytest.raises(StoreError, match="not a regular file"):
        read_json(layout.heartbeat(0, 0))
    layout.heartbeat(0, 0).unlink()
    running = _client(root).get("/api/stage", params=PARAMS)  # the running attempt's log is still a FIFO
    assert running.status_code == 200 and running.json()["subtasks"][1]["attempts"][0]["spark_ui"] is None
    assert answers["log"].status_code == 404 and answers["download"].status_code == 404
    with pytest.raises(UnsafeStorePathError):
        open_in_store(root, layout.log(0, 0))


def test_paths_outside_the_store_are_refused_before_any_open(tmp_path: Path) -> None:
    for path in (tmp_path.parent / "x", tmp_path / ".." / "x", tmp_path):
        with pytest.raises(UnsafeStorePathError):
            open_in_store(tmp_path, path)


def test_a_connection_password_in_a_log_is_masked_as_airflow_masks_task_logs(
        store: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = store
    password = "pw-" + os.urandom(6).hex()
    monkeypatch.setenv("AIRFLOW_CONN_MASKED_PG", f"postgresql://etl:{password}@db.invalid:5432/dw")
    layout = StageLayout(root, DAG, RUN, "scan")
    plan = read_json(layout.plan)
    plan["output"] = {"sink": {"kind": "postgres", "postgres_conn_id": "masked_pg"}}
    layout.plan.write_text(json.dumps(plan))
    layout.log(0, 0).write_text(f"connecting with password={password}\nok\n")
    shown = _served(root, "/api/log", **LOG).json()["text"]
    download = _served(root, "/api/log/download", **LOG).text
    for text in (shown, download):
        assert password not in text and "password=***" in text and text.endswith("ok\n"), text


def test_not_found_answers_never_show_the_store_path(store: tuple[Path, Path]) -> None:
    root, _ = store
    client = _client(root)
    for path, params in (("/api/run", {"dag_id": DAG, "run_id": "no-such-run"}),
                         ("/api/stage", {**PARAMS, "task_id": "nothing"}),
                         ("/api/log", {**PARAMS, "subtask": 9}),
                         ("/api/log/download", {**PARAMS, "subtask": 0, "attempt": 7})):
        response = client.get(path, params=params)
        assert response.status_code == 404, (path, response.text)
        assert str(root) not in response.text and str(root.parent) not in response.text, (path, response.text)


@pytest.mark.parametrize("level", ["attempt", "subtask"])
def test_the_stage_view_never_shows_an_attempt_through_a_linked_directory(store: tuple[Path, Path],
                                                                          level: str) -> None:
    root, secret = store
    layout = StageLayout(root, DAG, RUN, "scan")
    directory = layout.attempt_dir(0, 0) if level == "attempt" else layout.subtask_dir(0)
    outside = secret.parent / f"foreign-{level}"
    shutil.copytree(directory, outside)
    claim = outside / ("claim.json" if level == "attempt" else "attempt=0/claim.json")
    claim.write_text(json.dumps({**json.loads(claim.read_text()), "target": "foreign-target", "node": "foreign"}))
    shutil.rmtree(directory)
    directory.symlink_to(outside, target_is_directory=True)
    response = _served(root, "/api/stage")
    assert response.status_code == 200, response.text
    assert "foreign" not in response.text
    assert response.json()["subtasks"][0]["attempts"] == []  # the link is not a directory of the store
