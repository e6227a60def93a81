"""A packed file read in part: its tail checked by SHA-256, its pages by their CRCs, a failed read blamed."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.core.failover import failed_read, read_failure_reason
from airflow_provider_speculative.exceptions import PartitionError
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.manifest import parquet_data_end, tail_digest, verify_files_in

DATA = "d/r/s/subtask=0/attempt=0"
NAME = "part-00000-0b9e.c000.snappy.parquet"


def _packed_bytes() -> bytes:
    """A file written as Spark writes a packed exchange: sorted ``_sp``, page CRCs, page indexes, 2 row groups."""
    rows = 20_000
    table = pa.table({"v": pa.array(range(rows), pa.int64()),
                      "s": pa.array([f"row-{i:06d}" for i in range(rows)]),
                      "_sp": pa.array(sorted(i % 8 for i in range(rows)), pa.int64())})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=rows // 2, data_page_size=4096, write_page_checksum=True,
                   write_page_index=True, use_dictionary=["_sp"])
    return sink.getvalue()


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def _entry(data: bytes) -> dict[str, object]:
    end = parquet_data_end(pq.ParquetFile(io.BytesIO(data)).metadata)
    return {"path": NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "subpartitions": {"0": 1, "7": 1},
            "tail": {"offset": end, "sha256": hashlib.sha256(data[end:]).hexdigest()}}


def _value_chunk_middle(data: bytes) -> int:
    chunk = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    return chunk.data_page_offset + chunk.total_compressed_size // 2


def test_the_tail_holds_the_footer_and_indexes_and_nothing_of_the_pages() -> None:
    data = _packed_bytes()
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    end = parquet_data_end(metadata)
    footer = int.from_bytes(data[-8:-4], "little")
    assert data[-4:] == b"PAR1" and len(data) - end > footer + 8  # the page indexes lie in the tail too
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            assert start + chunk.total_compressed_size <= end


def test_a_flipped_byte_in_a_page_fails_the_page_crc_and_not_the_tail(tmp_path: Path) -> None:
    data = _packed_bytes()
    corrupt = _flip(data, _value_chunk_middle(data))
    end = _entry(data)["tail"]["offset"]  # type: ignore[index]
    assert corrupt[end:] == data[end:]
    with pytest.raises(OSError, match="CRC"):
        pq.ParquetFile(io.BytesIO(corrupt), page_checksum_verification=True).read()


def test_a_reader_of_part_checks_size_and_tail_and_a_whole_reader_every_byte(tmp_path: Path) -> None:
    data = _packed_bytes()
    entry = _entry(data)
    store = PosixBackend(tmp_path)
    store.replace(f"{DATA}/{NAME}", _flip(data, _value_chunk_middle(data)))
    # Shared: the tail is intact, so the page is left to Spark's CRC check; whole: the SHA-256 finds it.
    verify_files_in(store, DATA, [entry], stage="scan", subtask=0, attempt=0, by_tail={NAME})
    with pytest.raises(PartitionError, match="checksum mismatch"):
        verify_files_in(store, DATA, [entry], stage="scan", subtask=0, attempt=0)

    end = int(entry["tail"]["offset"])  # type: ignore[index]
    store.replace(f"{DATA}/{NAME}", _flip(data, end + 10))
    with pytest.raises(PartitionError, match=r"corrupt partition file .*Parquet footer and indexes") as err:
        verify_files_in(store, DATA, [entry], stage="scan", subtask=0, attempt=0, by_tail={NAME})
    assert (err.value.stage, err.value.subtask, err.value.attempt) == ("scan", 0, 0)

    store.replace(f"{DATA}/{NAME}", data[:-1])
    with pytest.raises(PartitionError, match="size"):
        verify_files_in(store, DATA, [entry], stage="scan", subtask=0, attempt=0, by_tail={NAME})


def test_an_entry_without_a_tail_is_checked_whole_even_when_shared(tmp_path: Path) -> None:
    # Packed files of a producer before tails existed, or on a store checked by ETag, have no tail.
    data = _packed_bytes()
    entry = {k: v for k, v in _entry(data).items() if k != "tail"}
    store = PosixBackend(tmp_path)
    store.replace(f"{DATA}/{NAME}", _flip(data, _value_chunk_middle(data)))
    with pytest.raises(PartitionError, match="checksum mismatch"):
        verify_files_in(store, DATA, [entry], stage="scan", subtask=0, attempt=0, by_tail={NAME})


def test_tail_digest_is_none_for_a_missing_or_short_object(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    store.replace("x/a", b"0123456789")
    assert tail_digest(store, "x/a", 4, 10) == hashlib.sha256(b"456789").hexdigest()
    assert tail_digest(store, "x/a", 4, 12) is None
    assert tail_digest(store, "x/missing", 0, 1) is None


@pytest.mark.parametrize(("text", "expected"), [
    (f"[FAILED_READ_FILE.NO_HINT] Encountered error while reading file file:///s/{NAME}.  SQLSTATE: KD001",
     NAME),
    (f"org.apache.parquet.io.ParquetDecodingException: CRC checksum verification failed ... file:/s/{NAME}", NAME),
    (f"java.io.FileNotFoundException: File file:/s/{NAME} does not exist", NAME),
    ("[FAILED_READ_FILE.NO_HINT] Encountered error while reading file file:///s/part-00001-other.parquet", None),
    (f"java.lang.OutOfMemoryError: Java heap space while writing {NAME}", None),
    ("", None),
])
def test_a_failed_read_is_blamed_on_the_file_it_names(text: str, expected: str | None) -> None:
    assert failed_read(text, ["part-00003-else.parquet", NAME]) == expected


def test_the_blame_names_the_cause_not_the_py4j_call() -> None:
    text = ("An error occurred while calling o171.parquet.\n: org.apache.spark.SparkException: [FAILED_READ_FILE."
            f"NO_HINT] Encountered error while reading file file:///s/{NAME}.\n\tat org.apache.spark.x(y)\n"
            "Caused by: org.apache.parquet.io.ParquetDecodingException: could not verify page integrity, CRC "
            "checksum verification failed\n")
    assert read_failure_reason(text).startswith("Caused by: org.apache.parquet.io.ParquetDecodingException")
    assert read_failure_reason("one line") == "one line"
