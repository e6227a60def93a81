"""The attempt launcher and its supervisor over a POSIX tmp dir and over an S3 root (the in-memory backend installed).

On S3 the launcher hands the supervisor the store's URL and names (never a credential), keeps the supervisor's log in
a local working directory for the attempt and never a file in the store; the supervisor records its status, change
notices and the end by name and uploads the log by name when the attempt ends. Claims, cancels, reaps and withdrawals
go by name. Every file-system call on a store path is refused on the S3 root (``tests/unit/store/no_store_paths.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.backends import supervised, supervisor
from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.backends.supervised import SupervisedBackend, local_attempt_dir
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store import changes, roots
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import StageLayout, StorePath
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S3_ROOT = "s3://lake/speculative"
SECRET = "wJalrXUtnFEMI-launcher-secret-K7MDENG"
ATTEMPT = "d/r/scan/subtask=0/attempt=0"


@dataclass
class Stage:
    """A planned stage in the store under test."""

    store: StoreBackend
    layout: StageLayout
    on_s3: bool
    refused: list[str]


@pytest.fixture(params=["posix", "s3"])
def stage(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stage]:
    roots.forget_stores()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    on_s3 = request.param == "s3"
    if on_s3:
        roots.install_store(MemoryBackend(S3_ROOT))
    plan = stage_plan(S3_ROOT if on_s3 else str(tmp_path / "store"))
    layout = StageLayout.of_plan(plan)
    layout.claim_run()
    layout.replace_json(layout.plan, plan)
    refused = refuse_store_paths(monkeypatch, S3_ROOT) if on_s3 else []
    yield Stage(layout.store, layout, on_s3, refused)
    roots.forget_stores()


def test_the_supervisor_records_its_attempt_by_name_and_uploads_its_log(
        stage: Stage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # in-process: leave pytest's handlers alone
    layout = stage.layout
    assert layout.create_json(layout.claim(0, 0), {"target": "local-a", "created_at": 1.0})
    layout.replace_json(layout.manifest(0, 0), {"files": []})  # what the attempt writes last
    names = [layout.name(layout.status(0, 0)), layout.name(layout.manifest(0, 0))]
    if stage.on_s3:
        log = local_attempt_dir(layout, 0, 0) / "spark-submit.log"
        log.parent.mkdir(parents=True)
        where = ["--store", S3_ROOT, "--status", names[0], "--manifest", names[1], "--log", str(log),
                 "--log-name", layout.name(layout.log(0, 0))]
    else:
        log = Path(os.fspath(layout.log(0, 0)))
        where = ["--status", os.fspath(layout.status(0, 0)), "--manifest", os.fspath(layout.manifest(0, 0)),
                 "--log", str(log)]
    code = supervisor.main([*where, "--", sys.executable, "-c", "print('attempt says hello')"])

    assert code == 0
    status = stage.store.read_json(f"{ATTEMPT}/status.json")
    assert status["state"] == "FINISHED" and status["exit_code"] == 0 and status["pid"] == os.getpid()
    # The start and the end left change notices, by name.
    assert set(changes.listed(stage.store, "d/r/scan").values()) == {(0, 0)}
    assert len(changes.listed(stage.store, "d/r/scan")) >= 2
    # The log: in the attempt's directory on POSIX; on S3 written locally, uploaded by name at the end.
    assert b"attempt says hello" in (stage.store.read(f"{ATTEMPT}/spark-submit.log") or b"")
    assert b"attempt says hello" in log.read_bytes()
    assert _free_of(stage.store, SECRET)
    assert stage.refused == []


def _free_of(store: StoreBackend, secret: str) -> bool:
    """True if no object of ``store`` holds ``secret``."""
    return all(secret.encode() not in (store.read(name) or b"") for name in store.list_names(""))


def test_a_failed_attempt_without_its_failure_record_names_its_directory(stage: Stage,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    layout = stage.layout
    if stage.on_s3:
        log = local_attempt_dir(layout, 0, 0) / "spark-submit.log"
        log.parent.mkdir(parents=True)
        where = ["--store", S3_ROOT, "--status", layout.name(layout.status(0, 0)), "--manifest",
                 layout.name(layout.manifest(0, 0)), "--log", str(log), "--log-name", layout.name(layout.log(0, 0))]
    else:
        where = ["--status", os.fspath(layout.status(0, 0)), "--manifest", os.fspath(layout.manifest(0, 0)),
                 "--log", os.fspath(layout.log(0, 0))]
    layout.replace_json(layout.failure(0, 0), {"error": "ValueError: bad row", "kind": "partition"})
    assert supervisor.main([*where, "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    status = stage.store.read_json(f"{ATTEMPT}/status.json")
    assert status["state"] == "FAILED" and status["cause"] == "ValueError: bad row"
    assert status["failure_kind"] == "partition"
    assert stage.refused == []


def test_the_launcher_hands_names_and_a_local_log_to_the_supervisor(stage: Stage,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    layout = stage.layout
    backend = SupervisedBackend(layout)
    calls: list[list[str]] = []

    def start(argv: list[str], **kwargs: Any) -> int:
        """The supervisor's start as the launcher sees it: it records itself, then the launcher returns."""
        calls.append(argv)
        layout.replace_json(layout.status(0, 0), {"state": "DEPLOYING", "pid": 999_999_999, "pgid": 999_999_999,
                                                  "deploying_at": 1.0, "host": "elsewhere", "alive_at": 1.0})
        return 0

    monkeypatch.setattr(supervised.subprocess, "call", start)
    assert backend.claim(0, 0, {"target": "local-a", "created_at": 1.0})
    assert not backend.claim(0, 0, {"target": "local-b", "created_at": 2.0})
    backend.launch(LaunchSpec(0, 0, "local-a", "node-a", False, ["app.py", "--plan", str(layout.plan)], {}))

    argv = calls[0]
    assert SECRET not in " ".join(argv)
    log = argv[argv.index("--log") + 1]
    if stage.on_s3:
        assert argv[argv.index("--store") + 1] == S3_ROOT
        assert argv[argv.index("--status") + 1] == f"{ATTEMPT}/status.json"
        assert argv[argv.index("--manifest") + 1] == f"{ATTEMPT}/_SUCCESS"
        assert argv[argv.index("--log-name") + 1] == f"{ATTEMPT}/spark-submit.log"
        # A local working directory keyed by the store and the attempt, under $AIRFLOW_HOME; nothing of it in the store.
        assert log == str(local_attempt_dir(layout, 0, 0) / "spark-submit.log")
        assert log.startswith(os.environ["AIRFLOW_HOME"]) and Path(log).exists()
        assert argv[argv.index("--plan") + 1] == f"{S3_ROOT}/d/r/scan/plan.json"
        assert isinstance(layout.log(0, 0), StorePath)
    else:
        assert "--store" not in argv and log == os.fspath(layout.log(0, 0))
        assert argv[argv.index("--status") + 1] == os.fspath(layout.status(0, 0))


