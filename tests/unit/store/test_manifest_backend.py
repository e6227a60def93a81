"""Attempt output through the store backend: manifests built and verified by name, the same on every backend."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from airflow_provider_speculative.exceptions import PartitionError, StoreError
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend
from airflow_provider_speculative.store.files import json_document
from airflow_provider_speculative.store.manifest import (
    build_manifest,
    build_manifest_in,
    data_files,
    is_data_file,
    read_manifest,
    read_manifest_in,
    sha256_and_size,
    verify_files,
    verify_files_in,
    write_manifest,
    write_manifest_in,
)
from tests.unit.store.memory import MemoryBackend

DATA = "dag/run/scan/subtask=0/attempt=1/data"
# What a Spark write leaves (data files and its bookkeeping), plus names whose order differs as text and as paths.
OUTPUT = {
    "_sp=1/part-00000-a.c000.snappy.parquet": b"one" * 100,
    "_sp=10/part-00000-a.c000.snappy.parquet": b"ten" * 7,
    "_sp=1/part-00001-a.c000.snappy.parquet": b"more",
    "a-c/part-0.parquet": b"x",
    "a/b/part-0.parquet": b"y",
    "part-00000-b.c000.snappy.parquet": b"",
}
BOOKKEEPING = {
    "_SUCCESS": b"",
    "_committed_123": b"{}",
    "_started_123": b"",
    ".part-00000-b.c000.snappy.parquet.crc": b"crc",
    "_sp=1/.part-00000-a.c000.snappy.parquet.crc": b"crc",
    "part-9.parquet.crc": b"crc",
    "._SUCCESS.crc": b"",
}
# In-flight task output of Hadoop's committers, s3a's magic committer and Spark's dynamic overwrite: gone once
# a job has committed, but a listing may still see it on S3 (or a zombie task may write it).
IN_FLIGHT = {
    "_temporary/0/_temporary/attempt_1/_sp=1/part-00009.parquet": b"partial",
    "__magic_job-1/tasks/part-0.parquet": b"",
    ".spark-staging-1/_sp=1/part-0.parquet": b"partial",
}


def _old_build_manifest(data_dir: Path, **extra: Any) -> dict[str, Any]:
    """The POSIX walk manifests were built with before the backend (rglob, stat, hash), for byte identity."""
    found = sorted(p for p in data_dir.rglob("*") if p.is_file()
                   and not p.name.startswith((".", "_")) and not p.name.endswith(".crc"))
    files = []
    for path in found:
        rel = path.relative_to(data_dir).as_posix()
        match = re.search(r"(?:^|/)_sp=(\d+)(?:/|$)", rel)
        files.append({"path": rel, "size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "subpartition": int(match.group(1)) if match else None})
    return {"version": 1, "files": files, "bytes": sum(f["size"] for f in files), **extra}


def _write_tree(root: Path, objects: dict[str, bytes]) -> None:
    for rel, data in objects.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _memory(objects: dict[str, bytes]) -> MemoryBackend:
    store = MemoryBackend()
    for rel, data in objects.items():
        store.replace(f"{DATA}/{rel}", data)
    return store


def test_a_manifest_built_on_another_backend_equals_the_posix_one(tmp_path: Path) -> None:
    _write_tree(tmp_path / DATA, {**OUTPUT, **BOOKKEEPING})
    memory = _memory({**OUTPUT, **BOOKKEEPING, **IN_FLIGHT})
    # S3 directory markers (an empty ``x/`` object, Hadoop's legacy ``x_$folder$``) are directories, not files.
    memory.objects[f"{DATA}/_sp=1/"] = b""
    memory.objects[f"{DATA}/_sp=1_$folder$"] = b""

    extra = {"stage": "scan", "subtask": 0, "attempt": 1, "written_at": 5.0}
    from_memory = build_manifest_in(memory, DATA, **extra)
    on_posix = build_manifest_in(PosixBackend(tmp_path), DATA, **extra)
    by_path = build_manifest(tmp_path / DATA, **extra)
    assert from_memory == on_posix == by_path
    # Byte-identical to the manifest the POSIX walk wrote before (same files, same order: by path segments).
    assert json_document(on_posix) == json_document(_old_build_manifest(tmp_path / DATA, **extra))
    assert [f["path"] for f in from_memory["files"]] == [
        "_sp=1/part-00000-a.c000.snappy.parquet", "_sp=1/part-00001-a.c000.snappy.parquet",
        "_sp=10/part-00000-a.c000.snappy.parquet", "a/b/part-0.parquet", "a-c/part-0.parquet",
        "part-00000-b.c000.snappy.parquet"]
    assert [f["subpartition"] for f in from_memory["files"]] == [1, 1, 10, None, None, None]
    assert from_memory["bytes"] == sum(len(v) for v in OUTPUT.values())
    assert from_memory["files"][0]["sha256"] == hashlib.sha256(OUTPUT[from_memory["files"][0]["path"]]).hexdigest()
    # In-flight output left in the directory is not listed either (the walk before listed it).
    _write_tree(tmp_path / DATA, IN_FLIGHT)
    assert build_manifest(tmp_path / DATA, **extra) == from_memory
    # Nothing there: an empty manifest, on every backend.
    assert build_manifest_in(MemoryBackend(), DATA)["files"] == [] == build_manifest(tmp_path / "none")["files"]


def test_spark_bookkeeping_and_in_flight_objects_are_not_data() -> None:
    for rel in {**BOOKKEEPING, **IN_FLIGHT}:
        assert not is_data_file(rel), rel
    for rel in OUTPUT:
        assert is_data_file(rel), rel
    assert not is_data_file("_sp=1/") and not is_data_file("x_$folder$")
    every = _memory({**OUTPUT, **BOOKKEEPING, **IN_FLIGHT})
    assert data_files(every, DATA) == sorted(OUTPUT, key=lambda n: n.split("/"))


class _Streaming(MemoryBackend):
    """A double whose streamed reads record the largest block asked for: hashing never reads an object whole."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def _open_read(self, name: str) -> BinaryIO | None:
        data = self.objects.get(name)
        if data is None:
            return None
        outer = self

        class Recording(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                assert size is not None and size > 0, "a streamed hash reads in blocks"
                outer.largest = max(outer.largest, size)
                return super().read(size)

        return Recording(data)


def test_verify_by_name_finds_a_corrupted_resized_or_missing_object() -> None:
    store = _Streaming()
    for rel, data in OUTPUT.items():
        store.replace(f"{DATA}/{rel}", data)
    store.replace(f"{DATA}/big.parquet", os.urandom(3 << 20))
    files = build_manifest_in(store, DATA)["files"]
    assert 0 < store.largest <= 1 << 20
    verify_files_in(store, DATA, files, stage="scan", subtask=0, attempt=1)

    first = f"{DATA}/{files[0]['path']}"
    original = store.objects[first]
    store.objects[first] = b"X" + original[1:]  # same size, one byte changed
    with pytest.raises(PartitionError, match=rf"corrupt partition file memory:///{re.escape(first)} "
                                             r"\(stage 'scan' subtask 0 attempt 1\): checksum mismatch") as err:
        verify_files_in(store, DATA, files, stage="scan", subtask=0, attempt=1)
    assert (err.value.stage, err.value.subtask, err.value.attempt) == ("scan", 0, 1)
    verify_files_in(store, DATA, files, checksums=False)  # sizes only cannot see it

    store.objects[first] = original + b"!"
    with pytest.raises(PartitionError, match=rf"size {len(original) + 1} != manifest {len(original)}"):
        verify_files_in(store, DATA, files, checksums=False)

    del store.objects[first]
    with pytest.raises(PartitionError, match="missing partition file"):
        verify_files_in(store, DATA, files)
    # The first bad file in the manifest's order is the one named, whatever else is wrong after it.
    store.objects[first] = original
    last = f"{DATA}/{files[-1]['path']}"
    del store.objects[last]
    store.objects[f"{DATA}/{files[1]['path']}"] += b"?"
    with pytest.raises(PartitionError, match=re.escape(files[1]["path"])):
        verify_files_in(store, DATA, files)


def test_path_forms_are_the_posix_backend_forms(tmp_path: Path) -> None:
    _write_tree(tmp_path / DATA, OUTPUT)
    store = PosixBackend(tmp_path)
    manifest = build_manifest_in(store, DATA, records=3)
    write_manifest_in(store, "dag/run/scan/subtask=0/attempt=1/_SUCCESS", manifest)
    path = tmp_path / "dag/run/scan/subtask=0/attempt=1/_SUCCESS"
    assert path.read_bytes() == json_document(manifest)
    assert read_manifest(path) == manifest == read_manifest_in(store, "dag/run/scan/subtask=0/attempt=1/_SUCCESS")
    write_manifest(tmp_path / "copy" / "_SUCCESS", manifest)
    assert (tmp_path / "copy" / "_SUCCESS").read_bytes() == path.read_bytes()
    assert read_manifest(tmp_path / "nothing" / "_SUCCESS") is None

    victim = tmp_path / DATA / "a/b/part-0.parquet"
    victim.unlink()
    # The same message by path and by name: the object's path.
    for check in (lambda: verify_files(tmp_path / DATA, manifest["files"], stage="scan", subtask=0, attempt=1),
                  lambda: verify_files_in(store, DATA, manifest["files"], stage="scan", subtask=0, attempt=1)):
        with pytest.raises(PartitionError) as err:
            check()
        assert str(err.value) == f"missing partition file {victim} (stage 'scan' subtask 0 attempt 1)"


def test_posix_streamed_reads_refuse_a_fifo_or_a_link_and_spark_gets_the_path(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    store.replace("d/x.parquet", b"abc")
    assert sha256_and_size(store, "d/x.parquet") == (hashlib.sha256(b"abc").hexdigest(), 3)
    assert sha256_and_size(store, "d/none.parquet") is None
    os.mkfifo(tmp_path / "d" / "fifo.parquet")
    os.symlink(tmp_path / "d" / "x.parquet", tmp_path / "d" / "link.parquet")
    for name in ("d/fifo.parquet", "d/link.parquet"):
        with pytest.raises(StoreError, match=re.escape(str(tmp_path / name))):
            store.open_read(name)
    # Exactly the strings attempts always handed to Spark: the paths themselves.
    assert store.spark_url(DATA) == str(tmp_path / DATA)
    assert store.spark_url(f"{DATA}/_sp=1/part-0.parquet") == str(tmp_path / DATA / "_sp=1" / "part-0.parquet")
    filesystem, path = store.arrow_path("d/x.parquet")
    assert type(filesystem).__name__ == "LocalFileSystem" and path == str(tmp_path / "d/x.parquet")
    with pytest.raises(StoreError, match="has no URL Spark reads"):
        MemoryBackend().spark_url(DATA)


def test_posix_parquet_footers_through_pyarrow_fs(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"k": [1, 2, 3]}), tmp_path / "d" / "part-0.parquet")
    assert PosixBackend(tmp_path).parquet_metadata("d/part-0.parquet").num_rows == 3


