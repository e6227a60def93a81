"""Attempt manifests: the list of output files with sizes and checksums, written last.

Every function works on a :class:`StoreBackend` and names (``*_in``): the data prefix is listed once, each
file's size and SHA-256 come from one streamed read, and a consumer verifies a file by name (size from
``stat``, checksum from a streamed read) before reading it. On a backend with a content token
(:attr:`StoreBackend.content_token`, S3's ETag) the entries carry ``etag`` instead of ``sha256``, taken
from the one listing of the data prefix with the sizes, and a consumer compares them with one listing: no byte
is read back (the manifest's ``"integrity": "etag"``; absent: ``"sha256"``). A listing only finds the files an
attempt wrote; what a consumer reads is what the manifest names. The path forms
(``build_manifest(data_dir)``, ...) are thin wrappers over a :class:`PosixBackend` of the directory, for
callers that still have paths.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from airflow_provider_speculative.exceptions import PartitionError, StoreError
from airflow_provider_speculative.store.backend import ObjectInfo, PosixBackend, StoreBackend

SUBPARTITION_COLUMN = "_sp"
_SP = re.compile(rf"(?:^|/){SUBPARTITION_COLUMN}=(\d+)(?:/|$)")
_CHUNK = 1 << 20
ETAG = "etag"
"""A manifest entry's key for the store's content token, and the manifest's ``integrity`` when entries carry it."""
_T = TypeVar("_T")
_R = TypeVar("_R")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def is_data_file(relative: str) -> bool:
    """True if ``relative`` (a name below an attempt's data prefix) is a data file, not Spark's bookkeeping.

    Not data: hidden files (``.part-0.crc``, a store's ``.x.tmp``), files named ``_*`` (``_SUCCESS``,
    ``_committed_*``, ``_started_*``), ``*.crc``, and anything below a directory Spark's own readers skip, one
    named ``.*`` or ``_*`` without ``=`` (``_temporary/`` of Hadoop's committers, ``__magic*/`` of s3a's,
    ``.spark-staging-*/``); a partition directory (``_sp=3/``) holds data. On S3 a directory marker object
    (``x/`` or ``x_$folder$``) is a directory, not a file.
    """
    *directories, base = relative.split("/")
    if not base or base.startswith((".", "_")) or base.endswith((".crc", "_$folder$")):
        return False
    return not any(d.startswith(".") or (d.startswith("_") and "=" not in d) for d in directories)


# The provider's Spark commit protocol (backends/jvm/DirectCommitProtocol.java, built by backends/commitjar.py):
# its class, the prefix of its jar's file name (an attempt's session has it when spark.jars names such a jar),
# and the list it writes at job commit: the files of the tasks Spark committed, one name per line relative to
# the output prefix.
DIRECT_COMMIT_CLASS = "speculative.commit.DirectCommitProtocol"
COMMIT_JAR_PREFIX = "speculative-commit-"
COMMITTED_LIST = "_speculative_committed"


def data_files(store: StoreBackend, data: str) -> list[str]:
    """The data files below prefix ``data`` (names relative to it), in the order manifests list them.

    Ordered as paths compare (segment by segment: ``a/b`` before ``a-c``), as the walk of a directory
    always listed them, so a manifest of the same files is the same on every backend. Where Spark wrote
    through the provider's commit protocol, only the files its committed-file list names.
    """
    start = len(data) + 1 if data else 0
    names = [name[start:] for name in store.list_names(data)]
    return committed_data_files(store, data, names)


def committed_data_files(store: StoreBackend, data: str, names: Collection[str]) -> list[str]:
    """The data files among ``names`` (listed below ``data``), sorted; those the committed-file list names, if any.

    A direct write (the provider's commit protocol) puts every Spark task attempt's files in their final
    place: a losing speculative task's or an aborted task's file can stand beside the committed ones, and
    only the list, written at job commit, tells them apart. A named file that was not listed is an error:
    the output is incomplete.
    """
    if COMMITTED_LIST not in names:
        return sorted((n for n in names if is_data_file(n)), key=lambda n: n.split("/"))
    raw = store.read(_join(data, COMMITTED_LIST))
    if raw is None:
        raise StoreError(f"cannot read {store.describe(_join(data, COMMITTED_LIST))}: listed, then gone")
    named = [line for line in raw.decode("utf-8").splitlines() if line]
    # is_data_file refuses any "." or ".." segment; a leading "/" would leave the prefix.
    unsafe = [n for n in named if n.startswith("/") or not is_data_file(n)]
    if unsafe:
        raise StoreError(f"{store.describe(_join(data, COMMITTED_LIST))} names {unsafe[0]!r}, not a data file "
                         "below its prefix")
    present = set(names)
    missing = [n for n in named if n not in present]
    if missing:
        raise StoreError(f"{store.describe(_join(data, missing[0]))} is named by the committed-file list of "
                         f"{store.describe(data)} but does not exist" + (f" (and {len(missing) - 1} more)"
                                                                          if len(missing) > 1 else ""))
    return sorted(set(named), key=lambda n: n.split("/"))


