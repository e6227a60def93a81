"""ParquetSink on S3: a version prefix per commit, published by ``_CURRENT``; owned deletes; crash-safe retries.

Most cases run on the in-memory backend (objects by name, no rename, nothing else), the sink's bucket
standing in for S3; the last ones on moto's in-process S3 (``mock_aws``) with the real S3Backend.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.exceptions import PipelineError, PlanError, StoreError
from airflow_provider_speculative.sinks import parquet_s3
from airflow_provider_speculative.sinks.base import (
    AttemptResult,
    FinalizationContext,
    InitializationContext,
    PlanContext,
    StagingScope,
)
from airflow_provider_speculative.sinks.parquet import ParquetSink, published_files
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend, StoreBackend
from airflow_provider_speculative.store.manifest import build_manifest
from tests.unit.store.memory import MemoryBackend

URL = "s3://lake/out/ds=2026-01-01"
KEY = "out/ds=2026-01-01"


class Crash(BaseException):
    """The finalizing process dies here (not an error finalize could handle)."""


class Bucket(MemoryBackend):
    """The sink's bucket in memory; ``crash(op, name)`` True makes that write die before it happens."""

    def __init__(self, objects: dict[str, bytes] | None = None, infos: dict[str, Any] | None = None) -> None:
        super().__init__()
        if objects is not None:
            self.objects, self.infos = objects, infos if infos is not None else {}
        self.crash: Callable[[str, str], bool] = lambda op, name: False

    def _create_exclusive(self, name: str, data: bytes) -> bool:
        if self.crash("create", name):
            raise Crash(name)
        return super()._create_exclusive(name, data)

    def _replace(self, name: str, data: bytes) -> None:
        if self.crash("replace", name):
            raise Crash(name)
        super()._replace(name, data)

    def _delete(self, name: str) -> bool:
        if self.crash("delete", name):
            raise Crash(name)
        return super()._delete(name)


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """One bucket; every backend the sink opens on it shares its objects, with the owner the sink asks for."""
    shared = Bucket()

    def open_backend(location: Any, owner: str, credentials: Any) -> StoreBackend:
        assert location.bucket == "lake"
        view = Bucket(shared.objects, shared.infos)
        view.lock, view.crash, view._owner = shared.lock, lambda op, name: shared.crash(op, name), owner
        return view

    monkeypatch.setattr(parquet_s3, "open_sink_backend", open_backend)
    return shared


def parquet_bytes(ids: list[int], attempt: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "attempt": pa.array([attempt] * len(ids))}), out)
    return out.getvalue()


def attempt_output(store: MemoryBackend, run: str, subtask: int, attempt: int, *chunks: list[int],
                   write_id: str | None = None) -> AttemptResult:
    """Attempt output in the result store (by name), described as its manifest describes it."""
    import hashlib

    data = f"dag/{run}/write/subtask={subtask}/attempt={attempt}/data"
    files = []
    for n, ids in enumerate(chunks):
        body = parquet_bytes(ids, attempt)
        store.replace(f"{data}/part-{n}.parquet", body)
        files.append({"path": f"part-{n}.parquet", "size": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                      "records": len(ids)})
    return AttemptResult(subtask=subtask, attempt=attempt, data_dir=Path("/nonexistent"), files=files,
                         sink_info={"write_id": write_id or f"{run}-{subtask}-{attempt}"}, data_name=data)


def context(store: MemoryBackend, *results: AttemptResult, run: str = "run1", dag: str = "dag",
            stage: str = "write") -> FinalizationContext:
    return FinalizationContext(parallelism=len(results), attempts={r.subtask: r for r in results}, dag_id=dag,
                               run_id=run, stage=stage, logical_date="2026-01-01", store=store,
                               extra={"pipeline": "orders"})


def published_ids(bucket: MemoryBackend) -> list[int]:
    """What a reader following ``_CURRENT`` reads, whole files only."""
    ids: list[int] = []
    for url in parquet_s3.published_files(URL, store=bucket):
        body = bucket.read(url[len("s3://lake/"):])
        assert body is not None, url
        ids += pq.read_table(io.BytesIO(body)).column("id").to_pylist()
    return sorted(ids)


