"""Driver logs in the task log on an S3 root (the in-memory backend installed): a running attempt's local log.

A running attempt's log is a local file of its supervisor's host until it ends and is uploaded by name
(backends/supervised.py). The controller's stream follows that file when the attempt's status names this host,
under the rules of a store file, then goes on in the uploaded copy from the same offset; an attempt supervised
elsewhere shows nothing until it ends. No file-system call is made on a store path
(``tests/unit/store/no_store_paths.py``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control.locallog import local_log
from airflow_provider_speculative.control.logstream import DriverLogStream
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S = AttemptState
S3_ROOT = "s3://lake/speculative"
HOST = socket.gethostname()  # what a supervisor on this host records
PREFIX = "subtask 0 attempt 1 (target local-a): "


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryBackend]:
    """An S3 root in memory, ``$AIRFLOW_HOME`` in tmp, and every file-system call on the store refused."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    roots.forget_stores()
    memory = MemoryBackend(S3_ROOT)
    roots.install_store(memory)
    refuse_store_paths(monkeypatch, S3_ROOT)
    yield memory
    roots.forget_stores()


@pytest.fixture
def layout(store: MemoryBackend) -> StageLayout:
    layout = StageLayout.of_plan(stage_plan(S3_ROOT))
    assert layout.store is store
    layout.claim_run()
    layout.create_json(layout.claim(0, 1), {"target": "local-a", "created_at": 1.0})
    return layout


def stream(layout: StageLayout, max_lines: int = 5, max_bytes: int = 4096) -> DriverLogStream:
    return DriverLogStream(layout, max_lines=max_lines, max_bytes=max_bytes, since=0.0)


def running(state: AttemptState = S.RUNNING) -> Attempt:
    return Attempt(0, 1, "local-a", state, deploying_at=1.0)


def ended() -> Attempt:
    return Attempt(0, 1, "local-a", S.FAILED, deploying_at=1.0, end_at=9.0)


def status(host: Any, **ended: Any) -> dict[str, Any]:
    return {"deploying_at": 1.0, "pid": 999_999_999, "host": host, **ended}


def supervised(layout: StageLayout, host: Any = HOST) -> Path:
    """The attempt's status naming ``host``, and the path of its supervisor's local log on this host."""
    layout.replace_json(layout.status(0, 1), status(host))
    local = local_log(layout, 0, 1)
    local.parent.mkdir(parents=True, exist_ok=True)
    return local


def append(local: Path, data: bytes) -> None:
    with local.open("ab") as out:
        out.write(data)


def upload(layout: StageLayout, data: bytes, host: Any = HOST) -> None:
    """What the supervisor does when the attempt ends: the log uploaded by name, then its end recorded."""
    layout.store.replace(layout.name(layout.log(0, 1)), data)
    layout.replace_json(layout.status(0, 1), status(host, end_at=9.0, exit_code=1, state="FAILED"))


def shown(lines: list[str]) -> list[str]:
    assert all(line.startswith(PREFIX) for line in lines), lines
    return [line[len(PREFIX):] for line in lines]


def status_reads(store: MemoryBackend, layout: StageLayout) -> int:
    return store.ops[("read", layout.name(layout.status(0, 1)))]


def test_a_running_attempt_on_this_host_is_followed_locally_then_in_its_upload(
        store: MemoryBackend, layout: StageLayout) -> None:
    local = supervised(layout)
    logs = stream(layout)
    append(local, b"starting\nhalf a li")
    assert shown(logs.step([running()], 1.0)) == ["starting"]
    assert logs.step([running()], 2.0) == []  # the cut line waits for its end
    append(local, b"ne\nreading 3 files\n")
    assert shown(logs.step([running()], 3.0)) == ["half a line", "reading 3 files"]
    # The host does not change: its status was read once, not once per check.
    assert status_reads(store, layout) == 1
    # The upload is the local file's bytes: it goes on from where the local follow stopped, nothing repeated.
    upload(layout, local.read_bytes() + b"boom: ValueError\nexit 1")
    assert shown(logs.step([ended()], 4.0)) == ["boom: ValueError", "exit 1"]
    assert logs.step([ended()], 5.0) == []
    assert status_reads(store, layout) == 1


