"""The store backends against real storage: the conformance suite on POSIX and on the suite's S3 endpoint.

The S3 endpoint is moto's server (devtools/services.py ``start_s3``, on loopback with fresh random keys),
which implements ``If-None-Match: *`` atomically; it is provided by the suite, so when it cannot start the
tests fail with the reason, never skip. Credentials come as ``hooks/objectstore.py``'s ``S3Settings``,
from the AWS environment as in production; the secret key must never appear in an error, a log or a repr.
"""

from __future__ import annotations

import logging
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.hooks.objectstore import S3Settings, settings_from_environment
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend, StoreBackend, open_backend
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.slots import TargetSlots, holder_record
from tests import services
from tests.unit.store.conformance import BackendConformance
from tests.unit.store.slot_race import GONE_AT, NOW, LateSlots, objects_per_slot, race_slots

pytestmark = pytest.mark.timeout(300)

BUCKET = "store-backends"
T = TypeVar("T")


@pytest.fixture(scope="module")
def s3_settings() -> Iterator[S3Settings]:
    """The session's S3 endpoint as settings read from the standard AWS environment, and its bucket."""
    server = services.s3()
    server.create_bucket(BUCKET)
    yield settings_from_environment(server.environment())


@pytest.fixture(params=["posix", "s3"])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., StoreBackend]:
    """A backend on a fresh root of this test: a directory, or a fresh prefix of the bucket."""
    if request.param == "posix":
        return lambda owner=None: PosixBackend(tmp_path / "store", owner=owner)
    settings = request.getfixturevalue("s3_settings")
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    return lambda owner=None: S3Backend(url, settings, owner=owner)


class TestConformance(BackendConformance):
    """Every guarantee of docs/store.md, the same checks on both backends."""


def _secret_free(text: str, settings: S3Settings) -> None:
    for secret in settings.secrets:
        assert secret not in text
        assert secret[:12] not in text


def test_s3_journal_records_are_numbered_objects_without_gaps(s3_settings: S3Settings) -> None:
    backend = S3Backend(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_settings)
    for i in range(3):
        backend.append_record("d/r/s/journal.jsonl", {"event": "e", "i": i})
    assert backend.list_names("d/r/s") == [f"d/r/s/journal/00000000000{n}.json" for n in (1, 2, 3)]
    # A writer that starts late (no cached number) lists the journal and continues after its end.
    late = S3Backend(backend.url, s3_settings)
    late.append_record("d/r/s/journal.jsonl", {"event": "e", "i": 3})
    assert [r["i"] for r in backend.read_journal("d/r/s/journal.jsonl")] == [0, 1, 2, 3]
    assert backend.list_names("d/r/s")[-1] == "d/r/s/journal/000000000004.json"


def test_s3_open_backend_and_settings_from_a_connection(s3_settings: S3Settings) -> None:
    backend = open_backend(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_settings)
    assert isinstance(backend, S3Backend)
    backend.replace_json("plan.json", {"ok": True})
    assert open_backend(backend.url.replace("s3://", "s3a://"), s3_settings).read_json("plan.json") == {"ok": True}


def test_s3_errors_name_the_object_and_never_a_secret(s3_settings: S3Settings, caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    caplog.set_level(logging.DEBUG)  # botocore's own debug logging included
    shown: list[str] = []
    missing = S3Backend("s3://no-such-bucket-for-the-store/root", s3_settings)
    shown.append(repr(missing))
    for call, what in ((lambda: missing.replace("d/plan.json", b"{}"), "write"),
                       (lambda: missing.read("d/plan.json"), "read"),
                       (lambda: missing.create_exclusive("d/claim.json", b"{}"), "create"),
                       (lambda: missing.list_names("d"), "list"),
                       (lambda: missing.stat("d/plan.json"), "stat")):
        with pytest.raises(StoreError) as err:
            call()
        message = str(err.value)
        assert f"cannot {what} s3://no-such-bucket-for-the-store/root/d" in message, message
        assert "NoSuchBucket" in message or "404" in message, message
        shown += [message, repr(err.value), "".join(traceback.format_exception(err.value))]
    # A rejected key: a client with the right key id and a wrong secret (moto accepts any pair, so the
    # error is the bucket's; the point is the wrong secret in the client never surfaces either).
    wrong = S3Settings(endpoint_url=s3_settings.endpoint_url, region=s3_settings.region,
                       access_key=s3_settings.access_key, secret_key="WrongSecretValue0123456789abcdef")
    with pytest.raises(StoreError) as err:
        S3Backend("s3://no-such-bucket-for-the-store/x", wrong).replace("a.json", b"{}")
    shown.append("".join(traceback.format_exception(err.value)))
    assert "WrongSecretValue" not in shown[-1]
    good = S3Backend(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_settings)
    good.replace("x.json", b"{}")
    shown += [repr(good), repr(good.__dict__.get("url")), str(vars(good).get("owner"))]
    _secret_free("\n".join(shown) + caplog.text, s3_settings)
    assert "WrongSecretValue" not in caplog.text


def test_s3_the_endpoint_refuses_a_second_conditional_create_itself(s3_settings: S3Settings) -> None:
    """Exclusive create rests on the server's answer, not on a check before the write (no read-then-write race)."""
    backend = S3Backend(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_settings)
    client = services.s3().client()
    client.put_object(Bucket=BUCKET, Key=f"{backend.base}/claim.json", Body=b'{"other": 1}')  # type: ignore[attr-defined]
    assert backend.create_exclusive_json("claim.json", {"mine": 1}) is False
    assert backend.read_json("claim.json") == {"other": 1}


def test_s3_target_slots_one_holder_per_slot_under_racing_claimers_reclaimers_and_pruning(
        s3_settings: S3Settings, tmp_path: Path) -> None:
    """The slot scheme on S3: each thread has its own client, as a controller on another host would."""
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"

    def slots() -> TargetSlots:
        return LateSlots(tmp_path, "t", store=S3Backend(url, s3_settings))

    def together(work: Callable[[int], T], n: int) -> list[T]:
        barrier, lock = threading.Barrier(n), threading.Lock()
        out: list[T] = []

        def run(i: int) -> None:
            barrier.wait()
            got = work(i)
            with lock:
                out.append(got)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return out

    layout = StageLayout(tmp_path, "d", "r", "s")
    first = slots()
    for i in range(4):  # some history, pruned as it goes
        got = first.claim(2, {"who": i})
        assert got is not None and first.release(*got)
    # Racing claimers of two free slots: one winner each.
    won = [got for got in together(lambda i: slots().claim(2, holder_record(layout, i, 0, GONE_AT)), 10) if got]
    assert sorted(index for index, _ in won) == [0, 1] and first.count() == 2
    # Racing reclaimers of their (gone) holders: each slot freed once.
    freed = [f for found in together(lambda i: slots().reclaim_gone(NOW), 6) for f in found]
    assert sorted(index for index, _, _ in freed) == [0, 1] and first.count() == 0
    # Claimers, releasers, reclaimers and pruners at once, and claimers creating pruned names again: never
    # two holders of a slot, nor more than two.
    race = race_slots(slots, tmp_path, slots=2, holders=5, rounds=6, crashers=2, reclaimers=2, pruners=1, stale=2)
    assert race.errors == [] and race.failed_releases == 0 and 1 <= race.most <= 2 and race.held == 5 * 6 + 2
    assert race.recreated >= 1
    names = first.store.children(first.prefix)
    assert first.count() == 0 and max(objects_per_slot(names).values()) <= 2 and len(names) <= 2 * 2 + 1, names
    assert "_owner.json" in names