def pointer(bucket: MemoryBackend) -> dict[str, Any]:
    data = bucket.read(f"{KEY}/_CURRENT")
    assert data is not None
    found: dict[str, Any] = json.loads(data)
    return found


def versions(bucket: MemoryBackend) -> list[str]:
    return sorted({n.split("/")[2] for n in bucket.objects if n.startswith(f"{KEY}/_v=")})


def first_commit(bucket: Bucket, store: MemoryBackend) -> dict[str, Any]:
    return ParquetSink(URL).finalize_global(context(store, attempt_output(store, "run1", 0, 0, [1, 2], [3]),
                                                    attempt_output(store, "run1", 1, 2, [4])))


def rerun(store: MemoryBackend) -> FinalizationContext:
    return context(store, attempt_output(store, "run2", 0, 1, [10]), attempt_output(store, "run2", 1, 0, [20], [30]),
                   run="run2")

def crashed_finalize(bucket: Bucket, point: str, ctx: FinalizationContext) -> None:
    """Run finalize until it dies at ``point`` (a crash, nothing caught), then let the bucket work again."""
    bucket.crash = CRASH_POINTS[point]
    with pytest.raises(Crash):
        ParquetSink(URL).finalize_global(ctx)
    bucket.crash = lambda op, name: False



def test_finalize_copies_the_admitted_files_into_a_version_and_points_current_at_it(bucket: Bucket) -> None:
    store = MemoryBackend()
    attempt_output(store, "run1", 0, 1, [999])  # a loser: never published
    summary = first_commit(bucket, store)

    current = pointer(bucket)
    version = current["version"]
    assert version.startswith("_v=") and versions(bucket) == [version]
    assert [(f["path"], f["subtask"], f["attempt"]) for f in current["files"]] == [
        (f"{version}/part-00000-000.parquet", 0, 0), (f"{version}/part-00000-001.parquet", 0, 0),
        (f"{version}/part-00001-000.parquet", 1, 2)]
    assert (current["dag_id"], current["run_id"], current["stage"], current["records"]) == ("dag", "run1", "write", 4)
    assert all(bucket.objects[f"{KEY}/{f['path']}"] and f["sha256"] for f in current["files"])
    assert sorted(n[len(KEY) + 1:] for n in bucket.objects if not n.startswith(f"{KEY}/_v=")) == [
        "_CURRENT", "_owner.json"]
    assert published_ids(bucket) == [1, 2, 3, 4]
    assert summary["path"] == URL and summary["files"] == 3 and summary["version"] == version


def test_a_rerun_publishes_a_new_version_and_deletes_the_old_one_after_the_pointer(bucket: Bucket) -> None:
    store = MemoryBackend()
    first_commit(bucket, store)
    old = pointer(bucket)["version"]
    order: list[str] = []
    bucket.crash = lambda op, name: order.append(f"{op} {name.rsplit('/', 2)[-2] if '_v=' in name else name}") or False

    ParquetSink(URL).finalize_global(rerun(store))

    current = pointer(bucket)
    assert current["version"] != old and versions(bucket) == [current["version"]]
    assert published_ids(bucket) == [10, 20, 30]
    assert current["retired"] == [{"version": old, "run_id": "run1", "files": [
        f"{old}/part-00000-000.parquet", f"{old}/part-00000-001.parquet", f"{old}/part-00001-000.parquet"]}]
    pointer_at = order.index(f"replace {KEY}/_CURRENT")
    assert [o for o in order if o.startswith("delete")] == [f"delete {old}"] * 3
    assert all(order.index(o) > pointer_at for o in order if o.startswith("delete"))