class _Body:
    """A GetObject body: read(n) in blocks, then optionally a failure mid-stream."""

    def __init__(self, data: bytes, fail_after: int | None = None) -> None:
        self.stream, self.fail_after, self.closed = io.BytesIO(data), fail_after, False

    def read(self, size: int = -1) -> bytes:
        if self.fail_after is not None and self.stream.tell() >= self.fail_after:
            raise ConnectionError("Connection broken: IncompleteRead; request signed with wJalrXUtnFEMI/K7MDENG")
        return self.stream.read(size)

    def close(self) -> None:
        self.closed = True


class _ServiceError(Exception):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code}): echoed wJalrXUtnFEMI/K7MDENG")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class _GetClient:
    def __init__(self, objects: dict[str, bytes], fail_after: int | None = None) -> None:
        self.objects, self.fail_after = objects, fail_after
        self.bodies: list[_Body] = []

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise _ServiceError(404, "NoSuchKey")
        body = _Body(self.objects[Key], self.fail_after)
        self.bodies.append(body)
        return {"Body": body}


class _Credentials:
    endpoint_url = "http://127.0.0.1:9"
    region = "eu-west-1"
    access_key = "AKIDEXAMPLE"
    secret_key = "wJalrXUtnFEMI/K7MDENG"
    session_token = None


