"""The store backend interface on POSIX: the conformance suite (conformance.py) and what only POSIX has.

The same suite runs against the S3 endpoint in tests/integration/test_store_backends.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_provider_speculative.exceptions import StoreError, StoreNotWritableError, UnsafeStorePathError
from airflow_provider_speculative.store import files
from airflow_provider_speculative.store.backend import (
    OWNER_FILE,
    PosixBackend,
    S3Backend,
    StoreBackend,
    StoreNotOwnedError,
    UnsafeStoreNameError,
    check_name,
    open_backend,
)
from tests.unit.store.conformance import BackendConformance


class TestPosixConformance(BackendConformance):
    """Every guarantee, on a local directory."""

    @pytest.fixture
    def make_backend(self, tmp_path: Path) -> Callable[..., StoreBackend]:
        """A POSIX backend on this test's directory (``owner=`` names another store there)."""
        return lambda owner=None: PosixBackend(tmp_path / "store", owner=owner)


def test_posix_writes_the_bytes_store_files_writes(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    doc = {"b": [1, 2], "a": {"z": None}}
    backend.replace_json("x/plan.json", doc)
    files.atomic_write_json(tmp_path / "y" / "plan.json", doc)
    assert (tmp_path / "x/plan.json").read_bytes() == (tmp_path / "y/plan.json").read_bytes()
    backend.create_exclusive_json("x/claim.json", doc)
    files.create_exclusive_json(tmp_path / "y" / "claim.json", doc)
    assert (tmp_path / "x/claim.json").read_bytes() == (tmp_path / "y/claim.json").read_bytes()
    backend.append_record("x/journal.jsonl", doc)
    files.append_jsonl(tmp_path / "y" / "journal.jsonl", doc)
    assert (tmp_path / "x/journal.jsonl").read_bytes() == (tmp_path / "y/journal.jsonl").read_bytes()
    assert backend.read_journal("x/journal.jsonl") == [doc]
    assert json.loads((tmp_path / "x/plan.json").read_text()) == doc


def test_posix_paths_and_names(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    assert backend.path("a/b.json") == tmp_path / "a" / "b.json" and backend.path("") == tmp_path
    assert backend.name_of(tmp_path / "a" / "b.json") == "a/b.json"
    with pytest.raises(UnsafeStoreNameError, match="not under the store root"):
        backend.name_of(tmp_path.parent / "elsewhere.json")
    with pytest.raises(UnsafeStoreNameError, match=r"'\.\.' segment"):
        backend.name_of(tmp_path / ".." / "x")
    assert backend.url == "file://" + str(tmp_path) and backend.owner == backend.url
    assert repr(backend) == f"PosixBackend('file://{tmp_path}')"
    assert isinstance(open_backend(str(tmp_path)), PosixBackend)
    assert open_backend(f"file://{tmp_path}").root == tmp_path  # type: ignore[attr-defined]


def test_temporary_files_of_a_write_in_flight_are_not_listed(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    backend.replace("d/plan.json", b"{}")
    (tmp_path / "d" / ".plan.json.abc123.tmp").write_text("{")
    assert backend.list_names("d") == ["d/plan.json"] and backend.children("d") == ["plan.json"]


def test_a_symlink_never_redirects_a_delete_or_a_marker(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.json").write_text("{}")
    backend = PosixBackend(root)
    backend.claim("runs")
    (root / "runs" / "linked").symlink_to(outside)
    with pytest.raises(UnsafeStorePathError):
        backend.delete("runs/linked/precious.json")
    with pytest.raises(UnsafeStorePathError):
        backend.delete_prefix("runs/linked")
    assert (outside / "precious.json").exists()
    # A marker reached through a link proves nothing.
    (outside / OWNER_FILE).write_text(json.dumps({"owner": backend.owner, "prefix": "runs/linked"}))
    (root / "runs" / "linked").unlink()
    (root / "other").symlink_to(outside)
    with pytest.raises(UnsafeStorePathError):
        backend.delete("other/precious.json")
    assert (outside / "precious.json").exists()
    # The listing does not follow the link either.
    assert backend.list_names("") == [f"runs/{OWNER_FILE}"]


def test_a_fifo_where_an_object_should_be_is_refused_without_blocking(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    os.mkfifo(tmp_path / "status.json")
    with pytest.raises(StoreError, match=r"status\.json"):
        backend.read("status.json")
    with pytest.raises(StoreError, match=r"status\.json"):
        backend.read_json("status.json")


def test_write_errors_name_the_path(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    backend.replace("a", b"{}")
    with pytest.raises(StoreError, match=r"cannot write .*/a/b\.json"):
        backend.replace("a/b.json", b"{}")  # a file where a directory should be
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(StoreNotWritableError, match=r"ro/x\.json"):
            backend.replace("ro/x.json", b"{}")


def test_an_unreadable_marker_is_nobodys_proof(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / OWNER_FILE).write_text("{not json")
    backend.replace("runs/plan.json", b"{}")
    with pytest.raises(StoreError):
        backend.delete("runs/plan.json")
    assert backend.read("runs/plan.json") == b"{}"
    (tmp_path / "runs" / OWNER_FILE).write_text(json.dumps({"owner": backend.owner, "prefix": "elsewhere"}))
    with pytest.raises(StoreNotOwnedError, match="owned by another store"):
        backend.delete("runs/plan.json")


@pytest.mark.parametrize("name", ["plan.json", "dag/run/stage/subtask=3/attempt=12/_SUCCESS", "_targets/t/slots",
                                  "d/run_2026-01-01T00_00_00_00_00-1a2b3c4d/s", "ünïcode/名前.json"])
def test_names_the_layout_makes_are_valid(name: str) -> None:
    assert check_name(name) == name


def test_s3_urls_are_checked_and_shown_without_credentials() -> None:
    for url in ("s3://", "gs://bucket/x", "s3://user:secret@bucket/x", "s3://bucket/x?versionId=1"):
        with pytest.raises(StoreError) as err:
            S3Backend(url, client=object())  # type: ignore[arg-type]
        assert "secret" not in str(err.value)
    backend = S3Backend("s3://bucket/some/prefix/", client=object())  # type: ignore[arg-type]
    assert backend.url == "s3://bucket/some/prefix" and backend.base == "some/prefix"
    assert repr(backend) == "S3Backend('s3://bucket/some/prefix')"
    assert S3Backend.journal_prefix("d/r/s/journal.jsonl") == "d/r/s/journal"
    with pytest.raises(UnsafeStoreNameError):
        S3Backend("s3://bucket/a/../b", client=object())  # type: ignore[arg-type]


class _ServiceError(Exception):
    """What botocore's ClientError carries that S3Backend looks at: the parsed response."""

    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(f"An error occurred ({code}): {message}")
        self.response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}


class _ScriptedClient:
    """A stand-in boto3 client whose put_object answers from a script (an exception or a success)."""

    def __init__(self, *answers: Exception | None, ours: bool = False) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.ours = ours
        self.marks: list[object] = []

    def put_object(self, **kwargs: object) -> dict[str, object]:
        self.calls += 1
        self.marks.append(kwargs.get("Metadata"))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return {}

    def head_object(self, **kwargs: object) -> dict[str, object]:
        """What the key holds after a 412: another writer's object, or our own first try's if ``ours``."""
        return {"Metadata": self.marks[0] if self.ours else {"speculative-writer": "another"}}


def test_s3_conditional_create_asks_again_after_a_conflict_and_loses_on_412() -> None:
    conflict = _ServiceError(409, "ConditionalRequestConflict")
    client = _ScriptedClient(conflict, conflict, None)
    assert S3Backend("s3://b/p", client=client).create_exclusive("claim.json", b"{}") is True  # type: ignore[arg-type]
    assert client.calls == 3
    client = _ScriptedClient(conflict, _ServiceError(412, "PreconditionFailed"))
    assert S3Backend("s3://b/p", client=client).create_exclusive("claim.json", b"{}") is False  # type: ignore[arg-type]
    # A 412 over our own first try (its mark): botocore resent a put whose answer was lost, and that try won.
    client = _ScriptedClient(_ServiceError(412, "PreconditionFailed"), ours=True)
    assert S3Backend("s3://b/p", client=client).create_exclusive("claim.json", b"{}") is True  # type: ignore[arg-type]


def test_s3_errors_carry_the_code_not_the_services_message() -> None:
    secret_echo = _ServiceError(403, "SignatureDoesNotMatch", "StringToSign ... wJalrXUtnFEMI/K7MDENG")
    backend = S3Backend("s3://b/p", client=_ScriptedClient(secret_echo))  # type: ignore[arg-type]
    with pytest.raises(StoreNotWritableError) as err:
        backend.replace("d/plan.json", b"{}")
    assert str(err.value) == ("store is not writable: cannot write s3://b/p/d/plan.json: "
                              "SignatureDoesNotMatch (HTTP 403)")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_store_modules_reach_the_store_through_the_layouts_backend(tmp_path: Path) -> None:
    from airflow_provider_speculative.store import journal
    from airflow_provider_speculative.store.layout import StageLayout

    layout = StageLayout(tmp_path, "dag", "manual__2026-01-01T00:00:00+00:00", "scan")
    assert layout.store.root == tmp_path and layout.store is layout.store
    assert layout.name(layout.plan) == f"dag/{layout.run_dir.name}/scan/plan.json"
    with pytest.raises(UnsafeStoreNameError):
        layout.name(tmp_path.parent / "plan.json")
    journal.append(layout.store, layout.name(layout.journal), "launched", at=1.0, subtask=0)
    journal.Journal(layout.journal, lambda: 2.0, subtask=1)("won")
    assert journal.read(layout.journal) == [{"at": 1.0, "event": "launched", "subtask": 0},
                                            {"at": 2.0, "event": "won", "subtask": 1}]
    layout.store.create_exclusive_json(layout.name(layout.claim(0, 3)), {})
    (layout.subtask_dir(0) / "attempt=x").mkdir()
    (layout.subtask_dir(0) / "admitted.json").write_text("{}")
    assert layout.attempt_numbers(0) == [3] and layout.attempt_numbers(7) == []


def test_posix_journal_written_again_under_a_reused_inode_number_is_read_from_its_start(tmp_path: Path) -> None:
    # A deleted file's inode number is free at once: a journal removed and written again may get it back, and
    # be longer than the reader's offset. Its first line tells it apart.
    backend = PosixBackend(tmp_path)
    journal = "d/journal.jsonl"
    for i in range(3):
        backend.append_record(journal, {"event": "old", "i": i})
    old = backend.read_journal_from(journal)
    backend.path(journal).unlink()
    for i in range(5):
        backend.append_record(journal, {"event": "new", "i": i})
    _, _, offset, head = old.cursor.split(":")
    reused = f"posix:{backend.path(journal).stat().st_ino}:{offset}:{head}"
    again = backend.read_journal_from(journal, reused)
    assert again.restarted and [(r["event"], r["i"]) for r in again.records] == [("new", i) for i in range(5)]
    # The same journal grown: only what is new, and a cursor without the fingerprint (older versions) still reads.
    backend.append_record(journal, {"event": "new", "i": 5})
    assert backend.read_journal_from(journal, again.cursor).records == [{"event": "new", "i": 5}]
    assert not backend.read_journal_from(journal, again.cursor.rsplit(":", 1)[0]).restarted


def test_posix_incremental_journal_read_follows_the_inode_and_never_a_link_or_fifo(tmp_path: Path) -> None:
    backend = PosixBackend(tmp_path)
    journal = "d/journal.jsonl"
    for i in range(3):
        backend.append_record(journal, {"i": i})
    chunk = backend.read_journal_from(journal)
    assert [r["i"] for r in chunk.records] == [0, 1, 2] and chunk.cursor.startswith("posix:")
    # Replaced by a rename (another inode), even a longer file: read again from its start.
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"i": 10 + i}) + "\n" for i in range(5)))
    os.replace(other, backend.path(journal))
    replaced = backend.read_journal_from(journal, chunk.cursor)
    assert replaced.restarted and [r["i"] for r in replaced.records] == [10, 11, 12, 13, 14]
    # Truncated in place (same inode, shorter than the cursor's offset): from its start too.
    backend.path(journal).write_text(json.dumps({"i": 20}) + "\n")
    truncated = backend.read_journal_from(journal, replaced.cursor)
    assert truncated.restarted and truncated.records == [{"i": 20}]
    # Lines that are not JSON objects are not records; a complete line that is not UTF-8 is an error.
    with open(backend.path(journal), "ab") as handle:
        handle.write(b"\n[1]\n7\n{\"i\": 21}\r\n")
    assert backend.read_journal_from(journal, truncated.cursor).records == [{"i": 21}]
    backend.path(journal).write_bytes(b'{"i": 1}\n\xff\n')
    with pytest.raises(StoreError, match=r"journal\.jsonl"):
        backend.read_journal_from(journal)
    backend.path(journal).write_bytes(b'{"i": 1}\n{"x": "\xc3')  # a torn line cut inside a character
    assert backend.read_journal_from(journal).records == [{"i": 1}]
    backend.path(journal).unlink()
    os.symlink(other.parent / "elsewhere.jsonl", backend.path(journal))
    (tmp_path / "elsewhere.jsonl").write_text('{"secret": 1}\n')
    with pytest.raises(StoreError, match="symbolic link"):
        backend.read_journal_from(journal)
    backend.path(journal).unlink()
    os.mkfifo(backend.path(journal))
    with pytest.raises(StoreError, match="not a regular file"):
        backend.read_journal_from(journal)


class _WholeJournalReads(PosixBackend):
    """A backend with no incremental read of its own: StoreBackend's fallback, which counts records read."""

    _read_journal_from = StoreBackend._read_journal_from


def test_the_fallback_incremental_read_counts_records_and_restarts_on_a_shorter_journal(tmp_path: Path) -> None:
    backend = _WholeJournalReads(tmp_path)
    backend.claim("d")
    first = backend.read_journal_from("d/journal.jsonl")
    assert first.records == [] and not first.restarted
    for i in range(3):
        backend.append_record("d/journal.jsonl", {"i": i})
    second = backend.read_journal_from("d/journal.jsonl", json.loads(json.dumps(first.cursor)))
    assert [r["i"] for r in second.records] == [0, 1, 2]
    backend.append_record("d/journal.jsonl", {"i": 3})
    third = backend.read_journal_from("d/journal.jsonl", second.cursor)
    assert third.records == [{"i": 3}] and not third.restarted
    backend.delete("d/journal.jsonl")
    backend.append_record("d/journal.jsonl", {"i": 9})
    again = backend.read_journal_from("d/journal.jsonl", third.cursor)
    assert again.restarted and again.records == [{"i": 9}]
    with pytest.raises(StoreError, match="not a journal cursor"):
        backend.read_journal_from("d/journal.jsonl", "posix:1:0")


def test_posix_a_torn_last_line_is_returned_only_once_complete(tmp_path: Path) -> None:
    # Only a POSIX journal has lines: an S3 record is one object, whole or absent.
    backend = PosixBackend(tmp_path)
    journal = "d/r/s/journal.jsonl"
    backend.append_record(journal, {"event": "launch", "attempt": 0})
    path = backend.path(journal)
    line = json.dumps({"event": "admit", "attempt": 0}).encode() + b"\n"
    with open(path, "ab") as handle:
        handle.write(line[:9])  # a record being appended
    first = backend.read_journal_from(journal)
    assert first.records == [{"event": "launch", "attempt": 0}] and first.unterminated == []
    with open(path, "ab") as handle:
        handle.write(line[9:-1])  # whole JSON, still without its newline: counted, not consumed
    second = backend.read_journal_from(journal, first.cursor)
    assert second.records == [] and second.unterminated == [{"event": "admit", "attempt": 0}]
    assert second.cursor == first.cursor
    with open(path, "ab") as handle:
        handle.write(b"\n")
    third = backend.read_journal_from(journal, second.cursor)
    assert third.records == [{"event": "admit", "attempt": 0}] and third.unterminated == []
    backend.append_record(journal, {"event": "cancel"})
    assert backend.read_journal_from(journal, third.cursor).records == [{"event": "cancel"}]
    assert backend.read_journal(journal) == [{"event": "launch", "attempt": 0}, {"event": "admit", "attempt": 0},
                                             {"event": "cancel"}]
