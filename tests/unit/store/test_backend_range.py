"""StoreBackend.read_range: a bounded read from an offset, the same on POSIX, in memory and on S3 (moto)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import moto
import pytest

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend, StoreBackend, UnsafeStoreNameError
from tests.unit.store.memory import MemoryBackend

BUCKET = "range-store"
DATA = b"".join(f"line {i}\n".encode() for i in range(1000))


@pytest.fixture(params=["posix", "memory", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[StoreBackend, list[dict[str, str]]]]:
    """A backend holding ``d/log`` (DATA) and an empty ``d/empty``, and the ranges its GetObject calls asked."""
    ranges: list[dict[str, str]] = []
    if request.param == "s3":
        with moto.mock_aws():
            client = boto3.client("s3", region_name="us-east-1")
            client.create_bucket(Bucket=BUCKET)
            client.meta.events.register("provide-client-params.s3.GetObject",
                                        lambda params, **_: ranges.append({"Range": params.get("Range", "")}))
            store: StoreBackend = S3Backend(f"s3://{BUCKET}/root", client=client)
            store.replace("d/log", DATA)
            store.replace("d/empty", b"")
            yield store, ranges
        return
    store = PosixBackend(tmp_path / "store") if request.param == "posix" else MemoryBackend()
    store.replace("d/log", DATA)
    store.replace("d/empty", b"")
    yield store, ranges


def test_a_range_is_the_bytes_asked_for_and_no_more(backend: tuple[StoreBackend, list[dict[str, str]]]) -> None:
    store, ranges = backend
    assert store.read_range("d/log", 0, 10) == DATA[:10]
    assert store.read_range("d/log", 100, 50) == DATA[100:150]
    # At the end: what is left; at or past it, nothing (an S3 InvalidRange is not an error).
    assert store.read_range("d/log", len(DATA) - 5, 100) == DATA[-5:]
    assert store.read_range("d/log", len(DATA), 100) == b""
    assert store.read_range("d/log", len(DATA) + 10, 1) == b""
    assert store.read_range("d/empty", 0, 10) == b""
    assert store.read_range("d/log", 7, 0) == b""
    assert store.read_range("d/missing", 0, 10) is None and store.read_range("d/missing", 0, 0) is None
    if isinstance(store, S3Backend):
        # One ranged GetObject each: never the whole object.
        assert ranges[:2] == [{"Range": "bytes=0-9"}, {"Range": "bytes=100-149"}]
    if isinstance(store, MemoryBackend):
        assert store.ranged_reads == 9


def test_a_tail_is_a_stat_then_one_range(backend: tuple[StoreBackend, list[dict[str, str]]]) -> None:
    store, _ = backend
    info = store.stat("d/log")
    assert info is not None
    assert store.read_range("d/log", info.size - 20, 20) == DATA[-20:]


def test_ranges_refuse_bad_names_and_bad_bounds(backend: tuple[StoreBackend, list[dict[str, str]]]) -> None:
    store, _ = backend
    for name in ("../etc/passwd", "/abs", "d//log", "d/./log", "a\\b", "d/\x00"):
        with pytest.raises(UnsafeStoreNameError):
            store.read_range(name, 0, 1)
    for offset, length in ((-1, 1), (0, -1)):
        with pytest.raises(ValueError, match="offset >= 0 and length >= 0"):
            store.read_range("d/log", offset, length)


def test_posix_ranges_refuse_a_link_or_a_fifo_in_place_of_the_object(tmp_path: Path) -> None:
    secret = tmp_path / "airflow.cfg"
    secret.write_text("fernet_key = s3cr3t\n")
    store = PosixBackend(tmp_path / "store")
    store.replace("d/log", b"x")
    (tmp_path / "store/d/log").unlink()
    (tmp_path / "store/d/log").symlink_to(secret)
    with pytest.raises(StoreError, match="symbolic link"):
        store.read_range("d/log", 0, 100)
    os.mkfifo(tmp_path / "store/d/fifo")
    with pytest.raises(StoreError, match="not a regular file"):
        store.read_range("d/fifo", 0, 100)  # refused at once: never blocks
