"""Manifests of a direct write: only the files the commit protocol's committed-file list names.

The provider's Spark commit protocol (backends/jvm/DirectCommitProtocol.java) writes every task attempt's
files in their final place and, at job commit, the list of the committed tasks' files: a losing or aborted
task attempt's file can stand beside them, and must never reach a manifest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.manifest import COMMITTED_LIST, build_manifest_in, data_files
from tests.unit.store.memory import MemoryBackend

DATA = "dag/run/scan/subtask=0/attempt=1/data"
COMMITTED = {"part-00000-j-a3-c000.zstd.parquet": b"winner" * 50, "part-00001-j-a4-c000.zstd.parquet": b"two"}
# A speculative Spark task attempt that lost, whose writer was closed after the job ended: a valid file.
LOSER = {"part-00000-j-a5-c000.zstd.parquet": b"partial"}


def _write(store: MemoryBackend | PosixBackend, objects: dict[str, bytes], listed: list[str] | None) -> None:
    for rel, data in objects.items():
        store.replace(f"{DATA}/{rel}", data)
    if listed is not None:
        store.replace(f"{DATA}/{COMMITTED_LIST}", "".join(f"{n}\n" for n in listed).encode())


@pytest.mark.parametrize("content_token", ["etag", None])
def test_a_file_the_list_does_not_name_never_reaches_the_manifest(content_token: str | None) -> None:
    store = MemoryBackend("s3://b/root", content_token=content_token)
    _write(store, {**COMMITTED, **LOSER}, sorted(COMMITTED))
    manifest = build_manifest_in(store, DATA)
    assert [f["path"] for f in manifest["files"]] == sorted(COMMITTED)
    assert manifest["bytes"] == sum(len(v) for v in COMMITTED.values())


def test_without_a_list_every_data_file_is_described(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    _write(store, {**COMMITTED, **LOSER}, None)
    assert data_files(store, DATA) == sorted({**COMMITTED, **LOSER})


def test_a_posix_store_honours_the_list(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    _write(store, {**COMMITTED, **LOSER}, sorted(COMMITTED))
    assert [f["path"] for f in build_manifest_in(store, DATA)["files"]] == sorted(COMMITTED)


def test_partitioned_names_in_the_list_keep_their_subpartition() -> None:
    store = MemoryBackend("s3://b/root", content_token="etag")
    files = {"_sp=3/part-00000-j-a0-c000.parquet": b"x", "_sp=12/part-00000-j-a0-c000.parquet": b"y"}
    _write(store, {**files, "_sp=3/part-00000-j-a9-c000.parquet": b"loser"}, sorted(files))
    entries = build_manifest_in(store, DATA)["files"]
    assert {(e["path"], e["subpartition"]) for e in entries} == {
        ("_sp=3/part-00000-j-a0-c000.parquet", 3), ("_sp=12/part-00000-j-a0-c000.parquet", 12)}


def test_an_empty_list_is_an_empty_output() -> None:
    store = MemoryBackend("s3://b/root", content_token="etag")
    _write(store, LOSER, [])
    assert build_manifest_in(store, DATA)["files"] == []


def test_a_named_file_that_is_missing_fails_the_manifest() -> None:
    store = MemoryBackend("s3://b/root", content_token="etag")
    _write(store, {"part-00000-j-a3-c000.zstd.parquet": b"x"}, sorted(COMMITTED))
    with pytest.raises(StoreError, match=r"part-00001-j-a4-c000\.zstd\.parquet.*named by the committed-file list"):
        build_manifest_in(store, DATA)


@pytest.mark.parametrize("name", ["../escape.parquet", "/abs.parquet", "_SUCCESS", "_temporary/0/x.parquet",
                                  "a/../../x.parquet"])
def test_a_list_naming_anything_but_a_data_file_below_its_prefix_is_refused(name: str) -> None:
    store = MemoryBackend("s3://b/root", content_token="etag")
    _write(store, COMMITTED, [*sorted(COMMITTED), name])
    with pytest.raises(StoreError, match="not a data file below its prefix"):
        build_manifest_in(store, DATA)