def test_s3_output_urls_streams_and_footers_without_credentials_shown(tmp_path: Path) -> None:
    data = os.urandom((2 << 20) + 5)
    client = _GetClient({"p/d/x.parquet": data})
    backend = S3Backend("s3://b/p", _Credentials(), client=client)  # type: ignore[arg-type]
    assert backend.spark_url("d/x.parquet") == "s3a://b/p/d/x.parquet"
    assert sha256_and_size(backend, "d/x.parquet") == (hashlib.sha256(data).hexdigest(), len(data))
    assert client.bodies[-1].closed
    assert backend.open_read("d/none.parquet") is None

    broken = S3Backend("s3://b/p", client=_GetClient({"p/d/x.parquet": data}, fail_after=1 << 20))  # type: ignore[arg-type]
    with pytest.raises(StoreError) as err:
        sha256_and_size(broken, "d/x.parquet")
    assert str(err.value) == "cannot read s3://b/p/d/x.parquet: ConnectionError"
    assert err.value.__cause__ is None and err.value.__suppress_context__

    filesystem, path = backend.arrow_path("d/x.parquet")
    assert type(filesystem).__name__ == "S3FileSystem" and path == "b/p/d/x.parquet"
    assert backend.arrow_path("d/y.parquet")[0] is filesystem  # built once
    for shown in (repr(backend), repr(backend._arrow), repr(filesystem), str(vars(backend).get("_arrow"))):
        assert _Credentials.secret_key not in shown and _Credentials.access_key not in shown

    # A footer that cannot be read names the object and the error's type, never pyarrow's (the service's) text.
    from pyarrow.fs import LocalFileSystem

    backend._arrow._filesystem = LocalFileSystem()
    with pytest.raises(StoreError) as err:
        backend.parquet_metadata("d/x.parquet")
    assert str(err.value) == "cannot read the Parquet footer of s3://b/p/d/x.parquet: FileNotFoundError"
    assert err.value.__cause__ is None


