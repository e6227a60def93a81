"""The S3 journal's numbering after a delete, against moto's in-process S3 (``moto.mock_aws``, no server).

The whole conformance suite runs on S3 in tests/integration/test_store_backends.py against moto's server;
these are the journal cases that need no other process, plus what only S3 has: an appender's remembered
next number, checked against a deletion by another client at the cost of at most one HEAD.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import moto
import pytest

from airflow_provider_speculative.store.backend import S3Backend, StoreBackend
from tests.unit.store.conformance import BackendConformance

BUCKET = "store-journal"
JOURNAL = "runs/a/s/journal.jsonl"


@pytest.fixture
def make_backend() -> Iterator[Callable[..., S3Backend]]:
    """S3 backends on one fresh prefix of an in-process bucket, each with a client of its own."""
    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
        yield lambda owner=None: S3Backend(url, owner=owner, client=boto3.client("s3", region_name="us-east-1"))


class TestS3JournalConformance:
    """The conformance suite's journal cases that run in one process, on S3."""

    @pytest.fixture
    def backend(self, make_backend: Callable[..., StoreBackend]) -> StoreBackend:
        """The store under test."""
        return make_backend()

    test_journal_of_nothing_is_empty = BackendConformance.test_journal_of_nothing_is_empty
    test_incremental_read_of_a_replaced_journal_starts_again_and_says_so = (
        BackendConformance.test_incremental_read_of_a_replaced_journal_starts_again_and_says_so)
    test_a_journal_deleted_by_its_appender_and_appended_again_is_read_whole = (
        BackendConformance.test_a_journal_deleted_by_its_appender_and_appended_again_is_read_whole)


class _Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _requests(backend: S3Backend) -> list[str]:
    """The names of the S3 operations ``backend``'s client sends from now on, in order."""
    sent: list[str] = []

    def record(model: Any, **_: Any) -> None:
        sent.append(model.name)

    backend._client.meta.events.register("before-call.s3", record)
    return sent


def _numbers(backend: S3Backend) -> list[int]:
    return [int(name.rsplit("/", 1)[-1].split(".")[0]) for name in backend.list_names("runs/a/s/journal")]


def test_a_single_record_deleted_by_its_appender_is_numbered_again(make_backend: Callable[..., S3Backend]) -> None:
    backend = make_backend()
    backend.claim("runs/a")
    for i in range(3):
        backend.append_record(JOURNAL, {"i": i})
    assert backend.delete("runs/a/s/journal/000000000003.json")
    backend.append_record(JOURNAL, {"i": 3})
    assert _numbers(backend) == [1, 2, 3]
    assert [r["i"] for r in make_backend().read_journal_from(JOURNAL).records] == [0, 1, 3]


def test_a_journal_deleted_by_another_client_is_noticed_by_a_remembered_number(
        make_backend: Callable[..., S3Backend]) -> None:
    ours, gc, planner = make_backend(), make_backend(), make_backend()
    clock = _Clock()
    ours._clock = clock
    gc.claim("runs/a")
    for i in range(3):
        ours.append_record(JOURNAL, {"who": "ours", "i": i})
    assert gc.delete_prefix("runs/a") == 4  # three records and the marker, by another client
    planner.append_record(JOURNAL, {"who": "planner", "i": 0})  # a fresh client starts the journal at 1
    clock.now += 60.0  # its next append, a minute later
    ours.append_record(JOURNAL, {"who": "ours", "i": 3})  # it remembered 4: 2 is the next number now
    assert _numbers(ours) == [1, 2]
    expected = [{"who": "planner", "i": 0}, {"who": "ours", "i": 3}]
    assert make_backend().read_journal_from(JOURNAL).records == expected
    assert ours.read_journal(JOURNAL) == expected


def test_a_remembered_number_costs_one_put_per_append_and_one_head_once_old(
        make_backend: Callable[..., S3Backend]) -> None:
    backend = make_backend()
    clock = _Clock()
    backend._clock = clock
    sent = _requests(backend)
    backend.append_record(JOURNAL, {"i": 0})
    assert sent == ["ListObjectsV2", "PutObject"]  # a late appender lists the journal once
    del sent[:]
    for i in range(1, 4):
        clock.now += 0.1  # a burst of events
        backend.append_record(JOURNAL, {"i": i})
    assert sent == ["PutObject"] * 3  # each append confirms its own number: nothing else is asked
    del sent[:]
    clock.now += 60.0
    backend.append_record(JOURNAL, {"i": 4})
    assert sent == ["HeadObject", "PutObject"]  # the last record is still there: the number holds
    assert _numbers(backend) == [1, 2, 3, 4, 5]