def test_a_repeated_commit_rewrites_the_same_version_and_deletes_nothing_published(bucket: Bucket) -> None:
    store = MemoryBackend()
    ctx = context(store, attempt_output(store, "run1", 0, 0, [1]), attempt_output(store, "run1", 1, 0, [2]))
    ParquetSink(URL).finalize_global(ctx)
    before = dict(bucket.objects)
    ParquetSink(URL).finalize_global(ctx)

    assert sorted(bucket.objects) == sorted(before)
    assert pointer(bucket)["retired"] == [] and published_ids(bucket) == [1, 2]


def test_an_identical_rerun_still_publishes_a_version_of_its_own(bucket: Bucket) -> None:
    store = MemoryBackend()
    ParquetSink(URL).finalize_global(context(store, attempt_output(store, "run1", 0, 0, [1], write_id="a")))
    first = pointer(bucket)["version"]
    ParquetSink(URL).finalize_global(context(store, attempt_output(store, "run1", 0, 0, [1], write_id="b")))
    assert pointer(bucket)["version"] != first and versions(bucket) == [pointer(bucket)["version"]]


# Every write finalize makes, in order: the claim, each copy, the pointer, each delete of the old version.
CRASH_POINTS = {
    "claim": lambda op, name: op == "create" and name.endswith("/_owner.json"),
    "first copy": lambda op, name: op == "replace" and name.endswith("part-00000-000.parquet"),
    "last copy": lambda op, name: op == "replace" and name.endswith("part-00001-001.parquet"),
    "pointer": lambda op, name: op == "replace" and name.endswith("/_CURRENT"),
    "first delete": lambda op, name: op == "delete",
}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_a_crash_at_any_step_leaves_a_whole_version_published_and_a_retry_finishes(bucket: Bucket,
                                                                                   point: str) -> None:
    store = MemoryBackend()
    first_commit(bucket, store)
    old = pointer(bucket)
    ctx = rerun(store)
    bucket.crash = CRASH_POINTS[point]

    with pytest.raises(Crash):
        ParquetSink(URL).finalize_global(ctx)

    # Readers see the old version whole until the pointer is written, then the new one whole.
    published_now = pointer(bucket)
    assert published_ids(bucket) == ([10, 20, 30] if point == "first delete" else [1, 2, 3, 4])
    assert published_now["version"] == (old["version"] if point != "first delete" else published_now["version"])
    assert all(f"{KEY}/{f['path']}" in bucket.objects for f in published_now["files"])

    bucket.crash = lambda op, name: False
    ParquetSink(URL).finalize_global(ctx)

    current = pointer(bucket)
    assert published_ids(bucket) == [10, 20, 30]
    assert versions(bucket) == [current["version"]]  # the old version is gone, no second new one
    assert sorted(n for n in bucket.objects if not n.startswith(f"{KEY}/_v=")) == [
        f"{KEY}/_CURRENT", f"{KEY}/_owner.json"]


@pytest.mark.parametrize("point", ["claim", "first copy", "pointer"])
def test_a_crash_during_the_first_commit_publishes_nothing_until_the_retry(bucket: Bucket, point: str) -> None:
    store = MemoryBackend()
    ctx = rerun(store)
    bucket.crash = CRASH_POINTS[point]
    with pytest.raises(Crash):
        ParquetSink(URL).finalize_global(ctx)
    with pytest.raises(StoreError, match="nothing was published"):
        parquet_s3.published_files(URL, store=bucket)

    bucket.crash = lambda op, name: False
    ParquetSink(URL).finalize_global(ctx)
    assert published_ids(bucket) == [10, 20, 30]


def test_old_versions_whose_deletes_were_interrupted_go_with_the_next_commit(bucket: Bucket) -> None:
    store = MemoryBackend()
    first_commit(bucket, store)
    first = pointer(bucket)["version"]
    crashed_finalize(bucket, "first delete", rerun(store))

    # Not a retry: a third run. The version the interrupted commit retired is still named, and deleted now.
    third = context(store, attempt_output(store, "run3", 0, 0, [7]), run="run3")
    ParquetSink(URL).finalize_global(third)

    assert first not in versions(bucket) and versions(bucket) == [pointer(bucket)["version"]]
    assert published_ids(bucket) == [7]


