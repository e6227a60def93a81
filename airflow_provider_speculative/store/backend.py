"""The store's backends: the six guarantees of docs/store.md behind one interface, for POSIX and for S3.

A store is addressed by **names**: ``/``-separated keys relative to the store root (``dag/run/stage/plan.json``).
Every backend gives:

1. **exclusive create** (:meth:`StoreBackend.create_exclusive`): of N writers of one name exactly one
   wins, and readers see the winner whole or not at all;
2. **atomic replace** (:meth:`StoreBackend.replace`): a reader sees the old or the new content;
3. **read-after-write**: what a call wrote is seen by the next read, from any process or host;
4. **read of a named object** (:meth:`StoreBackend.read`): data is found by name (a manifest names its
   files); :meth:`StoreBackend.list_names` is for discovering names, never proof that data is complete;
5. **ordered journal** (:meth:`StoreBackend.append_record`, :meth:`StoreBackend.read_journal`,
   :meth:`StoreBackend.read_journal_from`): concurrent appenders lose no record, and readers get one total
   order in which each writer's records keep the order it wrote them; a reader that keeps a cursor reads
   only what was appended since;
6. **owned deletes** (:meth:`StoreBackend.delete`, :meth:`StoreBackend.delete_prefix`): only under a
   prefix whose ownership marker (``_owner.json``, created exclusively by :meth:`StoreBackend.claim`)
   names this store; never the marker itself, never below a prefix another store claimed.

Attempt output needs four more, none of them a guarantee of its own: :meth:`StoreBackend.spark_url` (where
Spark writes and reads a name), :meth:`StoreBackend.open_read` (a streamed read, for checksums),
:meth:`StoreBackend.arrow_path` and :meth:`StoreBackend.parquet_metadata` (Parquet footers through ``pyarrow.fs``).

:class:`PosixBackend` uses exactly the calls the store always used (``store/files.py``: a hard link of a
complete temporary file, ``rename``, one ``write`` to an ``O_APPEND`` file). :class:`S3Backend` uses
``PutObject`` with ``If-None-Match: *``, a plain ``PutObject``, and one object per journal record.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import hashlib
import io
import json
import os
import re
import stat
import threading
import time
import unicodedata
import uuid
import zlib
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, Protocol
from urllib.parse import quote, unquote, urlsplit

from airflow_provider_speculative.exceptions import StoreError, StoreNotWritableError, UnsafeStorePathError
from airflow_provider_speculative.store import files

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from pyarrow.fs import FileSystem
    from pyarrow.parquet import FileMetaData

OWNER_FILE = "_owner.json"
# Longest segment most file systems take (NAME_MAX), and the longest key S3 takes.
MAX_SEGMENT_BYTES = 255
MAX_S3_KEY_BYTES = 1024
# S3 journal records: ``<journal>/<seq>.json``, zero-padded so that key order is sequence order.
_SEQ_DIGITS = 12
_SEQ_NAME = re.compile(rf"^(\d{{{_SEQ_DIGITS}}})\.json$")
# After this many taken sequence numbers in a row an appender lists the journal again to skip ahead.
_RELIST_AFTER = 8
_CONFLICT_RETRIES = 10
_READ_THREADS = 16
# The user metadata key (``x-amz-meta-…``) by which a conditional create knows its own object after a resend.
WRITER_METADATA = "speculative-writer"
# Seconds a store request on S3 waits to connect, and between two reads of an answer, before botocore resends it.
S3_CONNECT_TIMEOUT = 5.0
S3_READ_TIMEOUT = 15.0
# A copy through this process moves this much at a time; S3 copies one object server-side up to 5 GiB.
_COPY_CHUNK = 1 << 20
_MAX_SINGLE_COPY = 5 << 30
_TEMP_NAME = re.compile(r"^\..+\.tmp$")
# Journal cursors (opaque to callers): POSIX ``posix:<inode>:<byte offset>[:<first line's crc32>]``, S3
# ``s3:<next number>:<ETag of the record before it>``, any other backend ``count:<records read>``; plain
# strings, so a reader can keep one in JSON.
_POSIX_CURSOR = re.compile(r"^posix:(\d+):(\d+)(?::([0-9a-f]{8}))?$")
_S3_CURSOR = re.compile(r"^s3:(\d+):(.*)$", re.DOTALL)
_COUNT_CURSOR = re.compile(r"^count:(\d+)$")


class UnsafeStoreNameError(UnsafeStorePathError):
    """A store name that could leave its prefix or mean different objects on different backends: refused."""


class StoreNotOwnedError(StoreError):
    """A delete outside a prefix this store owns (no ownership marker, or another store's): refused."""


@dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`StoreBackend.stat` knows about an object: its name, size in bytes and modification time."""

    name: str
    size: int
    mtime: float
    links: int = 1
    """How many names share this object's bytes: POSIX hard links (``st_nlink``); 1 where there are none (S3)."""
    identity: str = ""
    """What every name sharing these bytes has in common (POSIX ``<device>:<inode>``); ``""``: the name alone."""
    etag: str | None = None
    """The object's entity tag where the backend has one (S3: changes with every write); None on POSIX."""


class PrefixVersion(NamedTuple):
    """What :meth:`StoreBackend.prefix_version` found: a key that changes with the prefix's entries, and when."""

    key: tuple[int, ...]
    changed_at: float


@dataclass(frozen=True)
class JournalChunk:
    """What :meth:`StoreBackend.read_journal_from` read: new records, the next cursor, and whether it started over."""

    records: list[dict[str, Any]]
    """The complete records after the cursor, in the journal's order; each is returned by exactly one read."""
    cursor: str
    """Where the next read starts: opaque, a string that survives JSON, valid for this journal on this store."""
    restarted: bool = False
    """The journal was replaced, truncated or removed since the cursor: ``records`` start from its beginning,
    and whatever the caller kept from earlier reads is no longer in it."""
    unterminated: list[dict[str, Any]] = field(default_factory=list)
    """POSIX: the record of a last line still without its newline, if it parses (:meth:`StoreBackend.read_journal`
    counts it); not consumed, so the next read returns it again in ``records`` once the line is complete."""


class S3Credentials(Protocol):
    """Where an S3 endpoint is and who we are there (``hooks/objectstore.py``'s ``S3Settings`` is one)."""

    @property
    def endpoint_url(self) -> str | None:
        """The endpoint (None: AWS's)."""

    @property
    def region(self) -> str | None:
        """The region (None: us-east-1)."""

    @property
    def access_key(self) -> str | None:
        """The access key id (None: the SDK's default credential chain)."""

    @property
    def secret_key(self) -> str | None:
        """The secret access key."""

    @property
    def session_token(self) -> str | None:
        """A session token of temporary credentials."""


def _refuse(name: str, why: str) -> UnsafeStoreNameError:
    # repr() shows control characters escaped: the message is readable whatever the name holds.
    return UnsafeStoreNameError(f"store name {name!r} refused: {why}")


def check_name(name: str, *, prefix: bool = False) -> str:
    """Return ``name`` if it is a valid store name (a prefix may be ``""``, the root); raise UnsafeStoreNameError.

    Valid: ``/``-separated segments, none empty, ``.`` or ``..``, no leading ``/``, no backslash, no control
    character, each segment at most 255 bytes. Such a name means the same object on every backend and
    can never reach outside the store.
    """
    if not isinstance(name, str):
        raise UnsafeStoreNameError(f"store name {name!r} refused: not a string")
    if name == "":
        if prefix:
            return name
        raise _refuse(name, "empty")
    if name.startswith("/"):
        raise _refuse(name, "absolute (starts with '/')")
    if "\\" in name:
        raise _refuse(name, "contains a backslash")
    # Printable ASCII has none of these: the common case skips the per-character lookup (hot in listings).
    if not (name.isascii() and name.isprintable()) and any(
            unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise _refuse(name, "contains a control or format character")
    for segment in name.split("/"):
        if segment == "":
            raise _refuse(name, "has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise _refuse(name, f"has a {segment!r} segment")
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise _refuse(name, f"has a segment longer than {MAX_SEGMENT_BYTES} bytes")
    return name


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _ancestors(name: str) -> Iterator[str]:
    """``a/b/c`` -> ``a/b``, ``a``, ``""``: the prefixes above a name, nearest first."""
    parts = name.split("/")
    for end in range(len(parts) - 1, -1, -1):
        yield "/".join(parts[:end])


class StoreBackend(abc.ABC):
    """One store root on one kind of storage, offering the six guarantees (module docstring)."""

    _owner: str | None = None

    @property
    def owner(self) -> str:
        """What names this store in ownership markers (the root URL unless given)."""
        return self._owner or self.url

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The root as a URL (``file:///…``, ``s3://bucket/prefix``), without any credential."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def describe(self, name: str) -> str:
        """How errors show object ``name``: its full URL or path."""
        return _join(self.url, name)

    # -- the primitives each backend implements ------------------------------------------------------

    @abc.abstractmethod
    def _create_exclusive(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` unless it exists (False then); readers never see it partial."""

    @abc.abstractmethod
    def _replace(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` atomically."""

    @abc.abstractmethod
    def _read(self, name: str) -> bytes | None:
        """The content of ``name``, or None if there is none."""

    @abc.abstractmethod
    def _stat(self, name: str) -> ObjectInfo | None:
        """Size and mtime of ``name``, or None if there is none."""

    @abc.abstractmethod
    def _list(self, prefix: str) -> list[str]:
        """Names of every object below ``prefix``, sorted."""

    @abc.abstractmethod
    def _children(self, prefix: str) -> list[str]:
        """Entries right below ``prefix``, sorted: objects by name, sub-prefixes with a trailing ``/``."""

    @abc.abstractmethod
    def _append(self, journal: str, record: dict[str, Any]) -> None:
        """Append ``record`` to ``journal``."""

    @abc.abstractmethod
    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        """Every complete record of ``journal`` in its order."""

    def _read_journal_from(self, journal: str, cursor: str | None) -> JournalChunk:
        """The complete records of ``journal`` after ``cursor`` (None: from the start) and the next cursor.

        This fallback reads the whole journal and skips the records counted in the cursor: correct on any
        backend that keeps guarantee 5 (what a reader saw stays a prefix), but each read costs the whole
        journal, so the POSIX and S3 backends read only what is new.
        """
        seen = 0
        if cursor is not None:
            match = _COUNT_CURSOR.match(cursor)
            if match is None:
                raise StoreError(f"cannot read {self.describe(journal)}: {cursor!r} is not a journal cursor "
                                 "of this store")
            seen = int(match.group(1))
        records = self._read_journal(journal)
        if len(records) < seen:
            return JournalChunk(records, f"count:{len(records)}", restarted=True)
        return JournalChunk(records[seen:], f"count:{len(records)}")

    @abc.abstractmethod
    def _read_marker(self, prefix: str) -> Any:
        """The ownership marker of ``prefix`` (None if there is none), read without following links."""

    @abc.abstractmethod
    def _delete(self, name: str) -> bool:
        """Delete object ``name``; False if it was not there."""

    @abc.abstractmethod
    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        """Delete ``names`` (all below ``prefix``) and ``prefix`` itself; return how many objects went."""

    # -- the interface -----------------------------------------------------------------------------

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` only if it does not exist; True for the one writer that did."""
        return self._create_exclusive(self._writable(name), data)

    def create_exclusive_json(self, name: str, obj: Any) -> bool:
        """:meth:`create_exclusive` of ``obj`` as JSON (the bytes ``store/files.py`` writes for a claim)."""
        return self.create_exclusive(name, files.json_claim(obj))

    def replace(self, name: str, data: bytes) -> None:
        """Make ``data`` the content of ``name`` atomically: readers see the old or the new, never a mix."""
        self._replace(self._writable(name), data)

    def replace_json(self, name: str, obj: Any) -> None:
        """:meth:`replace` with ``obj`` as JSON (the bytes ``store/files.py`` writes for a document)."""
        self.replace(name, files.json_document(obj))

    def read(self, name: str) -> bytes | None:
        """The content of the object named ``name``, or None if it does not exist."""
        return self._read(check_name(name))

    def read_json(self, name: str, default: Any = None) -> Any:
        """The JSON document ``name``; ``default`` if it does not exist; StoreError naming it if corrupt."""
        return self.read_document(name, default)

    def read_document(self, name: str, default: Any = None) -> Any:
        """:meth:`read_json` in one :meth:`read` of the object, whatever the backend's ``read_json`` checks more.

        For callers that checked the prefix above ``name`` themselves: on POSIX ``read_json`` opens every
        directory on the way to refuse a link there, ``read`` refuses only a link or a FIFO as the object.
        """
        data = self.read(name)
        if data is None:
            return default
        try:
            return json.loads(data)
        except ValueError as exc:
            raise StoreError(f"corrupt JSON in {self.describe(name)}: {exc}") from None

    def stat(self, name: str) -> ObjectInfo | None:
        """Size and modification time of ``name``, or None if it does not exist."""
        return self._stat(check_name(name))

    def exists(self, name: str) -> bool:
        """True if object ``name`` exists."""
        return self.stat(name) is not None

    def list_names(self, prefix: str = "") -> list[str]:
        """Names of all objects below ``prefix``, sorted: for finding names, never as proof data is whole."""
        return self._list(check_name(prefix, prefix=True))

    def children(self, prefix: str = "") -> list[str]:
        """Entries right below ``prefix``, sorted; a sub-prefix ends with ``/`` (one listing, no reads)."""
        return self._children(check_name(prefix, prefix=True))

    def append_record(self, journal: str, record: dict[str, Any]) -> None:
        """Append ``record`` to the journal ``journal``; concurrent appenders never lose one."""
        self._append(self._writable(journal), record)

    def read_journal(self, journal: str) -> list[dict[str, Any]]:
        """Every complete record of ``journal``, in one total order that keeps each writer's order."""
        return self._read_journal(check_name(journal))

    def read_journal_from(self, journal: str, cursor: str | None = None) -> JournalChunk:
        """The records of ``journal`` appended after ``cursor`` (None or ``""``: from the start), and the next cursor.

        Reading again from each returned cursor yields every record exactly once, in :meth:`read_journal`'s
        order, while writers append. A record still being written is not returned until it is complete.
        ``restarted`` says the journal was replaced since the cursor (see :class:`JournalChunk`). A cursor is
        opaque: only one this backend returned for this journal is valid; anything else is a StoreError.
        """
        return self._read_journal_from(check_name(journal), cursor or None)

    # -- ownership and deletes -----------------------------------------------------------------------

    def claim(self, prefix: str = "") -> dict[str, Any]:
        """Own ``prefix`` (``""``: the root): create its marker exclusively, or find it already ours.

        Raises :class:`StoreNotOwnedError` naming the prefix when another store's marker is there.
        """
        if prefix:
            self._writable(prefix)
        marker_name = _join(prefix, OWNER_FILE)
        record = {"owner": self.owner, "prefix": prefix, "token": uuid.uuid4().hex, "at": time.time()}
        self._create_exclusive(marker_name, files.json_claim(record))
        found = self._read_marker(prefix)
        if not self._ours(found, prefix):
            raise StoreNotOwnedError(f"prefix {self.describe(prefix)!r} is owned by another store "
                                     f"({_owner_of(found)}), not by {self.owner!r}")
        return dict(found)

    def owns(self, prefix: str) -> bool:
        """True if the nearest ownership marker at or above ``prefix`` is this store's."""
        try:
            self._require_owned(check_name(prefix, prefix=True), parent_only=False)
        except StoreNotOwnedError:
            return False
        return True

    def delete(self, name: str) -> bool:
        """Delete object ``name`` if this store owns a prefix above it (see :meth:`claim`); False if missing."""
        self._writable(name)
        self._require_owned(name, parent_only=True)
        return self._delete(name)

    def delete_prefix(self, prefix: str) -> int:
        """Delete everything below ``prefix`` (its own marker last); return the number of objects deleted.

        Refused (nothing deleted) unless this store owns ``prefix`` and no prefix below it is claimed by
        another store; the root itself is never deleted this way.
        """
        self._writable(prefix)
        self._require_owned(prefix, parent_only=False)
        names = self._list(prefix)
        for name in names:
            if name.rsplit("/", 1)[-1] == OWNER_FILE and name != _join(prefix, OWNER_FILE):
                below = name[:-len(OWNER_FILE) - 1]
                marker = self._read_marker(below)
                if not self._ours(marker, below):
                    raise StoreNotOwnedError(
                        f"cannot delete {self.describe(prefix)!r}: {self.describe(below)!r} below it is owned by "
                        f"another store ({_owner_of(marker)}); nothing was deleted")
        return self._delete_tree(prefix, names)

    def _ours(self, marker: Any, prefix: str) -> bool:
        return isinstance(marker, dict) and marker.get("owner") == self.owner and marker.get("prefix") == prefix

    def _require_owned(self, name: str, *, parent_only: bool) -> None:
        candidates = list(_ancestors(name)) if parent_only else [name, *_ancestors(name)]
        for prefix in candidates:
            marker = self._read_marker(prefix)
            if marker is None:
                continue
            if self._ours(marker, prefix):
                return
            raise StoreNotOwnedError(f"cannot delete {self.describe(name)!r}: {self.describe(prefix)!r} is owned by "
                                     f"another store ({_owner_of(marker)}), not by {self.owner!r}")
        raise StoreNotOwnedError(f"cannot delete {self.describe(name)!r}: no ownership marker ({OWNER_FILE}) of "
                                 f"this store at or above it")

    def _writable(self, name: str) -> str:
        check_name(name)
        if name.rsplit("/", 1)[-1] == OWNER_FILE:
            raise _refuse(name, f"{OWNER_FILE} is the ownership marker: only claim() creates it")
        return name

    # -- attempt output: what Spark and the manifest need ----------------------------------------------

    parallel_reads = 1
    """How many objects a reader of many (hashing an attempt's files) may read at once: 1 on a local disk."""

    def spark_url(self, name: str) -> str:
        """Where Spark reads or writes object or prefix ``name``: a path or URL its file systems take."""
        return self._spark_url(check_name(name))

    def _spark_url(self, name: str) -> str:
        raise StoreError(f"cannot hand {self.describe(name)} to Spark: {type(self).__name__} has no URL Spark reads")

    def open_read(self, name: str) -> BinaryIO | None:
        """Object ``name`` opened for a streamed binary read (the caller closes it), or None if it does not exist.

        For hashing large objects: nothing holds a whole object in memory (but this fallback, for backends
        without a stream of their own, e.g. a test double).
        """
        return self._open_read(check_name(name))

    def _open_read(self, name: str) -> BinaryIO | None:
        data = self._read(name)
        return None if data is None else io.BytesIO(data)

    def arrow_path(self, name: str) -> tuple[FileSystem, str]:
        """A ``pyarrow.fs`` file system and the path of object ``name`` in it (Parquet footers, ranged reads)."""
        return self._arrow_path(check_name(name))

    def _arrow_path(self, name: str) -> tuple[FileSystem, str]:
        raise StoreError(f"cannot read {self.describe(name)} with pyarrow: {type(self).__name__} has no pyarrow "
                         "file system")

    def parquet_metadata(self, name: str) -> FileMetaData:
        """The Parquet footer (``pyarrow.parquet.FileMetaData``) of object ``name``, read through :meth:`arrow_path`."""
        import pyarrow.parquet as pq

        filesystem, path = self.arrow_path(name)
        with filesystem.open_input_file(path) as handle:
            return pq.ParquetFile(handle).metadata

    # -- housekeeping (gc): what a walk of the store needs beyond names ---------------------------------

    def claimed(self, prefix: str) -> bool:
        """True if ``prefix`` itself carries this store's ownership marker.

        Unlike :meth:`owns`, a marker above ``prefix`` does not count: a DAG run is the provider's only by its
        own marker, whatever the store root's marker says (the root is claimed when the store is created).
        """
        prefix = check_name(prefix, prefix=True)
        return self._ours(self._read_marker(prefix), prefix)

    def claimed_at(self, prefix: str) -> float | None:
        """When this store claimed ``prefix`` itself (its marker's time); None if the marker there is not its own."""
        prefix = check_name(prefix, prefix=True)
        marker = self._read_marker(prefix)
        if not self._ours(marker, prefix):
            return None
        at = marker.get("at")
        return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None

    def stat_all(self, prefix: str = "") -> list[ObjectInfo]:
        """:meth:`stat` of every object below ``prefix``, by name: sizes, mtimes, ETags (never proof data is whole)."""
        return self._stat_all(check_name(prefix, prefix=True))

    def _stat_all(self, prefix: str) -> list[ObjectInfo]:
        # One stat per listed name; a backend whose listing carries sizes (S3) answers from the listing alone.
        return [info for name in self._list(prefix) if (info := self._stat(name)) is not None]

    def temporaries(self, prefix: str, *, recursive: bool = True, skip: Collection[str] = ()) -> list[ObjectInfo]:
        """Temporary objects this backend's own writes left below ``prefix`` (a writer that died mid-write).

        Listings never show them; gc removes the old ones by :meth:`delete`. ``recursive=False`` looks right
        below ``prefix`` only; sub-prefixes whose last segment is in ``skip`` are not looked into. None on a
        backend whose writes need no temporary object (S3: a ``PutObject`` is whole or absent).
        """
        check_name(prefix, prefix=True)
        return []

    def prune_empty(self, prefix: str) -> bool:
        """Remove ``prefix`` if nothing is left below it; True if something was removed.

        On a backend with real directories (POSIX) a directory outlives its last object, so this removes it
        when empty (no object is ever deleted, hence no ownership check). Where a prefix exists only through
        its objects (S3) an empty prefix is already gone: nothing to do. Never the root.
        """
        return self._prune_empty(self._writable(prefix))

    def _prune_empty(self, prefix: str) -> bool:
        return False

    # -- batches: many small objects without a request or a marker walk per object -------------------

    def prefix_version(self, prefix: str) -> PrefixVersion | None:
        """A key that changes whenever an object right below ``prefix`` is created, replaced or removed.

        Read without listing the prefix (a directory's stat on POSIX); None where the backend has no such
        thing (object stores: compare :meth:`stat_all` of an enclosing prefix instead) or no such prefix.
        """
        return None

    def delete_many(self, names: Iterable[str]) -> None:
        """Delete every object of ``names`` as :meth:`delete` does; missing ones are skipped.

        Each parent prefix's ownership is checked once, and all of them before anything is deleted: a
        refusal (StoreNotOwnedError) deletes nothing.
        """
        wanted = [self._writable(name) for name in names]
        checked: set[str] = set()
        for name in wanted:
            parent = name.rpartition("/")[0]
            if parent not in checked:
                self._require_owned(name, parent_only=True)
                checked.add(parent)
        self._delete_many(wanted)

    def _delete_many(self, names: list[str]) -> None:
        """Delete ``names`` (ownership already checked), one by one unless the backend batches."""
        for name in names:
            self._delete(name)

    # -- copies: publishing another backend's object under a name of this one ---------------------------

    def copy_from(self, name: str, source: StoreBackend, source_name: str) -> str | None:
        """Replace ``name`` with a copy of object ``source_name`` of ``source``; the copy's SHA-256 (hex) if known.

        Readers see the old object or the whole copy (an atomic replace). None: the bytes never passed
        through this process and the service reported no checksum (a multipart server-side copy); the
        caller then checks the size. This fallback reads the whole object into memory (a test double).
        """
        self._writable(name)
        stream = source.open_read(source_name)
        if stream is None:
            raise StoreError(f"cannot copy {source.describe(source_name)}: it does not exist")
        with stream:
            data = stream.read()
        self._replace(name, data)
        return hashlib.sha256(data).hexdigest()

    @property
    def notice_poll_seconds(self) -> float:
        """How often a waiting controller looks for a change notice (a listing of the notices' prefix).

        1 s on a store where each look is a request (S3: one ``ListObjectsV2`` per stage per look, a thousand
        stages waiting make a thousand requests a second); a directory read on POSIX is cheap and polled faster.
        """
        return 1.0

    # -- ranged reads: a log's tail, or what was appended since a reader's offset -------------------------

    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        """Up to ``length`` bytes of object ``name`` from byte ``offset``; None if it does not exist.

        Fewer bytes at the object's end, ``b""`` at or past it. For attempt logs, which may be gigabytes: a
        tail (:meth:`stat`'s size, then the last bytes) or a follow from an offset, never the whole object.
        """
        if offset < 0 or length < 0:
            raise ValueError(f"a ranged read needs offset >= 0 and length >= 0, got {offset} and {length}")
        return self._read_range(check_name(name), offset, length)

    def _read_range(self, name: str, offset: int, length: int) -> bytes | None:
        # A backend without ranged reads of its own (a test double) reads the object whole.
        data = self._read(name)
        return None if data is None else data[offset:offset + length]

    # -- integrity: a content token the store computes itself ---------------------------------------------

    content_token: str | None = None
    """The token every object's :class:`ObjectInfo` carries that changes whenever its bytes do, computed by the
    store itself (``"etag"``: S3's ETag in every listing); None: none, manifests carry SHA-256 (POSIX)."""

    # -- packed exchanges: a file's footer and one column's value counts ---------------------------------

    def parquet_value_counts(self, name: str, column: str) -> tuple[FileMetaData, dict[int, int]]:
        """The Parquet footer of object ``name`` and the row count of each value of its integer ``column``.

        One open through :meth:`arrow_path`: the footer, then only that column's chunks are read (a sorted
        subpartition column is a few bytes per page).
        """
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        filesystem, path = self.arrow_path(name)
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            if column not in parquet.schema_arrow.names:
                raise StoreError(f"{self.describe(name)} has no column {column!r}: not a packed exchange file")
            counted = pc.value_counts(parquet.read(columns=[column]).column(column))
            counts = {int(v["values"]): int(v["counts"]) for v in counted.to_pylist() if v["values"] is not None}
            return parquet.metadata, counts


def _owner_of(marker: Any) -> str:
    if isinstance(marker, dict) and isinstance(marker.get("owner"), str):
        return f"its marker names {marker['owner']!r}"
    return "its marker is not this provider's"


def _posix_cursor(inode: int, offset: int, head: str | None = None) -> str:
    return f"posix:{inode}:{offset}" + (f":{head}" if head else "")


# How much of a journal's first line identifies the file (with its inode) in a POSIX cursor.
_HEAD_BYTES = 4096


def _head_print(first: bytes) -> str | None:
    """A fingerprint of a journal's first line (``first``: its first bytes), or None while that line is torn.

    An inode number is reused as soon as a file is deleted, so a journal removed and written again can come
    back under the inode a reader's cursor names; its first record (an event with its time) tells them apart.
    """
    end = first.find(b"\n")
    if end < 0 and len(first) < _HEAD_BYTES:
        return None
    return f"{zlib.crc32(first[:end] if end >= 0 else first):08x}"


def _journal_lines(where: Path, data: bytes, *, torn: bool = False) -> list[dict[str, Any]]:
    """The records of journal lines as ``files.read_jsonl`` takes them: blank, unparseable and non-object lines skipped.

    Complete lines that are not UTF-8 are a StoreError, as for a full read; a ``torn`` last line cut inside a
    character is just not a record yet.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if torn:
            return []
        raise StoreError(f"cannot read {where}: {exc}") from None
    records = []
    # Text-mode line ends, as read_jsonl's iteration sees them (\n, \r\n and \r).
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


# -- POSIX ----------------------------------------------------------------------------------------------


class PosixBackend(StoreBackend):
    """A store in a local or shared POSIX directory: the calls of ``store/files.py``, unchanged."""

    def __init__(self, root: str | Path, *, owner: str | None = None) -> None:
        self.root = Path(os.fspath(root))  # a StorePath (store/layout.py) refuses here
        self._owner = owner

    @property
    def url(self) -> str:
        """``file://`` and the absolute root."""
        return "file://" + quote(os.path.abspath(self.root))

    def describe(self, name: str) -> str:
        """The path of ``name`` (what ``store/files.py`` names in its errors)."""
        return str(self.root / name)

    def path(self, name: str) -> Path:
        """The local path of object ``name`` (for what still needs a path: Spark, attempt logs)."""
        return self.root / check_name(name, prefix=True) if name else self.root

    def name_of(self, path: str | Path) -> str:
        """The store name of ``path``, a path under the root; UnsafeStoreNameError if it is not one."""
        try:
            relative = Path(path).relative_to(self.root)
        except ValueError:
            raise UnsafeStoreNameError(f"{str(path)!r} is not under the store root {str(self.root)!r}") from None
        return check_name(relative.as_posix())

    def _create_exclusive(self, name: str, data: bytes) -> bool:
        return files.create_exclusive_bytes(self.root / name, data)

    def _replace(self, name: str, data: bytes) -> None:
        files.atomic_write_bytes(self.root / name, data)

    def _read(self, name: str) -> bytes | None:
        try:
            with files.open_regular_bytes(self.root / name) as handle:
                data: bytes = handle.read()
                return data
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self.root / name}: {exc.strerror or exc}") from exc

    def read_json(self, name: str, default: Any = None) -> Any:
        """JSON of the object, reached from the root without following any symlink; ``default`` if missing."""
        path = self.root / check_name(name)
        try:
            found = files.read_json_in_store(self.root, path)
        except UnsafeStorePathError as exc:
            # The object's own name, never where a link points.
            raise UnsafeStorePathError(f"cannot read {name}: {exc}") from None
        except StoreError:
            # Every other failure (a directory, a name too long, corrupt bytes) as files.read_json reports it.
            return files.read_json(path, default)
        return default if found is None else found

    def _stat(self, name: str) -> ObjectInfo | None:
        try:
            info = os.stat(self.root / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot stat {self.root / name}: {exc.strerror or exc}") from exc
        return ObjectInfo(name, info.st_size, info.st_mtime, info.st_nlink, f"{info.st_dev}:{info.st_ino}")

    def _list(self, prefix: str) -> list[str]:
        base = self.root / prefix if prefix else self.root
        names = []
        # os.walk does not descend into symlinked directories: a link never widens a listing.
        for current, _dirs, entries in os.walk(base):
            relative = Path(current).relative_to(self.root).as_posix()
            for entry in entries:
                if not _TEMP_NAME.match(entry):
                    names.append(entry if relative == "." else f"{relative}/{entry}")
        return sorted(names)

    def _children(self, prefix: str) -> list[str]:
        try:
            with os.scandir(self.root / prefix if prefix else self.root) as entries:
                return sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "")
                              for e in entries if not _TEMP_NAME.match(e.name))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _append(self, journal: str, record: dict[str, Any]) -> None:
        files.append_jsonl(self.root / journal, record)

    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        return files.read_jsonl(self.root / journal)

    def _read_journal_from(self, journal: str, cursor: str | None) -> JournalChunk:
        # The file only grows by whole-line appends: a cursor is its inode, the offset after the last complete
        # line read and a fingerprint of the first line. Another inode, a file shorter than the offset or
        # another first line is another journal.
        path = self.root / journal
        known: int | None = None
        offset = 0
        head: str | None = None
        if cursor is not None:
            match = _POSIX_CURSOR.match(cursor)
            if match is None:
                raise StoreError(f"cannot read {path}: {cursor!r} is not a journal cursor of this store")
            known, offset, head = int(match.group(1)), int(match.group(2)), match.group(3)
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return JournalChunk([], "", restarted=known is not None)
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if known == info.st_ino and info.st_size == offset:
            # Nothing appended: the file is not even opened (a journal replaced by one of exactly this size
            # under the same inode number is seen once it grows).
            return JournalChunk([], _posix_cursor(known, offset, head))
        try:
            # Not a FIFO (it would block a reader for ever), not a symlink (another file's lines as records).
            with files.open_regular_bytes(path) as handle:
                opened = os.fstat(handle.fileno())
                now_head = _head_print(handle.read(_HEAD_BYTES))
                restarted = known is not None and (opened.st_ino != known or opened.st_size < offset
                                                   or (head is not None and now_head != head))
                if restarted:
                    offset = 0
                handle.seek(offset)
                data = handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return JournalChunk([], "", restarted=known is not None)
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
        end = data.rfind(b"\n") + 1
        return JournalChunk(_journal_lines(path, data[:end]), _posix_cursor(opened.st_ino, offset + end, now_head),
                            restarted=restarted, unterminated=_journal_lines(path, data[end:], torn=True))

    def _read_marker(self, prefix: str) -> Any:
        return files.read_json_in_store(self.root, self.root / _join(prefix, OWNER_FILE))

    def _delete(self, name: str) -> bool:
        return files.remove_in_store(self.root, self.root / name)

    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        return len(names) if files.remove_in_store(self.root, self.root / prefix, tree=True) else 0

    def _spark_url(self, name: str) -> str:
        # The path itself, as attempts always handed it to Spark (the file: scheme implied).
        return str(self.root / name)

    def _open_read(self, name: str) -> BinaryIO | None:
        path = self.root / name
        try:
            # Not a FIFO (it would block the reader for ever), not a symlink (another file's bytes as this one's).
            return files.open_regular_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def _arrow_path(self, name: str) -> tuple[FileSystem, str]:
        from pyarrow.fs import LocalFileSystem

        return LocalFileSystem(), str(self.root / name)

    def temporaries(self, prefix: str, *, recursive: bool = True, skip: Collection[str] = ()) -> list[ObjectInfo]:
        """The temporary files of interrupted atomic writes (``.<name>.<random>.tmp``) below ``prefix``."""
        base = self.root / check_name(prefix, prefix=True) if prefix else self.root
        found = []
        # os.walk does not descend into symlinked directories; a temporary file is never followed (lstat).
        for current, dirs, entries in os.walk(base):
            dirs[:] = [d for d in dirs if recursive and d not in skip]
            relative = Path(current).relative_to(self.root).as_posix()
            for entry in entries:
                if not _TEMP_NAME.match(entry):
                    continue
                try:
                    info = os.lstat(os.path.join(current, entry))
                except OSError:
                    continue  # renamed or linked into place since the listing: not left over
                found.append(ObjectInfo(entry if relative == "." else f"{relative}/{entry}", info.st_size,
                                        info.st_mtime, info.st_nlink, f"{info.st_dev}:{info.st_ino}"))
        return sorted(found, key=lambda info: info.name)

    def _prune_empty(self, prefix: str) -> bool:
        try:
            os.rmdir(self.root / prefix)  # refused for a directory that still holds anything
        except OSError:
            return False
        return True

    def prefix_version(self, prefix: str) -> PrefixVersion | None:
        """The directory's (inode, mtime, ctime) in ns: every entry created, renamed over or removed changes them.

        None unless ``prefix`` is a directory itself (a symlink to one is not followed; the root's own may be).
        """
        # A string path, not pathlib: a poll of a large stage asks this for every subtask and attempt.
        path = os.path.join(self.root, check_name(prefix, prefix=True)) if prefix else self.root
        try:
            info = os.stat(path, follow_symlinks=not prefix)
        except (OSError, ValueError):
            return None
        if not stat.S_ISDIR(info.st_mode):
            return None
        return PrefixVersion((info.st_ino, info.st_mtime_ns, info.st_ctime_ns), info.st_mtime_ns / 1e9)

    def copy_from(self, name: str, source: StoreBackend, source_name: str) -> str | None:
        """Copy ``source``'s object into a temporary file next to ``name`` (fsync), then rename it over ``name``."""
        self._writable(name)
        stream = source.open_read(source_name)
        if stream is None:
            raise StoreError(f"cannot copy {source.describe(source_name)}: it does not exist")
        digest = hashlib.sha256()

        def chunks() -> Iterator[bytes]:
            while block := stream.read(_COPY_CHUNK):
                digest.update(block)
                yield block

        with stream:
            files.atomic_write_chunks(self.root / name, chunks())
        return digest.hexdigest()

    @property
    def notice_poll_seconds(self) -> float:
        """0.1 s: a look for a change notice is one read of a local or mounted directory."""
        return 0.1

    def _read_range(self, name: str, offset: int, length: int) -> bytes | None:
        path = self.root / name
        try:
            # As _read: not a FIFO (it would block the reader for ever), not a symlink (another file's bytes).
            with files.open_regular_bytes(path) as handle:
                handle.seek(offset)
                data: bytes = handle.read(length)
                return data
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc


# -- S3 -------------------------------------------------------------------------------------------------


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return f"{error.get('Code') or 'error'} (HTTP {status})" if status else str(error.get("Code") or "error")
    return type(exc).__name__


def _objects(page: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of one ListObjectsV2 page, less directory markers (keys ending in ``/``: never a store name)."""
    return [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return int(status) if status else None
    return None


class S3Backend(StoreBackend):
    """A store under ``s3://bucket/prefix`` (boto3): conditional create, whole-object replace, one object per record.

    Credentials stay in the boto3 client: ``repr`` shows the URL only, and errors name the object and the
    service's error code, never the service's message, the request or a key.
    """

    # How long a remembered next journal number is used without asking whether the record before it still
    # exists (seconds; see _append), and the clock that measures it.
    journal_trust_seconds: float = 1.0
    _clock = staticmethod(time.monotonic)

    def __init__(self, url: str, credentials: S3Credentials | None = None, *, owner: str | None = None,
                 client: BaseClient | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("s3", "s3a") or not parts.netloc or "@" in parts.netloc or parts.query \
                or parts.fragment:
            raise StoreError(f"not an s3://bucket/prefix URL for a store: {_shown_url(url)!r}")
        self.bucket = parts.netloc
        self.base = unquote(parts.path).strip("/")
        if self.base:
            check_name(self.base)
        self._owner = owner
        self._client = client if client is not None else _client(credentials)
        # Journal prefix -> (the next number to try, when this client last knew the record before it existed).
        self._next_seq: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._arrow = _ArrowS3(credentials)
        # Once the bucket answered, a HEAD's 404 is a missing key: an attempt's supervisor probes its absent
        # cancel request every few seconds, and each probe would otherwise ask for the bucket too.
        self._bucket_seen = False

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.base}".rstrip("/")

    def _key(self, name: str) -> str:
        key = _join(self.base, name)
        if len(key.encode()) > MAX_S3_KEY_BYTES:
            raise _refuse(name, f"its key is longer than the {MAX_S3_KEY_BYTES} bytes S3 takes")
        return key

    def _fail(self, name: str, action: str, exc: Exception) -> StoreError:
        what = f"cannot {action} {self.describe(name)}: {_error_code(exc)}"
        if _status(exc) == 403 and action in ("create", "write", "delete"):
            return StoreNotWritableError(f"store is not writable: {what}")
        return StoreError(what)

    def _create_exclusive(self, name: str, data: bytes) -> bool:
        key = self._key(name)
        # botocore resends a put whose answer was lost (a timeout, a reset connection), and the resend meets our
        # own first try with a 412. Only this call's mark in the object's metadata tells that apart from another
        # writer's object: equal bytes do not (two reclaimers at one clock tick write the same record).
        writer = uuid.uuid4().hex
        for attempt in range(_CONFLICT_RETRIES):
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*",
                                        Metadata={WRITER_METADATA: writer})
                return True
            except Exception as exc:  # botocore's ClientError and transport errors
                status = _status(exc)
                if status == 412:
                    return self._written_by(key, writer)
                if status == 409 and attempt + 1 < _CONFLICT_RETRIES:
                    # ConditionalRequestConflict: another conditional write of the key is in flight; ask again.
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise self._fail(name, "create", exc) from None
        return False  # unreachable: the last attempt returns or raises

    def _written_by(self, key: str, writer: str) -> bool:
        """Whether the object at ``key`` carries ``writer``'s mark (False if it is gone or cannot be read)."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        except Exception:
            return False  # not known to be ours: the create is reported lost
        return bool((head.get("Metadata") or {}).get(WRITER_METADATA) == writer)

    def _replace(self, name: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except Exception as exc:
            raise self._fail(name, "write", exc) from None

    def _read(self, name: str) -> bytes | None:
        return self._get(name)

    def _get(self, name: str, byte_range: str | None = None) -> bytes | None:
        """One GetObject, whole or of ``byte_range`` (a Range header): None if missing, b"" past the end."""
        extra = {} if byte_range is None else {"Range": byte_range}
        try:
            for attempt in range(_BODY_TRIES):
                body = self._client.get_object(Bucket=self.bucket, Key=self._key(name), **extra)["Body"]
                try:
                    data: bytes = body.read()
                except Exception as exc:
                    # botocore resends a request that got no answer, not one whose body stalled or broke
                    # off; a read is idempotent, so ask again.
                    if attempt + 1 < _BODY_TRIES and _transient_body_error(exc):
                        continue
                    raise
                finally:
                    body.close()
                return data
            raise AssertionError("unreachable: the last try returns or raises")
        except Exception as exc:
            if _status(exc) == 404 and _error_code(exc).startswith("NoSuchKey"):
                return None
            if byte_range is not None and _status(exc) == 416:
                return b""  # InvalidRange: the object exists and ends at or before the range's start
            raise self._fail(name, "read", exc) from None

    def _stat(self, name: str) -> ObjectInfo | None:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as exc:
            # HEAD has no body, so no error code: a 404 is a missing key once the bucket is known to exist.
            if _status(exc) == 404 and self._bucket_exists():
                return None
            raise self._fail(name, "stat", exc) from None
        return ObjectInfo(name, int(head["ContentLength"]), head["LastModified"].timestamp(), etag=head.get("ETag"))

    def _bucket_exists(self) -> bool:
        if self._bucket_seen:
            return True
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception:
            return False
        self._bucket_seen = True
        return True

    def _pages(self, prefix: str, **extra: Any) -> Iterator[dict[str, Any]]:
        key_prefix = self._key(prefix) + "/" if prefix else (self.base + "/" if self.base else "")
        try:
            yield from self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=key_prefix, **extra)
        except Exception as exc:
            raise self._fail(prefix, "list", exc) from None

    def _relative(self, key: str) -> str:
        return key[len(self.base) + 1:] if self.base else key

    def _list(self, prefix: str) -> list[str]:
        return sorted(self._relative(o["Key"]) for page in self._pages(prefix) for o in _objects(page))

    def _children(self, prefix: str) -> list[str]:
        out = []
        for page in self._pages(prefix, Delimiter="/"):
            out += [self._relative(o["Key"]).rsplit("/", 1)[-1] for o in _objects(page)]
            out += [self._relative(p["Prefix"]).rstrip("/").rsplit("/", 1)[-1] + "/"
                    for p in page.get("CommonPrefixes", [])]
        return sorted(out)

    # The journal: record n is the object ``<journal>/<n>.json``, created exclusively. n is tried only once
    # n - 1 is known to exist (written by this appender, found taken, or listed), so numbers have no gaps
    # and a record's number is above every number its writer had written or seen: key order is one total
    # order keeping each writer's order, and a reader that saw n never later finds a new record below n.

    @staticmethod
    def journal_prefix(journal: str) -> str:
        """Where the records of ``journal`` live: ``x/journal.jsonl`` -> ``x/journal`` (one object per record)."""
        return journal[:-len(".jsonl")] if journal.endswith(".jsonl") else journal

    def _sequence_numbers(self, prefix: str) -> list[int]:
        numbers = []
        for name in self._list(prefix):
            match = _SEQ_NAME.match(name.rsplit("/", 1)[-1])
            if match and name.count("/") == prefix.count("/") + 1:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def _append(self, journal: str, record: dict[str, Any]) -> None:
        prefix = self.journal_prefix(journal)
        check_name(prefix)
        body = files.json_line(record)
        seq = self._remembered_seq(prefix)
        if seq is None:
            seq = (self._sequence_numbers(prefix) or [0])[-1] + 1
        taken = 0
        while True:
            if seq >= 10 ** _SEQ_DIGITS:
                raise StoreError(f"journal {self.describe(prefix)} is full ({10 ** _SEQ_DIGITS - 1} records)")
            if self._create_exclusive(f"{prefix}/{seq:0{_SEQ_DIGITS}d}.json", body):
                with self._lock:
                    known = self._next_seq.get(prefix)
                    if known is None or known[0] <= seq + 1:
                        self._next_seq[prefix] = (seq + 1, self._clock())
                return
            taken += 1
            seq += 1
            if taken % _RELIST_AFTER == 0:
                seq = max(seq, (self._sequence_numbers(prefix) or [0])[-1] + 1)

    def _remembered_seq(self, prefix: str) -> int | None:
        """The next number this client remembers for journal ``prefix``, unless the record before it is gone.

        The journal may have been deleted since (gc removing its run, another client's ``delete_prefix``) and
        started again at 1 by a client that listed it; appending at the remembered number would then leave a
        gap, and readers stop before a gap, so this and every later record would be hidden. Trade-off: a HEAD
        of record n - 1 before every append would catch that at one extra request per record. Instead the
        number is used as is for ``journal_trust_seconds`` after this client last knew n - 1 existed (its own
        append of it: every append renews it), then checked by one HEAD. A burst of events costs one PutObject
        each; an appender coming back to a journal later pays one HEAD. Not caught: another client deleting
        and restarting the journal within that window after this client's last append (as on POSIX, an
        append racing the removal of its journal is not protected). This client's own deletes forget the
        number at once (:meth:`_forget_journals`).
        """
        with self._lock:
            known = self._next_seq.get(prefix)
        if known is None:
            return None
        seq, known_at = known
        if self._clock() - known_at < self.journal_trust_seconds:
            return seq
        if self._stat(self._record_name(prefix, seq - 1)) is None:
            with self._lock:
                if self._next_seq.get(prefix) == known:
                    del self._next_seq[prefix]
            return None
        return seq

    def _forget_journals(self, name: str) -> None:
        """Drop the remembered numbers of the journals a delete of ``name`` (an object or a prefix) touched."""
        with self._lock:
            for prefix in [p for p in self._next_seq
                           if p == name or p.startswith(name + "/") or name.startswith(p + "/")]:
                del self._next_seq[prefix]

    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        prefix = self.journal_prefix(journal)
        names = [f"{prefix}/{n:0{_SEQ_DIGITS}d}.json" for n in self._sequence_numbers(prefix)]
        with ThreadPoolExecutor(max_workers=min(_READ_THREADS, max(1, len(names)))) as pool:
            bodies = list(pool.map(self._read, names))
        records = []
        for body in bodies:
            try:
                record = json.loads(body) if body is not None else None
            except ValueError:
                continue  # as a torn line of a POSIX journal: not a complete record
            if isinstance(record, dict):
                records.append(record)
        return records

    def _read_journal_from(self, journal: str, cursor: str | None) -> JournalChunk:
        # A cursor is the next record number and the ETag of the record before it. Numbers have no gaps and
        # a new record is never numbered below one a reader saw, so listing from the last record read finds
        # exactly what was appended since; that record itself must come first, unchanged, or the journal was
        # removed or replaced.
        prefix = self.journal_prefix(journal)
        check_name(prefix)
        following, before = 1, ""
        if cursor is not None:
            match = _S3_CURSOR.match(cursor)
            if match is None or int(match.group(1)) < 1:
                raise StoreError(f"cannot read {self.describe(prefix)}: {cursor!r} is not a journal cursor "
                                 "of this store")
            following, before = int(match.group(1)), match.group(2)
        listed = self._numbered(prefix, after=following - 2)
        if following > 1:
            if not listed or listed[0] != (following - 1, before):
                fresh = self._read_journal_from(journal, None)
                return JournalChunk(fresh.records, fresh.cursor, restarted=True)
            listed = listed[1:]
        elif listed:
            following = listed[0][0]  # appenders number from 1; records below the first one listed are gone
        run: list[tuple[int, str]] = []
        for number, etag in listed:
            if number != following + len(run):
                break  # a gap cannot come from appenders: stop before it rather than skip a record
            run.append((number, etag))
        names = [self._record_name(prefix, number) for number, _ in run]
        with ThreadPoolExecutor(max_workers=min(_READ_THREADS, max(1, len(names)))) as pool:
            bodies = list(pool.map(self._read, names))
        records: list[dict[str, Any]] = []
        last: tuple[int, str] | None = None
        for (number, etag), body in zip(run, bodies, strict=True):
            if body is None:
                break  # deleted since the listing: the next read sees the journal gone
            last = (number, etag)
            try:
                record = json.loads(body)
            except ValueError:
                continue  # as read_journal: not a complete record, and never one later
            if isinstance(record, dict):
                records.append(record)
        if last is None:
            return JournalChunk([], cursor or "s3:1:")  # a cursor given was just found valid: it stays
        return JournalChunk(records, f"s3:{last[0] + 1}:{last[1]}")

    @staticmethod
    def _record_name(prefix: str, number: int) -> str:
        return f"{prefix}/{number:0{_SEQ_DIGITS}d}.json"

    def _numbered(self, prefix: str, *, after: int) -> list[tuple[int, str]]:
        """(number, ETag) of the journal's records numbered above ``after``, in order (one listing from there)."""
        extra = {"StartAfter": self._key(self._record_name(prefix, after))} if after >= 0 else {}
        found = []
        for page in self._pages(prefix, **extra):
            for obj in page.get("Contents", []):
                name = self._relative(obj["Key"])
                match = _SEQ_NAME.match(name.rsplit("/", 1)[-1])
                if match and name.count("/") == prefix.count("/") + 1 and int(match.group(1)) > after:
                    found.append((int(match.group(1)), str(obj.get("ETag") or "")))
        return sorted(found)

    def _read_marker(self, prefix: str) -> Any:
        name = _join(prefix, OWNER_FILE)
        data = self._read(name)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return {"owner": None}  # unreadable: not ours, and not nobody's either

    def _delete(self, name: str) -> bool:
        self._forget_journals(name)
        existed = self._stat(name) is not None
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as exc:
            raise self._fail(name, "delete", exc) from None
        return existed

    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        marker = _join(prefix, OWNER_FILE)
        # Directory markers (keys ending in "/", which s3a and consoles create) are no names of the store, but
        # the prefix's removal removes them too. The prefix's own marker goes last: a delete that stops
        # half-way leaves the prefix still owned.
        folders = [o["Key"] for page in self._pages(prefix) for o in page.get("Contents", []) if o["Key"].endswith("/")]
        ordered = ([self._key(n) for n in names if n != marker] + folders
                   + [self._key(n) for n in names if n == marker])
        self._forget_journals(prefix)  # a delete that fails half-way may have removed records too
        deleted = 0
        for start in range(0, len(ordered), 1000):
            batch = ordered[start:start + 1000]
            try:
                answer = self._client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": key} for key in batch], "Quiet": True})
            except Exception as exc:
                raise self._fail(prefix, "delete", exc) from None
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreError(f"cannot delete {self.describe(self._relative(first.get('Key', '')))}: "
                                 f"{first.get('Code') or 'error'} ({len(errors)} objects not deleted)")
            deleted += len(batch)
        return deleted

    # Attempt output: Spark reads and writes through s3a, hashes stream GetObject, footers are ranged reads.
    parallel_reads = _READ_THREADS

    def _spark_url(self, name: str) -> str:
        return f"s3a://{self.bucket}/{self._key(name)}"

    def _open_read(self, name: str) -> BinaryIO | None:
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
        except Exception as exc:
            if _status(exc) == 404 and _error_code(exc).startswith("NoSuchKey"):
                return None
            raise self._fail(name, "read", exc) from None
        return io.BufferedReader(_S3Stream(self, name, body), buffer_size=1 << 20)

    def _arrow_path(self, name: str) -> tuple[FileSystem, str]:
        return self._arrow.filesystem(), f"{self.bucket}/{self._key(name)}"

    def parquet_metadata(self, name: str) -> FileMetaData:
        """The Parquet footer of object ``name``; an error names the object and the error's type, never its text."""
        try:
            return super().parquet_metadata(name)
        except StoreError:
            raise
        except Exception as exc:
            # pyarrow's message quotes the service's answer (its request ids, what it echoed): not shown.
            raise StoreError(f"cannot read the Parquet footer of {self.describe(name)}: "
                             f"{type(exc).__name__}") from None

    def _stat_all(self, prefix: str) -> list[ObjectInfo]:
        # The listing carries each object's Size, LastModified and ETag: no HeadObject per object.
        listed = (o for page in self._pages(prefix) for o in _objects(page))
        return sorted((ObjectInfo(self._relative(o["Key"]), int(o.get("Size") or 0), o["LastModified"].timestamp(),
                                  etag=o.get("ETag")) for o in listed), key=lambda info: info.name)

    def _delete_many(self, names: list[str]) -> None:
        # DeleteObjects in batches of 1,000 (a missing key counts as deleted): one request, not one per object.
        for start in range(0, len(names), 1000):
            batch = names[start:start + 1000]
            try:
                answer = self._client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": self._key(n)} for n in batch], "Quiet": True})
            except Exception as exc:
                raise self._fail(batch[0], "delete", exc) from None
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise StoreError(f"cannot delete {self.describe(self._relative(first.get('Key', '')))}: "
                                 f"{first.get('Code') or 'error'} ({len(answer['Errors'])} objects not deleted)")

    def copy_from(self, name: str, source: StoreBackend, source_name: str) -> str | None:
        """Server-side ``CopyObject`` from an S3 source on this endpoint, else a streamed (multipart) upload.

        A copy up to 5 GiB asks S3 for the copy's SHA-256 (``ChecksumAlgorithm``); a larger one is a multipart
        copy (``UploadPartCopy``), whose checksum is not the object's: None. An upload hashes what it sends.
        """
        self._writable(name)
        key = self._key(name)
        if isinstance(source, S3Backend) and source._client.meta.endpoint_url == self._client.meta.endpoint_url:
            info = source.stat(source_name)
            if info is None:
                raise StoreError(f"cannot copy {source.describe(source_name)}: it does not exist")
            copy_source = {"Bucket": source.bucket, "Key": source._key(source_name)}
            try:
                if info.size <= _MAX_SINGLE_COPY:
                    answer = self._client.copy_object(Bucket=self.bucket, Key=key, CopySource=copy_source,
                                                      ChecksumAlgorithm="SHA256")
                    checksum = (answer.get("CopyObjectResult") or {}).get("ChecksumSHA256")
                    return base64.b64decode(checksum).hex() if checksum else None
                from boto3.s3.transfer import TransferConfig

                self._client.copy(copy_source, self.bucket, key,
                                  Config=TransferConfig(multipart_threshold=_MAX_SINGLE_COPY))
                return None
            except Exception as exc:
                raise self._fail(name, "write", exc) from None
        stream = source.open_read(source_name)
        if stream is None:
            raise StoreError(f"cannot copy {source.describe(source_name)}: it does not exist")
        hashing = _HashingReader(stream)
        try:
            with stream:
                self._client.upload_fileobj(hashing, self.bucket, key)
        except StoreError:
            raise
        except Exception as exc:
            raise self._fail(name, "write", exc) from None
        return hashing.digest.hexdigest()

    @property
    def notice_poll_seconds(self) -> float:
        """1 s: a look for a change notice is a ``ListObjectsV2`` request (a notice waits 0.5 s more on average)."""
        return 1.0

    def _read_range(self, name: str, offset: int, length: int) -> bytes | None:
        # One GetObject with a Range header: only the bytes asked for cross the network.
        if length == 0:
            return None if self._stat(name) is None else b""
        return self._get(name, f"bytes={offset}-{offset + length - 1}")

    # S3 computes each object's ETag (MD5 of a single-part object, a digest of the parts' MD5s for a multipart
    # one) and lists it with the size: manifests record it instead of reading every byte back.
    content_token: str | None = "etag"

    def parquet_value_counts(self, name: str, column: str) -> tuple[FileMetaData, dict[int, int]]:
        """:meth:`StoreBackend.parquet_value_counts`; an error names the object and its type, never its text."""
        try:
            return super().parquet_value_counts(name, column)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"cannot read column {column!r} of {self.describe(name)}: {type(exc).__name__}") from None


def _shown_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced, for messages."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]).geturl()
    return url


def _client(credentials: S3Credentials | None) -> BaseClient:
    """A boto3 S3 client for ``credentials`` (path-style addressing with a custom endpoint)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StoreError("a store on S3 needs boto3: pip install 'airflow-provider-speculative[s3]'") from None
    kwargs: dict[str, Any] = {}
    if credentials is not None:
        kwargs["region_name"] = credentials.region or "us-east-1"
        if credentials.endpoint_url:
            kwargs["endpoint_url"] = credentials.endpoint_url
        if credentials.access_key and credentials.secret_key:
            kwargs.update(aws_access_key_id=credentials.access_key, aws_secret_access_key=credentials.secret_key,
                          aws_session_token=credentials.session_token)
    # A request the service leaves unanswered is resent after CONNECT/READ_TIMEOUT, not botocore's 60 s: a
    # store request is small and a stalled one is retried at once (the read timeout is between two reads of
    # a response, so a large object is not cut short).
    config = Config(max_pool_connections=64, retries={"mode": "standard", "max_attempts": 4},
                    connect_timeout=S3_CONNECT_TIMEOUT, read_timeout=S3_READ_TIMEOUT,
                    s3={"addressing_style": "path"} if credentials is not None and credentials.endpoint_url else {})
    return boto3.session.Session(botocore_session=_botocore_session()).client("s3", config=config, **kwargs)


_BODY_TRIES = 3


def _transient_body_error(exc: BaseException) -> bool:
    """Whether reading a response body failed in transit (a stall, a cut connection): worth one more request."""
    from botocore.exceptions import (
        ConnectionClosedError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    return isinstance(exc, ReadTimeoutError | ResponseStreamingError | IncompleteReadError | ConnectionClosedError)


_LOADER: Any = None
_LOADER_LOCK = threading.Lock()


def _botocore_session() -> Any:
    """A fresh botocore session (its own credentials and configuration) sharing one loader of service models.

    Parsing botocore's JSON models is most of a client's creation (about 0.1 s); the loader only caches
    those read-only files, so sharing it shares no credential, region or endpoint. Filled before the fork
    server forks (:func:`warm_s3_client`), an attempt's client takes about 0.01 s.
    """
    import botocore.loaders
    import botocore.session

    global _LOADER
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = botocore.loaders.create_loader()
        loader = _LOADER
    session = botocore.session.Session()
    session.register_component("data_loader", loader)
    return session


def warm_s3_client() -> None:
    """Load the S3 client's service models into the shared loader, without credentials or a request."""
    try:
        import boto3
    except ImportError:
        return  # no store on S3 in this environment
    from botocore.config import Config

    # Explicit placeholder keys and endpoint: nothing is resolved from the environment, nothing is sent.
    boto3.session.Session(botocore_session=_botocore_session()).client(
        "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9", aws_access_key_id="warm",
        aws_secret_access_key="warm", config=Config(s3={"addressing_style": "path"}))


class _S3Stream(io.RawIOBase):
    """An object's GetObject body as a raw binary stream; a failed read names the object, never the service's text."""

    def __init__(self, backend: S3Backend, name: str, body: Any) -> None:
        self._backend, self._name, self._body = backend, name, body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._body.read(len(view))
        except Exception as exc:  # botocore's and urllib3's read errors
            raise self._backend._fail(self._name, "read", exc) from None
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            # The connection goes back to the pool or is dropped: nothing to report either way.
            with contextlib.suppress(Exception):
                self._body.close()
        super().close()


class _HashingReader(io.RawIOBase):
    """A binary stream that hashes (SHA-256) what is read through it: an upload's checksum of the bytes it sent."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.digest.update(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)


class _ArrowS3:
    """The store's ``pyarrow.fs.S3FileSystem``, built on first use; holds the credentials and never shows them."""

    def __init__(self, credentials: S3Credentials | None) -> None:
        self._credentials = credentials
        self._filesystem: FileSystem | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "_ArrowS3(<credentials hidden>)"

    def filesystem(self) -> FileSystem:
        """The file system (path-style addressing with a custom endpoint, as the boto3 client)."""
        with self._lock:
            if self._filesystem is None:
                from pyarrow.fs import S3FileSystem

                kwargs: dict[str, Any] = {}
                credentials = self._credentials
                if credentials is not None:
                    kwargs["region"] = credentials.region or "us-east-1"
                    if credentials.access_key and credentials.secret_key:
                        kwargs.update(access_key=credentials.access_key, secret_key=credentials.secret_key,
                                      session_token=credentials.session_token)
                    if credentials.endpoint_url:
                        endpoint = urlsplit(credentials.endpoint_url)
                        kwargs.update(endpoint_override=endpoint.netloc or endpoint.path,
                                      scheme=endpoint.scheme or "https", force_virtual_addressing=False)
                self._filesystem = S3FileSystem(**kwargs)
            return self._filesystem


def open_backend(store_path: str | Path, credentials: S3Credentials | None = None) -> StoreBackend:
    """The backend of a store root: ``s3://``/``s3a://`` on S3 (with ``credentials``), else a POSIX directory."""
    text = str(store_path)
    scheme = urlsplit(text).scheme
    if scheme in ("s3", "s3a"):
        return S3Backend(text, credentials)
    if scheme == "file":
        return PosixBackend(unquote(urlsplit(text).path))
    return PosixBackend(Path(text))
