"""The store backend conformance suite: the six guarantees of docs/store.md, checked the same way on every backend.

A test module subclasses :class:`BackendConformance` and defines the ``make_backend`` fixture: a callable that
opens the store under test (``owner=`` names another store on the same storage), fresh for each call, so
that processes and threads get their own client. tests/unit/store/test_backend.py runs it on POSIX,
tests/integration/test_store_backends.py on POSIX and on the suite's S3 endpoint (moto's server).
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import (
    OWNER_FILE,
    StoreBackend,
    StoreNotOwnedError,
    UnsafeStoreNameError,
)

MakeBackend = Callable[..., StoreBackend]
RACERS = 48
PROCESS_RACERS = 32
# Big enough that a write is several syscalls / TCP segments: a torn read would show.
PAD = 256 * 1024
# Concurrent appenders finish in seconds; past this a writer is stuck, and the test says which, not the timeout.
WRITERS_TIMEOUT = 120.0

HOSTILE_NAMES = [
    "", "/etc/passwd", "../outside.json", "a/../../outside.json", "a/..", "..", ".", "a/./b", "a//b", "a/",
    "/", "a\\..\\b", "a\x00b", "a\nb", "tab\there", "esc\x1b[31m", "del\x7f", "c1\x85", "bidi\u202egnp.json",
    "x" * 256, f"a/{OWNER_FILE}",
]


def _fork() -> Any:
    return multiprocessing.get_context("fork")


def _doc(n: int) -> dict[str, Any]:
    # The size depends on n, so a mix of two documents is detected by a length that does not match.
    return {"n": n, "pad": "x" * (PAD + 4099 * (n % 7))}


def _whole(doc: Any) -> bool:
    return isinstance(doc, dict) and len(doc.get("pad", "")) == PAD + 4099 * (doc["n"] % 7)



def _while_appending(make_backend: MakeBackend, journal: str, per_writer: int, threads_n: int, procs_n: int,
                     interval: float, poll: Callable[[], object]) -> None:
    """Threads and processes, each with a client of its own, append to ``journal`` at once; ``poll`` meanwhile."""
    ctx = _fork()
    start = ctx.Event()

    def append(writer: str) -> None:
        backend = make_backend()
        start.wait()
        for i in range(per_writer):
            backend.append_record(journal, {"event": "e", "writer": writer, "i": i})

    threads = [threading.Thread(target=append, args=(f"t{w}",)) for w in range(threads_n)]
    procs = [ctx.Process(target=append, args=(f"p{w}",)) for w in range(procs_n)]
    # The processes fork before the threads start: a thread building its client (imports, botocore's caches) may
    # hold a lock at the moment of a fork, and the child, which has that lock but not the thread, then hangs.
    for x in [*procs, *threads]:
        x.start()
    start.set()
    deadline = time.monotonic() + WRITERS_TIMEOUT
    while any(t.is_alive() for t in threads) or any(p.is_alive() for p in procs):
        assert time.monotonic() < deadline, (
            f"writers still running after {WRITERS_TIMEOUT:.0f}s: threads "
            f"{[t.name for t in threads if t.is_alive()]}, processes {[p.pid for p in procs if p.is_alive()]}")
        poll()
        time.sleep(interval)
    for t in threads:
        t.join()
    for p in procs:
        p.join()
        assert p.exitcode == 0

class BackendConformance:
    """The guarantees every store backend gives; subclasses provide the ``make_backend`` fixture."""

    @pytest.fixture
    def backend(self, make_backend: MakeBackend) -> StoreBackend:
        """The store under test."""
        return make_backend()

    # -- 1. exclusive create ---------------------------------------------------------------------------

    def test_racing_threads_exclusive_create_has_one_winner_seen_whole(self, make_backend: MakeBackend) -> None:
        backends = [make_backend() for _ in range(4)]
        name = "run/stage/subtask=0/admitted.json"
        barrier = threading.Barrier(RACERS + 1)
        wins: list[int] = []
        torn: list[Any] = []
        done = threading.Event()

        def race(i: int) -> None:
            barrier.wait()
            if backends[i % len(backends)].create_exclusive_json(name, _doc(i)):
                wins.append(i)

        def read() -> None:
            barrier.wait()
            while not done.is_set():
                doc = backends[0].read_json(name)
                if doc is not None and not _whole(doc):
                    torn.append(doc)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(RACERS)]
        reader = threading.Thread(target=read)
        for t in [*threads, reader]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        reader.join()
        assert len(wins) == 1, f"{len(wins)} winners: {wins}"
        assert not torn
        assert backends[0].read_json(name) == _doc(wins[0])
        assert backends[0].list_names("run") == [name]  # no temporary object is left or listed

    def test_racing_processes_exclusive_create_has_one_winner(self, make_backend: MakeBackend) -> None:
        ctx = _fork()
        barrier, results = ctx.Barrier(PROCESS_RACERS), ctx.Queue()
        name = "_targets/t/slots/slot-0.json"

        def race(i: int) -> None:
            backend = make_backend()  # its own client, as a process on another host would have
            barrier.wait()
            results.put((i, backend.create_exclusive_json(name, {"writer": i})))

        procs = [ctx.Process(target=race, args=(i,)) for i in range(PROCESS_RACERS)]
        for p in procs:
            p.start()
        outcomes = dict(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        winners = [i for i, won in outcomes.items() if won]
        assert len(outcomes) == PROCESS_RACERS and len(winners) == 1, outcomes
        assert make_backend().read_json(name) == {"writer": winners[0]}

    def test_create_exclusive_never_overwrites(self, backend: StoreBackend) -> None:
        assert backend.create_exclusive("a/claim.json", b'{"first": true}') is True
        assert backend.create_exclusive("a/claim.json", b'{"second": true}') is False
        assert backend.read_json("a/claim.json") == {"first": True}

    # -- 2. atomic replace -----------------------------------------------------------------------------

    def test_replace_is_never_observed_torn(self, make_backend: MakeBackend) -> None:
        writer_backend, reader_backends = make_backend(), [make_backend() for _ in range(3)]
        name = "run/stage/plan.json"
        writer_backend.replace_json(name, _doc(0))
        stop = threading.Event()
        seen: list[int] = []
        torn: list[Any] = []

        def read(backend: StoreBackend) -> None:
            while not stop.is_set():
                doc = backend.read_json(name)
                if _whole(doc):
                    seen.append(doc["n"])
                else:
                    torn.append(str(doc)[:80])

        readers = [threading.Thread(target=read, args=(b,)) for b in reader_backends]
        for t in readers:
            t.start()
        try:
            for n in range(1, 41):
                writer_backend.replace_json(name, _doc(n))
        finally:
            stop.set()
            for t in readers:
                t.join()
        assert not torn, torn[:3]
        assert seen and set(seen) <= set(range(41))
        assert writer_backend.read_json(name) == _doc(40)
        assert writer_backend.list_names("run") == [name]

    # -- 3. read-after-write and 4. reads by name ------------------------------------------------------

    def test_read_after_write_from_another_client(self, make_backend: MakeBackend) -> None:
        one, other = make_backend(), make_backend()
        for n in range(5):
            one.replace_json("s/status.json", {"n": n})
            assert other.read_json("s/status.json") == {"n": n}
        assert other.read("s/missing.json") is None and other.read_json("s/missing.json", {}) == {}
        info = other.stat("s/status.json")
        assert info is not None and info.size == len(other.read("s/status.json") or b"") and info.mtime > 0
        assert other.stat("s/missing.json") is None and not other.exists("s/missing.json")

    def test_listing_and_children(self, backend: StoreBackend) -> None:
        for name in ("d/r/s1/plan.json", "d/r/s1/subtask=0/attempt=0/claim.json",
                     "d/r/s1/subtask=0/attempt=1/claim.json", "d/r/s2/plan.json", "d/rx/plan.json"):
            backend.replace(name, b"{}")
        assert backend.list_names("d/r") == ["d/r/s1/plan.json", "d/r/s1/subtask=0/attempt=0/claim.json",
                                             "d/r/s1/subtask=0/attempt=1/claim.json", "d/r/s2/plan.json"]
        assert backend.children("d/r/s1") == ["plan.json", "subtask=0/"]
        assert backend.children("d/r/s1/subtask=0") == ["attempt=0/", "attempt=1/"]
        assert backend.children("d") == ["r/", "rx/"]
        assert backend.children("nothing") == [] and backend.list_names("nothing") == []

    # -- 5. ordered journal ----------------------------------------------------------------------------

    def test_concurrent_appenders_lose_nothing_and_keep_each_writers_order(self, make_backend: MakeBackend) -> None:
        journal, per_writer, threads_n, procs_n = "d/r/s/journal.jsonl", 12, 6, 4
        reader = make_backend()
        snapshots: list[list[tuple[str, int]]] = []
        _while_appending(make_backend, journal, per_writer, threads_n, procs_n, 0.01,
                         lambda: snapshots.append([(r["writer"], r["i"]) for r in reader.read_journal(journal)]))
        final = [(r["writer"], r["i"]) for r in reader.read_journal(journal)]
        assert len(final) == (threads_n + procs_n) * per_writer and len(set(final)) == len(final)
        for writer in {w for w, _ in final}:
            assert [i for w, i in final if w == writer] == list(range(per_writer)), writer
        # One total order: what a reader saw earlier is a prefix of what it sees later.
        for snapshot in snapshots:
            assert final[:len(snapshot)] == snapshot

    def test_journal_of_nothing_is_empty(self, backend: StoreBackend) -> None:
        assert backend.read_journal("d/r/s/journal.jsonl") == []
        chunk = backend.read_journal_from("d/r/s/journal.jsonl")
        assert chunk.records == [] and not chunk.restarted
        backend.append_record("d/r/s/journal.jsonl", {"event": "first"})
        assert backend.read_journal_from("d/r/s/journal.jsonl", chunk.cursor).records == [{"event": "first"}]

    def test_incremental_reads_return_each_record_once_in_order_while_writers_append(
            self, make_backend: MakeBackend) -> None:
        journal, per_writer, threads_n, procs_n = "d/r/s/journal.jsonl", 12, 4, 3
        reader = make_backend()
        got: list[tuple[str, int]] = []
        reads = 0
        cursor: Any = None

        def read_more() -> None:
            nonlocal cursor, reads
            # Kept as JSON between reads, as a reader that persists its cursor would.
            chunk = reader.read_journal_from(journal, json.loads(json.dumps(cursor)))
            assert not chunk.restarted
            got.extend((r["writer"], r["i"]) for r in chunk.records)
            cursor, reads = chunk.cursor, reads + 1

        _while_appending(make_backend, journal, per_writer, threads_n, procs_n, 0.005, read_more)
        read_more()
        final = [(r["writer"], r["i"]) for r in reader.read_journal(journal)]
        assert len(final) == (threads_n + procs_n) * per_writer and len(set(final)) == len(final)
        assert got == final, "incremental reads lost, repeated or reordered a record"
        assert reads > 2
        # Nothing new: an empty read that keeps its place.
        chunk = reader.read_journal_from(journal, cursor)
        assert chunk.records == [] and not chunk.restarted
        reader.append_record(journal, {"event": "last", "writer": "x", "i": 0})
        assert make_backend().read_journal_from(journal, chunk.cursor).records == [
            {"event": "last", "writer": "x", "i": 0}]  # another client continues from the cursor

    def test_incremental_read_of_a_replaced_journal_starts_again_and_says_so(self, backend: StoreBackend) -> None:
        journal = "runs/a/s/journal.jsonl"
        backend.claim("runs/a")
        for i in range(3):
            backend.append_record(journal, {"event": "old", "i": i})
        cursor = backend.read_journal_from(journal).cursor
        backend.delete_prefix("runs/a")
        gone = backend.read_journal_from(journal, cursor)
        assert gone.records == [] and gone.restarted
        for i in range(4):
            backend.append_record(journal, {"event": "new", "i": i})
        again = backend.read_journal_from(journal, cursor)
        assert again.restarted and again.records == [{"event": "new", "i": i} for i in range(4)]
        assert backend.read_journal_from(journal, again.cursor).records == []

    def test_a_journal_deleted_by_its_appender_and_appended_again_is_read_whole(
            self, make_backend: MakeBackend) -> None:
        # The appender that deleted the journal must not continue its old numbering (on S3 a gap at the start
        # of the new journal would hide its records from every reader), whoever appends first afterwards.
        ours, other = make_backend(), make_backend()
        journal = "runs/a/s/journal.jsonl"
        ours.claim("runs/a")
        for i in range(3):
            ours.append_record(journal, {"event": "old", "i": i})
        ours.delete_prefix("runs/a")
        other.append_record(journal, {"event": "new", "i": 0})
        ours.append_record(journal, {"event": "new", "i": 1})
        other.append_record(journal, {"event": "new", "i": 2})
        expected = [{"event": "new", "i": i} for i in range(3)]
        assert ours.read_journal(journal) == expected
        assert make_backend().read_journal_from(journal).records == expected

    def test_a_cursor_not_from_this_store_is_refused(self, backend: StoreBackend) -> None:
        backend.append_record("d/journal.jsonl", {"event": "x"})
        with pytest.raises(StoreError, match=r"d/journal.*not a journal cursor"):
            backend.read_journal_from("d/journal.jsonl", "elsewhere:7")
        with pytest.raises(UnsafeStoreNameError):
            backend.read_journal_from("../journal.jsonl")

    # -- 6. owned deletes ------------------------------------------------------------------------------

    def test_delete_needs_this_stores_marker(self, make_backend: MakeBackend) -> None:
        ours, theirs = make_backend(), make_backend(owner="another-store")
        ours.replace("runs/a/plan.json", b"{}")
        with pytest.raises(StoreNotOwnedError, match=r"runs/a/plan\.json.*no ownership marker"):
            ours.delete("runs/a/plan.json")
        with pytest.raises(StoreNotOwnedError, match="no ownership marker"):
            ours.delete_prefix("runs/a")
        assert not ours.owns("runs/a")
        ours.claim("runs/a")
        assert ours.claim("runs/a")["owner"] == ours.owner  # claiming again is a no-op
        assert ours.owns("runs/a") and ours.owns("runs/a/deeper") and not ours.owns("runs")
        # Another store never gets the prefix, nor deletes in it.
        with pytest.raises(StoreNotOwnedError, match=r"runs/a.*owned by another store"):
            theirs.claim("runs/a")
        with pytest.raises(StoreNotOwnedError, match="owned by another store"):
            theirs.delete("runs/a/plan.json")
        with pytest.raises(StoreNotOwnedError, match="owned by another store"):
            theirs.delete_prefix("runs/a")
        # Outside the owned prefix: refused.
        ours.replace("runs/b/plan.json", b"{}")
        with pytest.raises(StoreNotOwnedError, match=r"runs/b/plan\.json"):
            ours.delete("runs/b/plan.json")
        assert ours.read("runs/b/plan.json") == b"{}" and ours.read("runs/a/plan.json") == b"{}"
        # Inside: allowed.
        assert ours.delete("runs/a/plan.json") is True
        assert ours.delete("runs/a/plan.json") is False
        assert ours.read("runs/a/plan.json") is None

    def test_the_marker_cannot_be_forged_or_deleted_alone(self, backend: StoreBackend) -> None:
        backend.claim("runs/a")
        for call in (lambda: backend.replace(f"runs/a/{OWNER_FILE}", b"{}"),
                     lambda: backend.create_exclusive(f"runs/x/{OWNER_FILE}", b"{}"),
                     lambda: backend.delete(f"runs/a/{OWNER_FILE}"),
                     lambda: backend.delete_prefix(f"runs/a/{OWNER_FILE}")):
            with pytest.raises(UnsafeStoreNameError, match="ownership marker"):
                call()
        assert backend.owns("runs/a")
        with pytest.raises(UnsafeStoreNameError, match="empty"):
            backend.delete_prefix("")  # never the whole store

    def test_delete_prefix_removes_all_marker_last_and_refuses_a_foreign_prefix_below(
            self, make_backend: MakeBackend) -> None:
        ours, theirs = make_backend(), make_backend(owner="another-store")
        ours.claim("runs/a")
        for name in ("runs/a/s/plan.json", "runs/a/s/subtask=0/attempt=0/claim.json", "runs/keep/plan.json"):
            ours.replace(name, b"{}")
        ours.append_record("runs/a/s/journal.jsonl", {"event": "x"})
        theirs.claim("runs/a/nested")
        theirs.replace("runs/a/nested/data.json", b"{}")
        before = ours.list_names("runs")
        with pytest.raises(StoreNotOwnedError, match=r"runs/a/nested.*another store.*nothing was deleted"):
            ours.delete_prefix("runs/a")
        assert ours.list_names("runs") == before
        assert theirs.delete_prefix("runs/a/nested") == 2
        assert ours.delete_prefix("runs/a") >= 4
        assert ours.list_names("runs") == ["runs/keep/plan.json"]
        assert not ours.owns("runs/a")

    def test_a_prefix_below_another_stores_root_cannot_be_claimed_by_deleting(self, make_backend: MakeBackend) -> None:
        ours, theirs = make_backend(), make_backend(owner="another-store")
        theirs.claim("")
        ours.replace("theirs/plan.json", b"{}")
        with pytest.raises(StoreNotOwnedError, match="owned by another store"):
            ours.delete("theirs/plan.json")
        assert theirs.delete("theirs/plan.json") is True

    def test_delete_many_refuses_all_before_deleting_any_and_skips_missing_names(self, backend: StoreBackend) -> None:
        backend.claim("runs/a")
        for name in ("runs/a/s/changes/0.0.x", "runs/a/s/changes/0.1.y", "runs/b/s/changes/0.0.z"):
            assert backend.create_exclusive(name, b"")
        with pytest.raises(StoreNotOwnedError, match="no ownership marker"):
            backend.delete_many(["runs/a/s/changes/0.0.x", "runs/b/s/changes/0.0.z"])
        assert backend.exists("runs/a/s/changes/0.0.x") and backend.exists("runs/b/s/changes/0.0.z")
        backend.delete_many(["runs/a/s/changes/0.0.x", "runs/a/s/changes/0.1.y", "runs/a/s/changes/9.9.gone"])
        assert backend.list_names("runs/a/s") == []
        with pytest.raises(UnsafeStoreNameError):
            backend.delete_many(["runs/a/_owner.json"])
        assert backend.owns("runs/a")

    # -- batches of objects ----------------------------------------------------------------------------

    def test_stat_all_gives_what_stat_gives_and_a_new_etag_or_size_per_write(self, backend: StoreBackend) -> None:
        backend.replace("s/subtask=0/attempt=0/status.json", b'{"state": "RUNNING"}')
        backend.create_exclusive("s/subtask=0/attempt=0/data/part-0", b"rows")
        backend.create_exclusive("s/subtask=0/admitted.json", b"{}")
        infos = backend.stat_all("s")
        assert [i.name for i in infos] == backend.list_names("s")
        for info in infos:
            stat = backend.stat(info.name)
            assert stat is not None and (info.size, info.etag) == (stat.size, stat.etag)
            assert abs(info.mtime - stat.mtime) < 1.0
        before = {i.name: i for i in infos}["s/subtask=0/attempt=0/status.json"]
        backend.replace("s/subtask=0/attempt=0/status.json", b'{"state": "FINISHED"}')
        after = {i.name: i for i in backend.stat_all("s")}["s/subtask=0/attempt=0/status.json"]
        # Where there is an ETag it tells the new document from the old; else the size does here.
        assert (after.etag, after.size) != (before.etag, before.size)

    # -- names -----------------------------------------------------------------------------------------

    @pytest.mark.parametrize("name", HOSTILE_NAMES, ids=[repr(n)[:24] for n in HOSTILE_NAMES])
    def test_hostile_names_are_refused_with_a_clear_error(self, backend: StoreBackend, name: str) -> None:
        calls: list[Callable[[], Any]] = [
            lambda: backend.create_exclusive(name, b"{}"), lambda: backend.replace(name, b"{}"),
            lambda: backend.replace_json(name, {}), lambda: backend.append_record(name, {"event": "x"}),
            lambda: backend.delete(name), lambda: backend.delete_prefix(name)]
        if name:  # "" is the root: claiming it is fine
            calls.append(lambda: backend.claim(name))
        if name != f"a/{OWNER_FILE}":  # reading or listing a marker by name is harmless; writing one is not
            calls += [lambda: backend.read(name), lambda: backend.read_json(name), lambda: backend.stat(name),
                      lambda: backend.read_journal(name), lambda: backend.read_range(name, 0, 1)]
            if name:  # "" is the root: listing it is fine
                calls += [lambda: backend.list_names(name), lambda: backend.children(name)]
        for call in calls:
            with pytest.raises(UnsafeStoreNameError) as err:
                call()
            assert repr(name)[1:-1][:40] in str(err.value) and "refused" in str(err.value)
        assert backend.list_names("") == []

    # -- errors ----------------------------------------------------------------------------------------

    def test_errors_name_the_object(self, backend: StoreBackend) -> None:
        backend.replace("d/r/s/committed.json", b"{not json")
        with pytest.raises(StoreError, match=r"corrupt JSON in .*d/r/s/committed\.json"):
            backend.read_json("d/r/s/committed.json")
        assert "d/r/s/committed.json" in backend.describe("d/r/s/committed.json")
        assert backend.url in repr(backend)

    # -- ranged reads ----------------------------------------------------------------------------------

    def test_a_ranged_read_returns_the_range_and_nothing_past_the_end(self, backend: StoreBackend) -> None:
        data = b"".join(b"line %d\n" % i for i in range(100))
        backend.replace("d/r/s/subtask=0/attempt=0/spark-submit.log", data)
        name = "d/r/s/subtask=0/attempt=0/spark-submit.log"
        assert backend.read_range(name, 10, 20) == data[10:30]
        assert backend.read_range(name, len(data) - 4, 100) == data[-4:]
        assert backend.read_range(name, len(data), 100) == b""
        assert backend.read_range("d/r/s/missing.log", 0, 10) is None