def test_a_refused_delete_of_a_retired_version_keeps_it_named_and_the_commit_stands(bucket: Bucket) -> None:
    store = MemoryBackend()
    first_commit(bucket, store)
    old = pointer(bucket)["version"]
    # Someone else's marker below the sink's prefix: the owned delete refuses, and nothing of it goes.
    bucket.objects[f"{KEY}/{old}/_owner.json"] = json.dumps({"owner": "another", "prefix": f"{KEY}/{old}"}).encode()

    summary = ParquetSink(URL).finalize_global(rerun(store))

    assert published_ids(bucket) == [10, 20, 30]
    assert summary["deleted"] == 0 and "owned by another store" in summary["kept"]
    assert old in versions(bucket) and [r["version"] for r in pointer(bucket)["retired"]] == [old]


@pytest.mark.parametrize(("setup", "problem"), [
    (lambda b: b.replace(f"{KEY}/report.csv", b"x"), r"holds 1 entries the sink did not write \(e.g. 'report.csv'\)"),
    (lambda b: b.replace(f"{KEY}/_CURRENT", json.dumps({"sink": "ParquetSink", "dag_id": "other", "stage": "s",
                                                         "files": []}).encode()),
     r"published by DAG 'other', stage 's'"),
    (lambda b: b.replace(f"{KEY}/_CURRENT", b"not json"), r"not a ParquetSink pointer"),
    (lambda b: b.objects.update({f"{KEY}/_owner.json": json.dumps({"owner": "someone", "prefix": KEY}).encode()}),
     r"claimed by 'someone'"),
    (lambda b: b.replace(f"{KEY}/_v=0123456789ab-0123456789abcdef/part-00000-000.parquet", b"x"),
     r"version prefixes .* but no ownership marker"),
    (lambda b: b.replace("out/_CURRENT", json.dumps({"sink": "ParquetSink", "dag_id": "up", "stage": "s",
                                                      "files": []}).encode()),
     r"lies inside s3://lake/out, the published output of DAG 'up'"),
])
def test_anything_foreign_at_the_prefix_fails_the_commit_with_nothing_touched(
        bucket: Bucket, setup: Callable[[Bucket], Any], problem: str) -> None:
    store = MemoryBackend()
    setup(bucket)
    before = dict(bucket.objects)
    expected = rf"pipeline 'orders', stage 'write'.*{URL}: it.*{problem}.*nothing was written"
    with pytest.raises(StoreError, match=expected):
        ParquetSink(URL).finalize_global(context(store, attempt_output(store, "run1", 0, 0, [1])))
    assert bucket.objects == before


def test_two_stages_racing_for_one_empty_prefix_cannot_both_publish(bucket: Bucket) -> None:
    store = MemoryBackend()
    # Stage a claims the prefix and dies before its pointer; stage b then finds a marker that is not its own.
    crashed_finalize(bucket, "pointer", context(store, attempt_output(store, "run1", 0, 0, [1]), stage="a"))
    before = dict(bucket.objects)
    with pytest.raises(StoreError, match=r"stage 'b'.*claimed by .*\"a\""):
        ParquetSink(URL).finalize_global(context(store, attempt_output(store, "run1", 0, 1, [2]), stage="b"))
    assert bucket.objects == before


def test_clean_up_removes_only_this_runs_unpublished_part_files(bucket: Bucket) -> None:
    store = MemoryBackend()
    first_commit(bucket, store)
    published = pointer(bucket)["version"]
    crashed_finalize(bucket, "last copy", rerun(store))
    orphan = next(v for v in versions(bucket) if v != published)
    bucket.replace(f"{KEY}/{orphan}/notes.txt", b"someone else's")
    sink = ParquetSink(URL)

    assert sink.staging(StagingScope("dag", "run1", "write")) == []  # another run's: not this scope's
    assert sink.cleanup_staging(StagingScope("dag", "run2", "write", attempts=((0, 0),))) == []  # losers: store
    found = sink.staging(StagingScope("dag", "run2", "write"))
    assert [o.name for o in found] == [f"{URL}/{orphan}"] and found[0].bytes > 0

    assert sink.cleanup_staging(StagingScope("dag", "run2", "write")) == [f"{URL}/{orphan}"]
    assert sorted(n for n in bucket.objects if orphan in n) == [f"{KEY}/{orphan}/notes.txt"]
    assert published_ids(bucket) == [1, 2, 3, 4]