def test_a_manifest_names_the_same_files_on_s3_and_posix(tmp_path: Path) -> None:
    _write_tree(tmp_path / DATA, OUTPUT)

    class Listing(_GetClient):
        def get_paginator(self, _: str) -> Any:
            objects = self.objects

            class Pages:
                def paginate(self, Bucket: str, Prefix: str, **_: Any) -> list[dict[str, Any]]:
                    return [{"Contents": [
                        {"Key": k, "Size": len(objects[k]), "LastModified": datetime.now(UTC),
                         "ETag": f'"{hashlib.md5(objects[k], usedforsecurity=False).hexdigest()}"'}
                        for k in sorted(objects) if k.startswith(Prefix)]}]

            return Pages()

    objects = {f"root/{DATA}/{rel}": data for rel, data in {**OUTPUT, **BOOKKEEPING, **IN_FLIGHT}.items()}
    objects[f"root/{DATA}/_sp=1/"] = b""  # a directory marker s3a may keep
    client = Listing(objects)
    s3 = S3Backend("s3://b/root", client=client)  # type: ignore[arg-type]
    on_s3, on_posix = build_manifest_in(s3, DATA, at=1), build_manifest(tmp_path / DATA, at=1)
    # The same files, sizes and subpartitions; S3's entries carry the listed ETag, read from no object.
    assert on_s3.pop("integrity") == "etag" and "integrity" not in on_posix
    for entry in on_s3["files"]:
        assert entry.pop("etag") == hashlib.md5(OUTPUT[entry["path"]], usedforsecurity=False).hexdigest()
    for entry in on_posix["files"]:
        assert entry.pop("sha256") == hashlib.sha256(OUTPUT[entry["path"]]).hexdigest()
    assert json.dumps(on_s3) == json.dumps(on_posix)
    assert client.bodies == []