def test_cancel_reap_and_withdrawal_go_by_name(stage: Stage) -> None:
    layout = stage.layout
    backend = SupervisedBackend(layout)
    assert backend.claim(0, 0, {"target": "local-a", "created_at": 1.0})
    # A supervisor on another host: asked through the store, never signalled from here.
    layout.replace_json(layout.status(0, 0), {"state": "DEPLOYING", "pid": 999_999_999, "pgid": 999_999_999,
                                              "deploying_at": 1.0, "host": "elsewhere", "alive_at": 1.0})
    backend.cancel(0, 0, "a faster copy won")
    assert stage.store.read_json(f"{ATTEMPT}/cancel.json")["reason"] == "a faster copy won"
    assert set(changes.listed(stage.store, "d/r/scan").values()) == {(0, 0)}
    assert backend.reap(0, 0) is True  # its alive_at is long past: presumed gone
    assert backend.poll(0, 0).state == AttemptState.CANCELED
    layout.create_json(layout.admitted(0), {"attempt": 0})
    backend.invalidate(0, 0, "rerun")
    assert not stage.store.exists("d/r/scan/subtask=0/admitted.json")
    assert stage.store.read_json(f"{ATTEMPT}/invalidated.json")["reason"] == "rerun"
    assert stage.refused == []


