"""ParquetSink publishing attempt output whose manifests carry the store's ETag instead of SHA-256."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import replace
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.exceptions import PartitionError, StoreError
from airflow_provider_speculative.sinks import parquet_s3
from airflow_provider_speculative.sinks.base import AttemptResult, FinalizationContext
from airflow_provider_speculative.sinks.parquet import ParquetSink
from airflow_provider_speculative.store.backend import S3Backend, StoreBackend
from airflow_provider_speculative.store.manifest import build_manifest_in
from tests.unit.store.memory import MemoryBackend

URL = "s3://lake/out"


def _parquet(ids: list[int]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), out)
    return out.getvalue()


def _attempt(store: StoreBackend, subtask: int, *chunks: list[int]) -> AttemptResult:
    """One attempt's output in ``store``, described by the manifest the store builds (ETags on S3)."""
    data = f"dag/run/write/subtask={subtask}/attempt=0/data"
    for n, ids in enumerate(chunks):
        store.replace(f"{data}/part-{n}.parquet", _parquet(ids))
    files = build_manifest_in(store, data)["files"]
    assert files and all("etag" in f and "sha256" not in f for f in files)
    return AttemptResult(subtask=subtask, attempt=0, data_dir=Path("/nonexistent"), files=files,
                         sink_info={"write_id": f"w{subtask}"}, data_name=data)


def _context(store: StoreBackend, *results: AttemptResult) -> FinalizationContext:
    return FinalizationContext(parallelism=len(results), attempts={r.subtask: r for r in results}, dag_id="dag",
                               run_id="run", stage="write", logical_date="2026-01-01", store=store)


def _ids(final: Path) -> list[int]:
    return sorted(i for p in final.glob("part-*.parquet") for i in pq.read_table(p).column("id").to_pylist())


def test_a_local_sink_stages_etag_files_checking_the_md5_of_what_it_downloads(tmp_path: Path) -> None:
    store = MemoryBackend("s3://bucket/store", content_token="etag")
    final = tmp_path / "out"
    ParquetSink(str(final)).finalize_global(_context(store, _attempt(store, 0, [1, 2], [3]), _attempt(store, 1, [4])))
    assert _ids(final) == [1, 2, 3, 4]
    manifest = json.loads((final / "_SUCCESS").read_bytes())
    for entry in manifest["files"]:
        assert entry["checked"] == "md5"
        assert entry["sha256"] == hashlib.sha256((final / entry["path"]).read_bytes()).hexdigest()


def test_a_local_sink_refuses_a_replaced_file_and_checks_a_multipart_etag_by_the_store(tmp_path: Path) -> None:
    store = MemoryBackend("s3://bucket/store", content_token="etag")
    result = _attempt(store, 0, [1, 2])
    name = f"{result.data_name}/part-0.parquet"
    body = store.objects[name]
    store.objects[name] = body[:-1] + bytes([body[-1] ^ 1])  # same size, other bytes
    with pytest.raises(StoreError, match=r"cannot stage .*part-0.parquet: checksum mismatch"):
        ParquetSink(str(tmp_path / "a")).finalize_global(_context(store, result))

    # A multipart ETag cannot be recomputed from the bytes: the store's ETag and the size are what is checked.
    store.replace(name, body)
    multipart = "0123456789abcdef0123456789abcdef-2"
    store.infos[name] = replace(store.infos[name], etag=f'"{multipart}"')
    result.files[0]["etag"] = multipart
    ParquetSink(str(tmp_path / "b")).finalize_global(_context(store, result))
    [entry] = json.loads((tmp_path / "b" / "_SUCCESS").read_bytes())["files"]
    assert entry["checked"] == "etag-size" and entry["sha256"] == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("sink", ["local", "s3"])
def test_an_entry_with_neither_checksum_is_refused_naming_the_attempt_and_file(tmp_path: Path, sink: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryBackend("s3://bucket/store", content_token="etag")
    result = _attempt(store, 0, [1])
    del result.files[0]["etag"]
    monkeypatch.setattr(parquet_s3, "open_sink_backend", lambda *_: MemoryBackend())
    with pytest.raises(PartitionError, match=r"part-0.parquet \(stage 'write' subtask 0 attempt 0\) carries "
                                             "neither sha256 nor etag"):
        ParquetSink(str(tmp_path / "out") if sink == "local" else URL).finalize_global(_context(store, result))


def test_on_s3_etag_files_are_copied_server_side_and_checked_by_etag_without_a_read(s3: list[str]) -> None:
    store = S3Backend("s3://store/root", client=boto3.client("s3", region_name="us-east-1"))
    ctx = _context(store, _attempt(store, 0, [1, 2], [3]), _attempt(store, 1, [4]))
    source_calls: list[str] = []
    store._client.meta.events.register("before-call.s3.*", lambda model, **_: source_calls.append(model.name))
    ParquetSink(URL).finalize_global(ctx)
    # Server-side copies; the source is asked for its size and ETag (HeadObject), never read.
    assert s3.count("CopyObject") == 3 and set(source_calls) == {"HeadObject"}
    sink = S3Backend("s3://lake", client=boto3.client("s3", region_name="us-east-1"))
    pointer = json.loads(sink.read("out/_CURRENT") or b"{}")
    assert [f["checked"] for f in pointer["files"]] == ["etag"] * 3
    assert all(f["etag"] and f["sha256"] for f in pointer["files"])
    files = parquet_s3.published_files(URL, store=sink)
    ids = [i for f in files for i in pq.read_table(io.BytesIO(sink.read(f[len("s3://lake/"):]) or b""))
           .column("id").to_pylist()]
    assert sorted(ids) == [1, 2, 3, 4]


def test_on_s3_a_source_replaced_after_its_manifest_is_not_published(s3: list[str]) -> None:
    store = S3Backend("s3://store/root", client=boto3.client("s3", region_name="us-east-1"))
    result = _attempt(store, 0, [1, 2])
    store.replace(f"{result.data_name}/part-0.parquet", _parquet([2, 1]))  # same size, other bytes
    with pytest.raises(StoreError, match=r"checksum mismatch of s3://store/root/.*part-0.parquet"):
        ParquetSink(URL).finalize_global(_context(store, result))
    assert "CopyObject" not in s3
