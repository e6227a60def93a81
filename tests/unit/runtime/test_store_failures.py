"""A full or unwritable store fails the attempt clearly (runtime and supervisor) and never leaves a
manifest or commit behind."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.files import create_exclusive_json, read_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
from airflow_provider_speculative.store.results import write_committed
from tests.unit.control.test_lifecycle import DAG, RUN, Store  # the store builder gc's tests use

# -- full or unwritable store -----------------------------------------------------------------------


def _mount_tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill up needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); the regular-file test covers errors")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "small", "size=64k")


@pytest.fixture
def readonly_store(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "ro", "size=64k,ro")


def fill_with_output(data_dir: Path) -> None:
    """Write attempt output until the device is full (as a large Spark write would)."""
    data_dir.mkdir(parents=True)
    n = 0
    while True:
        try:
            (data_dir / f"part-{n:05d}.parquet").write_bytes(b"x" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            return
        n += 1


def test_full_store_fails_manifest_and_commit_cleanly(small_store: Path) -> None:
    layout = StageLayout(small_store, DAG, RUN, "extract")
    fill_with_output(layout.data(0, 0))
    manifest = build_manifest(layout.data(0, 0), stage="extract", subtask=0, attempt=0)  # reading still works

    with pytest.raises(StoreError, match=rf"store is full: cannot write {layout.manifest(0, 0)}"):
        write_manifest(layout.manifest(0, 0), manifest)
    with pytest.raises(StoreError, match="store is full"):
        write_committed(layout, {"stage": "extract", "subtasks": {}})

    assert not layout.manifest(0, 0).exists() and not layout.committed.exists()
    assert not [p for p in small_store.rglob("*.tmp")], "a failed atomic write left its temporary file"


def test_attempt_on_full_store_is_recorded_failed_with_the_cause(
        small_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.backends import supervisor
    from airflow_provider_speculative.runtime import context as runtime

    store = Store(small_store)
    layout = store.stage("extract")
    assert create_exclusive_json(layout.claim(0, 0), {"target": "local-a", "created_at": time.time()})
    fill_with_output(layout.data(0, 0))
    ctx = runtime.StageContext(read_json(layout.plan), 0, 0, "local-a")
    with pytest.raises(StoreError) as raised:
        write_manifest(layout.manifest(0, 0), build_manifest(layout.data(0, 0)))

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(runtime.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as exited:
        ctx.__exit__(StoreError, raised.value, None)  # what leaving `with StageContext` does

    assert exited.value.code == runtime.EXIT_STORE_FULL
    assert not layout.data(0, 0).exists(), "the unusable partial output should be freed"
    failure = read_json(layout.attempt_dir(0, 0) / "failure.json")
    assert "store is full" in failure["error"] and str(layout.manifest(0, 0)) in failure["error"]

    # The supervisor sees the application exit non-zero and records the cause from failure.json.
    code = supervisor.main(["--status", str(layout.status(0, 0)), "--log", str(layout.log(0, 0)),
                            "--manifest", str(layout.manifest(0, 0)), "--",
                            sys.executable, "-c", f"raise SystemExit({runtime.EXIT_STORE_FULL})"])
    assert code == runtime.EXIT_STORE_FULL
    polled = attempt_observer(layout).poll(0, 0)
    assert polled.state == AttemptState.FAILED
    assert polled.cause is not None and "store is full" in polled.cause and str(layout.manifest(0, 0)) in polled.cause
    assert not layout.manifest(0, 0).exists()


@pytest.mark.parametrize("exit_code, cause", [(4, "store is full"), (5, "store is not writable")])
def test_supervisor_names_the_store_when_no_failure_could_be_recorded(
        tmp_path: Path, exit_code: int, cause: str) -> None:
    # Spark's JVM keeps the space of its aborted files until the attempt exits, so failure.json may
    # not fit; the runtime's exit code is then the only record and must still give a clear cause.
    from airflow_provider_speculative.backends import supervisor
    from airflow_provider_speculative.runtime import context as runtime

    assert {runtime.EXIT_STORE_FULL: "store is full", runtime.EXIT_STORE_NOT_WRITABLE: "store is not writable"} \
        == supervisor.STORE_EXIT_CAUSES
    layout = StageLayout(tmp_path / "store", DAG, RUN, "extract")
    assert create_exclusive_json(layout.claim(0, 0), {"target": "local-a", "created_at": time.time()})
    supervisor.main(["--status", str(layout.status(0, 0)), "--log", str(layout.log(0, 0)),
                     "--manifest", str(layout.manifest(0, 0)), "--",
                     sys.executable, "-c", f"raise SystemExit({exit_code})"])
    polled = attempt_observer(layout).poll(0, 0)
    assert polled.state == AttemptState.FAILED
    assert polled.cause == (f"{cause}: the attempt could not write its output under {layout.attempt_dir(0, 0)} "
                            f"(exit code {exit_code})")


def test_readonly_store_fails_with_not_writable(readonly_store: Path) -> None:
    layout = StageLayout(readonly_store, DAG, RUN, "extract")
    with pytest.raises(StoreError, match=rf"store is not writable: cannot write {layout.manifest(0, 0)}"):
        write_manifest(layout.manifest(0, 0), {"files": []})
    assert not layout.manifest(0, 0).exists()


def test_store_path_under_a_regular_file_fails_naming_the_path(tmp_path: Path) -> None:
    # Runs without mount privileges: any OS error on the store names the path and leaves no manifest.
    (tmp_path / "store").write_text("not a directory")
    layout = StageLayout(tmp_path / "store", DAG, RUN, "extract")
    with pytest.raises(StoreError, match=rf"cannot write {layout.manifest(0, 0)}"):
        write_manifest(layout.manifest(0, 0), {"files": []})
    assert (tmp_path / "store").read_text() == "not a directory"


def test_spark_write_errors_are_reported_as_store_errors(small_store: Path, tmp_path: Path) -> None:
    from airflow_provider_speculative.runtime.context import store_write_error

    data = small_store / "etl" / "run" / "extract" / "subtask=0" / "attempt=0" / "data"

    def spark_failure(path: Path, cause: str) -> Exception:
        # The shape of what PySpark raises (Py4JJavaError text, abbreviated from a real full-disk run).
        return RuntimeError(f"An error occurred while calling o52.parquet.\n: org.apache.spark.SparkException: "
                            f"[TASK_WRITE_FAILED] Task failed while writing rows to file:{path}. SQLSTATE: 58030\n"
                            f"Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: {cause}")

    full = store_write_error(data, spark_failure(data, "No space left on device"))
    assert isinstance(full, StoreError) and str(full) == f"store is full: cannot write {data}: No space left on device"
    denied = store_write_error(data, spark_failure(data, "Permission denied"))
    assert isinstance(denied, StoreError) and str(denied).startswith(f"store is not writable: cannot write {data}")
    # Python-level writers (sinks) raise OSError: classified by errno and the store's own state.
    fill_with_output(small_store / "filler")
    assert "store is full" in str(store_write_error(data, OSError(errno.ENOSPC, "No space left on device")))
    # A full disk elsewhere (Spark's local spill dir) or an unrelated error is not blamed on the store.
    roomy = tmp_path / "roomy" / "data"
    assert store_write_error(roomy, RuntimeError("java.io.IOException: No space left on device")) is None
    assert store_write_error(roomy, RuntimeError("AnalysisException: column x not found")) is None




def test_s3_write_refusals_are_reported_as_store_errors_naming_the_output() -> None:
    from airflow_provider_speculative.exceptions import StoreFullError, StoreNotWritableError
    from airflow_provider_speculative.runtime.context import store_write_error

    url = "s3a://lake/store/etl/run/extract/subtask=0/attempt=0/data"

    def s3a_failure(cause: str, key: str = "store/etl/run/extract/subtask=0/attempt=0/data",
                    java: str = "java.nio.file.AccessDeniedException") -> Exception:
        # The shape of what s3a raises through PySpark (AWS SDK v2), abbreviated.
        return RuntimeError(f"An error occurred while calling o52.parquet.\n: {java}: "
                            f"s3a://lake/{key}/part-00000.parquet: PUT 0-byte object on {key}: "
                            f"software.amazon.awssdk.services.s3.model.S3Exception: {cause}")

    denied = store_write_error(url, s3a_failure("Access Denied (Service: S3, Status Code: 403, Request ID: X)"))
    assert isinstance(denied, StoreNotWritableError)
    assert str(denied) == f"store is not writable: cannot write {url}: access denied (HTTP 403)"
    # Ceph answers an exceeded bucket quota with a 403: a full store, not a permission problem.
    quota = store_write_error(url, s3a_failure("QuotaExceeded (Service: S3, Status Code: 403)"))
    assert isinstance(quota, StoreFullError) and str(quota).startswith("store is full")
    full = store_write_error(url, s3a_failure("XMinioStorageFull (Service: S3, Status Code: 507, Request ID: X)",
                                              java="org.apache.hadoop.fs.s3a.AWSStatus500Exception"))
    assert isinstance(full, StoreFullError) and "quota" in str(full) and "Request ID" not in str(full)
    throttled = store_write_error(url, s3a_failure("Please reduce your request rate. (Service: S3, "
                                                   "Status Code: 503, Error Code: SlowDown)",
                                                   java="org.apache.hadoop.fs.s3a.AWSServiceThrottledException"))
    assert type(throttled) is StoreError and "SlowDown" in str(throttled) and "Java" not in str(throttled)
    # A 403 on another object of the job (a source read inside the write's job) is not blamed on the store.
    assert store_write_error(url, s3a_failure("Access Denied (Status Code: 403)", key="sources/orders")) is None
    assert store_write_error(url, RuntimeError("AnalysisException: column x not found")) is None