def _in_order(store: StoreBackend, work: Callable[[_T], _R], items: Iterable[_T]) -> Iterator[_R]:
    """``work`` of each item, in order; on a backend that reads in parallel (S3), several at once."""
    items = list(items)
    if store.parallel_reads <= 1 or len(items) <= 1:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(max_workers=min(store.parallel_reads, len(items))) as pool:
        yield from pool.map(work, items)


def sha256_and_size(store: StoreBackend, name: str) -> tuple[str, int] | None:
    """Hex SHA-256 and size of object ``name`` from one streamed read (no whole object in memory); None if missing."""
    handle = store.open_read(name)
    if handle is None:
        return None
    digest, size = hashlib.sha256(), 0
    with handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def parquet_data_end(metadata: Any) -> int:
    """Where a Parquet file's pages end: its indexes, bloom filters and footer follow (``metadata``: pyarrow's).

    The bytes from there to the end (the tail) say where every page is and what it holds; the pages
    themselves carry a CRC32 each, which a reader verifies page by page.
    """
    end = 4  # the leading magic bytes "PAR1"
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for column in range(row_group.num_columns):
            chunk = row_group.column(column)
            starts = [chunk.data_page_offset]
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                starts.append(chunk.dictionary_page_offset)
            end = max(end, min(starts) + chunk.total_compressed_size)
    return end


def tail_digest(store: StoreBackend, name: str, offset: int, size: int) -> str | None:
    """Hex SHA-256 of object ``name`` from byte ``offset`` to ``size``; None if missing or shorter."""
    tail = store.read_range(name, offset, size - offset)
    if tail is None or len(tail) != size - offset:
        return None
    return hashlib.sha256(tail).hexdigest()


def bare_etag(etag: str | None) -> str | None:
    """An ETag without the quotes S3 puts around it (listings and ``HeadObject`` both quote it); None stays None."""
    return None if etag is None else etag.strip('"')


def is_plain_md5(etag: str) -> bool:
    """True if ``etag`` is the MD5 (hex) of the object's bytes: a single-part upload's, not a multipart ``...-N``."""
    return re.fullmatch(r"[0-9a-f]{32}", etag) is not None


def entry_integrity(entry: dict[str, Any], *, stage: str | None, subtask: int | None, attempt: int | None,
                    shown: str) -> str:
    """``"sha256"`` or ``"etag"``: what the manifest entry's content is checked by; an entry with neither is refused."""
    if entry.get("sha256"):
        return "sha256"
    if entry.get(ETAG):
        return ETAG
    raise PartitionError(f"manifest entry for {shown} (stage {stage!r} subtask {subtask} attempt {attempt}) "
                         "carries neither sha256 nor etag: its content cannot be checked",
                         stage=stage, subtask=subtask, attempt=attempt)


def _subpartition(rel: str) -> int | None:
    match = _SP.search(rel)
    return int(match.group(1)) if match else None


def _manifest_by_token(store: StoreBackend, data: str, extra: dict[str, Any]) -> dict[str, Any]:
    # One listing gives every data file's size and the store's own token: nothing is read back.
    start = len(data) + 1 if data else 0
    listed = {info.name[start:]: info for info in store.stat_all(data)}
    files = []
    for rel in committed_data_files(store, data, listed):
        token = bare_etag(listed[rel].etag)
        if not token:
            raise StoreError(f"cannot describe {store.describe(_join(data, rel))}: the store listed it without "
                             f"its {store.content_token}")
        files.append({"path": rel, "size": listed[rel].size, ETAG: token, "subpartition": _subpartition(rel)})
    return {"version": 1, "integrity": ETAG, "files": files, "bytes": sum(f["size"] for f in files), **extra}


def build_manifest_in(store: StoreBackend, data: str, **extra: Any) -> dict[str, Any]:
    """Describe every data file below prefix ``data``: path relative to it, size, SHA-256 or ETag, subpartition."""
    if store.content_token == ETAG:
        return _manifest_by_token(store, data, extra)

    def describe(rel: str) -> dict[str, Any]:
        name = _join(data, rel)
        read = sha256_and_size(store, name)
        if read is None:
            raise StoreError(f"cannot read {store.describe(name)}: the data file disappeared while its manifest "
                             "was built")
        sha256, size = read
        match = _SP.search(rel)
        return {"path": rel, "size": size, "sha256": sha256, "subpartition": int(match.group(1)) if match else None}

    files = list(_in_order(store, describe, data_files(store, data)))
    return {"version": 1, "files": files, "bytes": sum(f["size"] for f in files), **extra}