def test_the_local_working_directory_is_keyed_by_store_and_attempt(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    one = StageLayout.over(MemoryBackend("s3://lake/one"), "d", "r", "scan")
    two = StageLayout.over(MemoryBackend("s3://lake/two"), "d", "r", "scan")
    assert local_attempt_dir(one, 0, 1) != local_attempt_dir(two, 0, 1) != local_attempt_dir(one, 1, 1)
    assert local_attempt_dir(one, 0, 1).is_relative_to(tmp_path / "speculative-local")
    assert local_attempt_dir(one, 0, 1).parts[-5:] == ("d", "r", "scan", "subtask=0", "attempt=1")
    monkeypatch.delenv("AIRFLOW_HOME")
    assert not local_attempt_dir(one, 0, 1).is_relative_to(tmp_path)


class _Child:
    """A child process double: still running for ``polls`` checks, then exited with 0."""

    pid = 4242

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def wait(self, timeout: float | None = None) -> int:
        if self.polls > 0:
            self.polls -= 1
            raise supervisor.subprocess.TimeoutExpired("child", timeout or 0)
        return 0


class _FlakyStore(MemoryBackend):
    """An S3 root whose first look for a cancel fails as a throttled request would."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.looks = 0

    def exists(self, name: str) -> bool:
        self.looks += 1
        if self.looks == 1:
            raise StoreError(f"cannot stat {name}: SlowDown")
        return super().exists(name)


def test_a_passing_store_error_while_the_attempt_runs_is_asked_again_not_fatal() -> None:
    store = _FlakyStore(S3_ROOT)
    docs = supervisor.AttemptDocuments(f"{ATTEMPT}/status.json", f"{ATTEMPT}/_SUCCESS", store)
    status: dict[str, object] = {"alive_at": 1e18}  # no refresh due: only the cancel is looked for
    cancelled: dict[str, int | None] = {"signal": None}
    assert supervisor._wait(_Child(polls=2), docs, status, cancelled) == 0
    assert store.looks == 2 and cancelled["signal"] is None


class _RoundTripStore(MemoryBackend):
    """A store read in parallel, as S3 is: each read waits until ``together`` reads are in flight at once."""

    parallel_reads = 16

    def __init__(self, url: str, together: int) -> None:
        super().__init__(url)
        self.barrier = threading.Barrier(together, timeout=5)
        self.armed = False
        self.read_names: list[str] = []

    def read_json(self, name: str) -> Any:
        """Wait for the others while armed (a broken barrier means the reads came one after the other)."""
        self.read_names.append(name.rsplit("/", 1)[-1])
        if self.armed and not name.endswith("invalidated.json"):
            self.barrier.wait()
        return super().read_json(name)


def test_a_poll_on_an_object_store_reads_the_attempts_documents_together_and_the_withdrawal_last() -> None:
    roots.forget_stores()
    store = _RoundTripStore(S3_ROOT, together=4)
    roots.install_store(store)
    try:
        layout = StageLayout.of_plan(stage_plan(S3_ROOT))
        backend = SupervisedBackend(layout)
        assert backend.claim(0, 0, {"target": "local-a", "created_at": 1.0})
        layout.replace_json(layout.status(0, 0), {"state": "FINISHED", "end_at": 2.0, "exit_code": 0})
        store.armed = True
        store.read_names.clear()
        assert backend.poll(0, 0).state == AttemptState.FINISHED
        assert set(store.read_names[:4]) == {"claim.json", "status.json", "heartbeat.json", "cancel.json"}
        assert store.read_names[4:] == ["invalidated.json"]
    finally:
        roots.forget_stores()