def test_the_local_follow_keeps_the_bounds_and_notes_of_a_store_log(layout: StageLayout) -> None:
    local = supervised(layout)
    logs = stream(layout, max_lines=2, max_bytes=64)
    append(local, b"".join(f"line {i:04d}\n".encode() for i in range(1000)))  # 10 bytes a line
    assert shown(logs.step([running()], 1.0)) == ["... 4 lines and 9940 more bytes skipped", "line 0998",
                                                  "line 0999"]
    local.write_bytes(b"restarted\n")
    assert shown(logs.step([running()], 2.0)) == ["... log truncated to 10 bytes: following it from its start",
                                                  "restarted"]


def test_an_upload_shorter_than_what_the_local_file_showed_says_so_and_shows_its_end(layout: StageLayout) -> None:
    local = supervised(layout)
    logs = stream(layout, max_lines=2)
    append(local, b"a\nb\nc\nd\n")
    assert shown(logs.step([running()], 1.0)) == ["... 2 lines skipped", "c", "d"]
    upload(layout, b"x\ny\nz\n")
    assert shown(logs.step([ended()], 3.0)) == [
        "... uploaded log is 6 bytes, fewer than the 8 read from its local file: showing its end",
        "... 1 line skipped", "y", "z"]


def test_without_an_upload_the_local_file_followed_here_gives_the_last_lines(layout: StageLayout) -> None:
    local = supervised(layout)
    logs = stream(layout)
    append(local, b"one\n")
    assert shown(logs.step([running()], 1.0)) == ["one"]
    append(local, b"killed before the upload")  # the supervisor died: no object in the store
    assert shown(logs.step([ended()], 2.0)) == ["killed before the upload"]
    assert logs.step([ended()], 3.0) == []


@pytest.mark.parametrize("host", ["spark-7.example", "evil/../host", "", None, 7])
def test_an_attempt_supervised_elsewhere_shows_nothing_until_it_ends(layout: StageLayout, host: Any) -> None:
    # Even a file at the local path of this host is not read: the attempt does not write it here.
    local = supervised(layout, host)
    append(local, b"not this attempt's log\n")
    logs = stream(layout)
    assert logs.step([running()], 1.0) == []
    assert logs.step([running()], 2.0) == []
    upload(layout, b"first\nlast\n", host)
    assert shown(logs.step([ended()], 3.0)) == ["first", "last"]


def test_an_attempt_without_a_status_yet_is_followed_once_its_status_names_this_host(
        store: MemoryBackend, layout: StageLayout) -> None:
    logs = stream(layout)
    # Claimed, not launched: its status is not even looked for.
    assert logs.step([running(S.CREATED)], 1.0) == [] and status_reads(store, layout) == 0
    assert logs.step([running(S.DEPLOYING)], 2.0) == [] and status_reads(store, layout) == 1
    append(supervised(layout), b"session ready\n")
    assert shown(logs.step([running()], 3.0)) == ["session ready"]
    assert status_reads(store, layout) == 2


@pytest.mark.parametrize("hostile", ["link", "fifo"])
def test_a_local_log_that_is_a_link_or_a_fifo_is_named_once_and_never_opened_again(
        tmp_path: Path, layout: StageLayout, hostile: str) -> None:
    local = supervised(layout)
    secret = tmp_path / "airflow.cfg"
    secret.write_text("fernet_key = s3cr3t\n")
    if hostile == "link":
        local.symlink_to(secret)
    else:
        os.mkfifo(local)
    logs = stream(layout)
    (line,) = shown(logs.step([running()], 1.0))
    assert line.startswith("its log is not shown while it runs (") and "s3cr3t" not in line
    # Made a plain file afterwards, it is still not followed: the refusal holds for the attempt.
    local.unlink()
    local.write_bytes(b"a regular file now\n")
    assert logs.step([running()], 2.0) == []
    # The uploaded copy (the supervisor uploads through the same rules) is shown once the attempt ends.
    upload(layout, b"uploaded line\n")
    assert shown(logs.step([ended()], 3.0)) == ["uploaded line"]