def build_manifest(data_dir: str | Path, **extra: Any) -> dict[str, Any]:
    """Describe every data file under directory ``data_dir`` (:func:`build_manifest_in` on its PosixBackend)."""
    return build_manifest_in(PosixBackend(data_dir), "", **extra)


def write_manifest_in(store: StoreBackend, name: str, manifest: dict[str, Any]) -> None:
    """Write the manifest ``name`` by an atomic replace; its presence marks the attempt's output complete."""
    store.replace_json(name, manifest)


def write_manifest(manifest_path: str | Path, manifest: dict[str, Any]) -> None:
    """Write the manifest at ``manifest_path`` atomically (:func:`write_manifest_in` on its directory)."""
    path = Path(os.fspath(manifest_path))
    write_manifest_in(PosixBackend(path.parent), path.name, manifest)


def read_manifest_in(store: StoreBackend, name: str) -> dict[str, Any] | None:
    """Read the manifest ``name``, or None if the attempt has not completed its output."""
    manifest: dict[str, Any] | None = store.read_json(name)
    return manifest


def read_manifest(manifest_path: str | Path) -> dict[str, Any] | None:
    """Read the manifest at ``manifest_path`` (:func:`read_manifest_in` on its directory)."""
    path = Path(os.fspath(manifest_path))
    return read_manifest_in(PosixBackend(path.parent), path.name)


def verify_files_in(store: StoreBackend, data: str, files: list[dict[str, Any]], *, checksums: bool = True,
                    stage: str | None = None, subtask: int | None = None, attempt: int | None = None,
                    by_tail: Collection[str] = ()) -> None:
    """Raise :class:`PartitionError` if a file the manifest lists below ``data`` is missing, resized or changed.

    Sizes by ``stat`` (``HeadObject`` on S3), checksums by a streamed read; an entry with an ``etag``: size
    and ETag from one listing of ``data``, no read. An entry whose path is in ``by_tail`` and that records its
    ``tail`` (a packed file several readers share): size, then the SHA-256 of the tail alone; the caller reads
    it with Parquet's page CRCs verified, so each byte it reads is checked once. The first bad file in the
    manifest's order is the one reported; an entry with neither checksum is refused.
    """
    who = f"stage {stage!r} subtask {subtask} attempt {attempt}"
    kinds = [entry_integrity(e, stage=stage, subtask=subtask, attempt=attempt,
                             shown=store.describe(_join(data, e["path"]))) for e in files]
    listed: dict[str, ObjectInfo] = {}
    if ETAG in kinds:
        # One ListObjectsV2 per 1,000 files instead of a HeadObject and a whole GetObject per file.
        listed = {info.name: info for info in store.stat_all(data)}

    def bad(shown: str, why: str = "") -> PartitionError:
        kind = f"corrupt partition file {shown} ({who}): {why}" if why else f"missing partition file {shown} ({who})"
        return PartitionError(kind, stage=stage, subtask=subtask, attempt=attempt)

    def sized(entry: dict[str, Any], info: ObjectInfo | None, shown: str) -> ObjectInfo:
        if info is None:
            raise bad(shown)
        if info.size != entry["size"]:
            raise bad(shown, f"size {info.size} != manifest {entry['size']}")
        return info

    def check(entry: dict[str, Any]) -> None:
        name = _join(data, entry["path"])
        shown = store.describe(name)
        if not entry.get("sha256"):
            token = bare_etag(sized(entry, listed.get(name), shown).etag)
            if checksums and token != entry[ETAG]:
                raise bad(shown, f"checksum mismatch (ETag {token} != manifest {entry[ETAG]})")
            return
        size = sized(entry, store.stat(name), shown).size
        if not checksums:
            return
        tail = entry.get("tail")
        if entry["path"] in by_tail and isinstance(tail, dict):
            if tail_digest(store, name, int(tail["offset"]), size) != tail["sha256"]:
                raise bad(shown, "checksum mismatch (Parquet footer and indexes)")
            return
        read = sha256_and_size(store, name)
        if read is None:
            raise bad(shown)
        if read[0] != entry["sha256"]:
            raise bad(shown, "checksum mismatch")

    for _ in _in_order(store, check, files):
        pass


def verify_files(data_dir: str | Path, files: list[dict[str, Any]], *, checksums: bool = True,
                 stage: str | None = None, subtask: int | None = None, attempt: int | None = None) -> None:
    """:func:`verify_files_in` for the files under directory ``data_dir`` (on its PosixBackend)."""
    verify_files_in(PosixBackend(data_dir), "", files, checksums=checksums, stage=stage, subtask=subtask,
                    attempt=attempt)