def test_parse_time_checks_of_an_s3_path_need_no_io() -> None:
    for good in ("s3://lake/out/{{ ds }}", "s3a://lake/out/q1", "s3://lake/{{ var.value.prefix }}/q1"):
        ParquetSink(good).validate("pipeline 'p', stage 's'")
    for bad, message in (("s3://lake", "names a whole bucket"), ("s3://Lake/x", "not an S3 bucket name"),
                         ("s3://key:secret@lake/x", r"s3://\*\*\*@lake/x.*credentials"),
                         ("s3://lake/a/../b", r"'\.' or '\.\.' segments"), ("gs://lake/x", "scheme 'gs://'"),
                         ("s3://lake/x?v=1", "query"), ("s3://lake/x//y", "empty segment")):
        with pytest.raises(PipelineError, match=message) as caught:
            ParquetSink(bad).validate("pipeline 'p', stage 's'")
        assert "secret" not in str(caught.value)


def test_asset_and_lineage_uris_of_an_s3_sink() -> None:
    assert ParquetSink("s3://lake/out/q1/{{ ds }}").asset_uri() == "s3://lake/out/q1"
    assert ParquetSink("s3a://lake/out/q1").lineage_uri() == "s3://lake/out/q1"
    assert ParquetSink("s3://key:secret@lake/out").asset_uri() is None
    assert ParquetSink("s3://lake/{{ var.value.prefix }}/q1").asset_uri() is None


def test_two_stages_sinking_to_one_s3_prefix_or_one_inside_the_other_clash() -> None:
    from airflow_provider_speculative.sinks.parquet import clashing_sink_paths

    same = clashing_sink_paths({"a": ParquetSink("s3://lake/out/{{ ds }}"),
                                "b": ParquetSink("s3a://lake/out/{{ ds }}/")})
    assert same == ("stages 'a' and 'b' both sink to 's3://lake/out/{{ ds }}'; each commit would replace the "
                    "other's output")
    nested = clashing_sink_paths({"a": ParquetSink("s3://lake/out"), "b": ParquetSink("s3://lake/out/q1")})
    assert nested is not None and "inside the sink path 's3://lake/out' of stage 'a'" in nested
    assert clashing_sink_paths({"a": ParquetSink("s3://lake/out"), "b": ParquetSink("s3://lake/output")}) is None


def test_a_template_rendered_empty_is_refused_at_plan(tmp_path: Path) -> None:
    plan = PlanContext(dag_id="dag", run_id="r", stage="s", where="pipeline 'p', stage 's'", store_root=tmp_path,
                       declared={"path": "s3://lake/out/{{ params.day }}"})
    with pytest.raises(PlanError, match="a template rendered empty"):
        ParquetSink("s3://lake/out/").validate_plan(plan)
    ParquetSink("s3://lake/out/2026-01-01").validate_plan(plan)


class _FakeWriter:
    def __init__(self) -> None:
        self.paths: list[str] = []

    def parquet(self, path: str) -> None:
        self.paths.append(path)


class _FakeFrame:
    def __init__(self) -> None:
        self.write = _FakeWriter()

    def coalesce(self, n: int) -> _FakeFrame:
        return self


def test_writers_write_to_the_stores_url_and_an_s3_sinks_output_carries_a_write_id(tmp_path: Path) -> None:
    init = InitializationContext(task_number=0, num_tasks=1, attempt_number=0, dag_id="d", run_id="r", stage="s",
                                 data_dir=tmp_path / "data", data_url="s3a://store/r/s/data")
    posix_init = InitializationContext(task_number=0, num_tasks=1, attempt_number=0, dag_id="d", run_id="r",
                                       stage="s", data_dir=tmp_path / "data")
    frame, posix_frame = _FakeFrame(), _FakeFrame()
    info = ParquetSink(URL).create_writer(init).write(frame)
    assert ParquetSink(str(tmp_path / "out")).create_writer(posix_init).write(posix_frame) == {}
    assert frame.write.paths == ["s3a://store/r/s/data"] and posix_frame.write.paths == [str(tmp_path / "data")]
    assert len(info["write_id"]) == 32 and info != ParquetSink(URL).create_writer(init).write(_FakeFrame())


def test_published_files_of_a_local_sink_are_the_files_its_manifest_names(tmp_path: Path) -> None:
    data = tmp_path / "attempt"
    data.mkdir()
    pq.write_table(pa.table({"id": [1]}), data / "part-0.parquet")
    final = tmp_path / "out"
    ParquetSink(str(final)).finalize_global(FinalizationContext(
        parallelism=1, dag_id="d", run_id="r", stage="s",
        attempts={0: AttemptResult(0, 0, data, build_manifest(data)["files"])}))
    (final / "stray.parquet").write_bytes(b"x")  # put there by hand: not published
    assert published_files(str(final)) == [str(final / "part-00000-000.parquet")]
    with pytest.raises(StoreError, match="nothing was published"):
        published_files(str(tmp_path))
    (data / "_SUCCESS").write_bytes(b"")  # what plain Spark leaves: not a sink's manifest
    with pytest.raises(StoreError, match="nothing was published"):
        published_files(str(data))


# -- on moto's S3 -----------------------------------------------------------------------------------------


def test_on_s3_a_store_on_s3_is_copied_server_side_and_readers_follow_the_pointer(s3: list[str]) -> None:
    store = S3Backend("s3://store/root", client=boto3.client("s3", region_name="us-east-1"))
    ParquetSink(URL).finalize_global(context(store, attempt_output(store, "run1", 0, 0, [1, 2]),  # type: ignore[arg-type]
                                             attempt_output(store, "run1", 1, 0, [3])))  # type: ignore[arg-type]
    ParquetSink(URL).finalize_global(rerun(store))  # type: ignore[arg-type]

    assert s3.count("CopyObject") == 5 and "PutObject" in s3  # five files copied; the marker and pointers put
    sink = S3Backend("s3://lake", client=boto3.client("s3", region_name="us-east-1"))
    files = parquet_s3.published_files(URL, store=sink)
    assert len(files) == 3 and all(f.startswith(f"{URL}/_v=") for f in files)
    ids = [i for f in files for i in pq.read_table(io.BytesIO(sink.read(f[len("s3://lake/"):]) or b""))
           .column("id").to_pylist()]
    assert sorted(ids) == [10, 20, 30]
    # A plain listing of the prefix would have seen more: only the published version is left, plus the pointer.
    assert sorted(n.rsplit("/", 1)[-1] for n in sink.list_names(KEY)) == sorted(
        ["_CURRENT", "_owner.json", *(f.rsplit("/", 1)[-1] for f in files)])


def test_on_s3_attempt_files_on_a_local_store_are_uploaded(s3: list[str], tmp_path: Path) -> None:
    data = tmp_path / "subtask=0" / "attempt=0" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.table({"id": [5, 6]}), data / "part-0.parquet")
    result = AttemptResult(0, 0, data, build_manifest(data)["files"])
    summary = ParquetSink(URL).finalize_global(FinalizationContext(1, {0: result}, "dag", "run", "write"))

    assert "CopyObject" not in s3 and summary["files"] == 1
    sink = S3Backend("s3://lake", client=boto3.client("s3", region_name="us-east-1"))
    [url] = parquet_s3.published_files(URL, store=sink)
    assert sink.read(url[len("s3://lake/"):]) == (data / "part-0.parquet").read_bytes()
    assert PosixBackend(tmp_path).exists("subtask=0/attempt=0/data/part-0.parquet")  # the store keeps its own
