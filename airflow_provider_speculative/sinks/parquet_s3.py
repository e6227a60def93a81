"""ParquetSink on S3: each commit is a new version prefix, published by one atomic overwrite of ``_CURRENT``.

S3 has no rename of a prefix, so the POSIX directory swap cannot be had. As Iceberg and Delta publish a
table version, finalize writes the admitted attempts' files under a fresh ``<final>/_v=<token>/`` prefix and
then replaces ``<final>/_CURRENT`` (a small JSON naming the version, its files with sizes and SHA-256, and
the DAG, run and stage), written last. A reader that follows ``_CURRENT`` (:func:`published_files`) sees
the previous version or the new one, never a mix; a plain listing of ``<final>`` sees every version.

Ownership: the prefix is claimed by an ownership marker (``<final>/_owner.json``, created exclusively) naming
this DAG and stage, so two stages racing for one empty prefix cannot both publish. A prefix holding
anything else (another owner's marker or pointer, objects that are neither a marker, a pointer nor a
version prefix), or lying inside another sink's output, fails the commit before anything is written.

Deletes are owned deletes below the marker, and only of files a pointer of this sink named: a replaced
version is recorded in the new pointer as ``retired`` and deleted after that pointer is written, so a
retry after a crash at any step finds what is left to delete. Versions of a stage run that were never
published (a finalize that died before its pointer) are staging, removed by ``cleanup_staging``.

A retry of one commit (same admitted attempts, same written files) computes the same token and rewrites
the same version: idempotent. Another run, or a rerun with new attempts, gets a new token.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_speculative.core.paths import object_url_problem, split_object_url
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.sinks.base import FinalizationContext, StagingObject, StagingScope
from airflow_provider_speculative.store.backend import (
    OWNER_FILE,
    PosixBackend,
    S3Backend,
    S3Credentials,
    StoreBackend,
    StoreNotOwnedError,
    check_name,
)
from airflow_provider_speculative.store.manifest import ETAG, bare_etag, entry_integrity, is_plain_md5

POINTER = "_CURRENT"
VERSION = "_v="
_PART = re.compile(r"^part-\d{5}-\d{3}\.parquet$")
_VERSION = re.compile(r"^_v=([0-9a-f]{12})-([0-9a-f]{16})$")


@dataclass(frozen=True)
class S3Location:
    """Where an S3 ParquetSink publishes: the URL as written, its bucket and its key prefix."""

    url: str
    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """The location of ``s3://bucket/prefix`` (or ``s3a://``); StoreError if it is not one a sink may use."""
        problem = sink_url_problem(url)
        if problem:
            raise StoreError(problem)
        bucket, key = split_object_url(url)
        return cls(url.rstrip("/"), bucket, key.strip("/"))

    def name(self, relative: str) -> str:
        """The name (key below the bucket) of ``relative``, a path below the location."""
        return f"{self.key}/{relative}"


def sink_url_problem(url: str) -> str | None:
    """Why ``url`` is not an ``s3://bucket/prefix`` a ParquetSink may publish to; None if it is (no I/O)."""
    problem = object_url_problem(url)
    if problem:
        return problem.replace("source URL", "sink URL", 1)
    _, key = split_object_url(url)
    if any(c in url for c in "*?["):
        return f"sink URL {url!r} has a wildcard; give the prefix to publish to"
    if not key.strip("/"):
        return f"sink URL {url!r} names a whole bucket; give a prefix (s3://bucket/prefix)"
    if "//" in key.strip("/"):
        return f"sink URL {url!r} has an empty segment ('//')"
    try:
        check_name(key.strip("/"))
    except StoreError as exc:
        return f"sink URL {url!r} is not a usable key prefix: {exc}"
    return None


def sink_owner(dag_id: str, stage: str) -> str:
    """What the sink's ownership marker names: one DAG's stage (its pointer names the same pair)."""
    return f"ParquetSink {json.dumps([dag_id, stage])}"


def open_sink_backend(location: S3Location, owner: str, credentials: S3Credentials | None) -> StoreBackend:
    """The backend of the sink's bucket, its markers naming ``owner`` (None: the AWS SDK's default credentials)."""
    return S3Backend(f"s3://{location.bucket}", credentials, owner=owner)


def run_key(dag_id: str, run_id: str, stage: str, url: str) -> str:
    """Short key naming one stage run's versions at ``url`` (so clean-up finds only its own)."""
    return hashlib.sha1(f"{dag_id}\0{run_id}\0{stage}\0{url}".encode()).hexdigest()[:12]


def version_token(context: FinalizationContext, url: str) -> str:
    """``<run key>-<digest of the admitted attempts' files>``: the same for a retry of one commit, new otherwise."""
    admitted = [[s, r.attempt, r.sink_info.get("write_id"),
                 sorted([f["path"], f["size"], f.get("sha256") or f.get("etag")] for f in r.files)]
                for s, r in sorted(context.attempts.items())]
    digest = hashlib.sha256(json.dumps(admitted, sort_keys=True).encode()).hexdigest()[:16]
    return f"{run_key(context.dag_id, context.run_id, context.stage, url)}-{digest}"


def read_pointer(store: StoreBackend, location: S3Location) -> Any:
    """The pointer document at ``location``: None if there is none, ``"corrupt"`` if it is not JSON."""
    return _read_quietly(store, location.name(POINTER))


def _read_quietly(store: StoreBackend, name: str) -> Any:
    # Bytes that are not JSON are nobody's pointer or marker: "corrupt"; an object that cannot be read raises.
    data = store.read(name)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return "corrupt"


def _pointer_names(pointer: Any) -> tuple[str | None, str | None]:
    if isinstance(pointer, dict) and pointer.get("sink") == "ParquetSink" and isinstance(pointer.get("files"), list):
        return pointer.get("dag_id"), pointer.get("stage")
    return None, None


def foreign_problem(store: StoreBackend, location: S3Location, dag_id: str, stage: str, owner: str) -> str | None:
    """Why this DAG's stage may not publish at ``location``; None if the prefix is empty or its own (reads only)."""
    # Inside another sink's output: its readers follow their own pointer, but a listing or a gc of theirs would not.
    parts = location.key.split("/")
    for end in range(len(parts) - 1, 0, -1):
        above = "/".join(parts[:end])
        pointer = _read_quietly(store, f"{above}/{POINTER}")
        if pointer is not None:
            found_dag, found_stage = _pointer_names(pointer)
            return (f"it lies inside s3://{location.bucket}/{above}, the published output of DAG {found_dag!r}, "
                    f"stage {found_stage!r}")
    entries = store.children(location.key)
    if not entries:
        return None
    marker = None
    if OWNER_FILE in entries:
        marker = _read_quietly(store, location.name(OWNER_FILE))
        if not isinstance(marker, dict) or marker.get("owner") != owner or marker.get("prefix") != location.key:
            shown = marker.get("owner") if isinstance(marker, dict) else None
            return f"it is claimed by {shown!r}, not by this DAG's stage; two stages may not share a sink path"
    if POINTER in entries:
        found_dag, found_stage = _pointer_names(read_pointer(store, location))
        if (found_dag, found_stage) == (None, None):
            return f"its {POINTER} is not a ParquetSink pointer; the sink only replaces a pointer it wrote"
        if (found_dag, found_stage) != (dag_id, stage):
            return (f"it was published by DAG {found_dag!r}, stage {found_stage!r}; two stages may not share a "
                    "sink path")
    versions = [e for e in entries if e.endswith("/") and _VERSION.match(e[:-1])]
    alien = sorted(e for e in entries if e not in (OWNER_FILE, POINTER) and e not in versions)
    if alien:
        return (f"it holds {len(alien)} entries the sink did not write (e.g. {alien[0]!r}); the sink only "
                "replaces a prefix it published or an empty one")
    if versions and marker is None:
        return (f"it holds version prefixes (e.g. {versions[0][:-1]!r}) but no ownership marker of this sink; "
                "the sink never deletes or replaces what it cannot prove it wrote")
    return None


def _retired(pointer: Any, keep: str, present: set[str]) -> list[dict[str, Any]]:
    """What the new pointer retires: the old pointer's version and its still-present retired ones, never ``keep``."""
    if not isinstance(pointer, dict):
        return []
    out: list[dict[str, Any]] = []
    candidates = [{"version": pointer.get("version"), "run_id": pointer.get("run_id"),
                   "files": [f.get("path") for f in pointer.get("files") or [] if isinstance(f, dict)]}]
    candidates += [r for r in pointer.get("retired") or [] if isinstance(r, dict)]
    for entry in candidates:
        version = entry.get("version")
        if not isinstance(version, str) or version == keep or not _VERSION.match(version) or version not in present:
            continue
        files = [p for p in entry.get("files") or [] if _owned_file(version, p)]
        if files and all(e.get("version") != version for e in out):
            out.append({"version": version, "run_id": entry.get("run_id"), "files": files})
    return out


def _owned_file(version: str, path: Any) -> bool:
    """A path a pointer names that finalize writes: ``<version>/part-NNNNN-NNN.parquet``, nothing else."""
    if not isinstance(path, str):
        return False
    head, _, tail = path.partition("/")
    return head == version and bool(_PART.match(tail))


def finalize_s3(url: str, context: FinalizationContext) -> dict[str, Any]:
    """Publish the admitted attempts at ``url`` as a new version, then point ``_CURRENT`` at it (module docstring)."""
    location = S3Location.parse(url)
    pipeline = context.extra.get("pipeline") or context.dag_id
    where = f"pipeline {pipeline!r}, stage {context.stage!r}"
    owner = sink_owner(context.dag_id, context.stage)
    # The caller resolves the connection (``control/commit.py``: the plan's ``s3_conn_id``), lazily.
    resolve = context.extra.get("s3_credentials")
    store = open_sink_backend(location, owner, resolve() if callable(resolve) else None)
    version = f"{VERSION}{version_token(context, location.url)}"

    def refuse(problem: str, touched: str = "nothing was written") -> StoreError:
        return StoreError(f"ParquetSink ({where}) will not publish to {location.url}: {problem}; {touched}")

    # Before anything is written: a foreign prefix means nothing may be touched.
    problem = foreign_problem(store, location, context.dag_id, context.stage, owner)
    if problem:
        raise refuse(problem)
    try:
        store.claim(location.key)
    except StoreNotOwnedError as exc:
        raise refuse(f"another owner claimed it ({exc})") from None
    files = []
    for subtask in range(context.parallelism):
        result = context.attempts[subtask]
        source, base = _source(context, result)
        for n, entry in enumerate(sorted(result.files, key=lambda f: f["path"])):
            path = f"{version}/part-{subtask:05d}-{n:03d}.parquet"
            target = location.name(path)
            source_name = f"{base}/{entry['path']}" if base else entry["path"]
            kind = entry_integrity(entry, stage=context.stage, subtask=subtask, attempt=result.attempt,
                                   shown=source.describe(source_name))
            if kind == ETAG:
                published = _publish_by_etag(store, target, source, source_name, entry, where, subtask,
                                             result.attempt)
                files.append({"path": path, **published, "subtask": subtask, "attempt": result.attempt,
                              "records": entry.get("records")})
                continue
            checksum = store.copy_from(target, source, source_name)
            if checksum is not None and checksum != entry["sha256"]:
                raise StoreError(f"ParquetSink ({where}): checksum mismatch while publishing "
                                 f"{store.describe(target)} from attempt {result.attempt} of subtask {subtask}")
            if checksum is None:
                info = store.stat(target)
                if info is None or info.size != entry["size"]:
                    raise StoreError(f"ParquetSink ({where}): size mismatch while publishing {store.describe(target)}")
            files.append({"path": path, "size": entry["size"], "sha256": entry["sha256"], "subtask": subtask,
                          "attempt": result.attempt, "records": entry.get("records")})
    # Checked again right before the pointer: another writer may have put something there meanwhile.
    problem = foreign_problem(store, location, context.dag_id, context.stage, owner)
    if problem:
        raise refuse(problem, f"the unpublished version {version} is left for clean-up")
    previous = read_pointer(store, location)
    present = {e[:-1] for e in store.children(location.key) if e.endswith("/")}
    retired = _retired(previous, version, present)
    pointer = {"sink": "ParquetSink", "format": 1, "dag_id": context.dag_id, "run_id": context.run_id,
               "stage": context.stage, "logical_date": context.logical_date, "version": version, "files": files,
               "committed_at": time.time(), "records": sum(f.get("records") or 0 for f in files),
               "retired": retired}
    store.replace_json(location.name(POINTER), pointer)  # the publication: readers now follow the new version
    summary = {"sink": "parquet", "path": location.url, "version": version, "files": len(files),
               "records": pointer["records"]}
    try:
        summary["deleted"] = delete_retired(store, location, retired)
    except StoreError as exc:
        # Published all the same: the retired files stay named in the pointer, for the next commit or gc.
        summary.update(deleted=0, kept=f"retired versions kept: {exc}")
    return summary


def delete_retired(store: StoreBackend, location: S3Location, retired: list[dict[str, Any]]) -> int:
    """Owned deletes of the files ``retired`` names (versions a pointer named, replaced since); how many were named."""
    names = [location.name(p) for entry in retired for p in entry["files"] if _owned_file(entry["version"], p)]
    if names:
        store.delete_many(names)
    return len(names)


def _publish_by_etag(store: StoreBackend, target: str, source: StoreBackend, source_name: str, entry: dict[str, Any],
                     where: str, subtask: int, attempt: int) -> dict[str, Any]:
    """Copy a file whose manifest entry carries the store's ETag; check source and copy by size and ETag, no read.

    The source must still have the manifest's size and ETag (one HeadObject). A copy of a single-part object
    has the source's ETag when the bytes are equal (S3's ETag is then their MD5), so both plain MD5s must
    match; where either is a multipart ETag (``...-N``) the copy's size is checked and the copy's SHA-256, if
    the service reported one, is recorded; ``checked`` says what the content was checked by.
    """
    def mismatch(what: str) -> StoreError:
        return StoreError(f"ParquetSink ({where}): {what} while publishing {store.describe(target)} from attempt "
                          f"{attempt} of subtask {subtask}")

    before = source.stat(source_name)
    if before is None:
        raise mismatch(f"{source.describe(source_name)} is missing")
    if before.size != entry["size"] or bare_etag(before.etag) != entry[ETAG]:
        raise mismatch(f"checksum mismatch of {source.describe(source_name)} (size {before.size}, ETag "
                       f"{bare_etag(before.etag)} != manifest {entry['size']}, {entry[ETAG]})")
    checksum = store.copy_from(target, source, source_name)
    after = store.stat(target)
    if after is None or after.size != entry["size"]:
        raise mismatch("size mismatch")
    copied = bare_etag(after.etag) or ""
    plain = is_plain_md5(copied) and is_plain_md5(entry[ETAG])
    if plain and copied != entry[ETAG]:
        raise mismatch("checksum mismatch (ETag)")
    published: dict[str, Any] = {"size": entry["size"], ETAG: copied,
                                 "checked": "etag" if plain else "source-etag-and-size"}
    if checksum is not None:
        published["sha256"] = checksum
    return published


def _source(context: FinalizationContext, result: Any) -> tuple[StoreBackend, str]:
    """Where an admitted attempt's files are: the store and its data prefix, else its data directory on disk."""
    if context.store is not None and result.data_name:
        return context.store, result.data_name
    return PosixBackend(result.data_dir), ""


def staging_s3(url: str, scope: StagingScope,
               credentials: S3Credentials | None = None) -> tuple[StoreBackend, list[StagingObject]]:
    """This stage run's unpublished versions and the retired versions its pointers left, with their sizes."""
    location = S3Location.parse(url)
    owner = sink_owner(scope.dag_id, scope.stage)
    store = open_sink_backend(location, owner, credentials)
    if not store.claimed(location.key):
        return store, []  # not this sink's prefix: nothing of it is this sink's to remove
    pointer = read_pointer(store, location)
    published = pointer.get("version") if isinstance(pointer, dict) else None
    key = run_key(scope.dag_id, scope.run_id, scope.stage, location.url)
    found = []
    for entry in store.children(location.key):
        version = entry[:-1]
        match = _VERSION.match(version)
        if not entry.endswith("/") or match is None or version == published:
            continue
        retired = isinstance(pointer, dict) and any(
            r.get("version") == version and r.get("run_id") == scope.run_id for r in pointer.get("retired") or [])
        if match.group(1) != key and not retired:
            continue
        infos = [i for i in store.stat_all(location.name(version)) if _PART.match(i.name.rsplit("/", 1)[-1])
                 and i.name.count("/") == location.name(version).count("/") + 1]
        if infos:
            found.append(StagingObject(f"{location.url}/{version}", sum(i.size for i in infos)))
    return store, found


def cleanup_s3(url: str, scope: StagingScope, credentials: S3Credentials | None = None) -> list[str]:
    """Remove the part files of the versions :func:`staging_s3` finds (owned deletes); return the versions."""
    if scope.attempts is not None:
        return []  # losers' files live in the store; versions belong to the stage run, not to an attempt
    store, found = staging_s3(url, scope, credentials)
    location = S3Location.parse(url)
    removed = []
    for obj in found:
        version = obj.name.rsplit("/", 1)[-1]
        names = [n for n in store.list_names(location.name(version))
                 if _owned_file(version, n[len(location.key) + 1:])]
        store.delete_many(names)
        removed.append(obj.name)
    return removed


def published_files(location: str, *, store: StoreBackend | None = None,
                    credentials: S3Credentials | None = None) -> list[str]:
    """The files a ParquetSink published at ``location``, as URLs or paths: what a reader must read.

    On S3 the files ``_CURRENT`` names (``s3://bucket/prefix/_v=<token>/part-...``): a plain listing of the
    prefix (``spark.read.parquet(prefix)``) would also read retired and unpublished versions. On a local
    path, the files its ``_SUCCESS`` manifest names. ``store``: the sink bucket's backend (default: one opened
    with ``credentials``, None: the AWS SDK's default chain). StoreError if nothing was published there.
    """
    from airflow_provider_speculative.core.paths import is_object_url

    if not is_object_url(location):
        from pathlib import Path

        from airflow_provider_speculative.store.files import read_json

        try:
            manifest = read_json(Path(location) / "_SUCCESS")
        except StoreError:
            manifest = None  # Spark's own empty _SUCCESS, or anything else that is not a sink's manifest
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
            raise StoreError(f"nothing was published at {location}: no ParquetSink manifest (_SUCCESS)")
        return [str(Path(location) / f["path"]) for f in manifest["files"]]
    parsed = S3Location.parse(location)
    if store is None:
        store = open_sink_backend(parsed, "", credentials)
    pointer = read_pointer(store, parsed)
    if not isinstance(pointer, dict) or not isinstance(pointer.get("files"), list):
        raise StoreError(f"nothing was published at {parsed.url}: no ParquetSink pointer ({POINTER})")
    version = pointer.get("version")
    paths = [f.get("path") for f in pointer["files"] if isinstance(f, dict)]
    if not isinstance(version, str) or not all(_owned_file(version, p) for p in paths):
        raise StoreError(f"{parsed.url}/{POINTER} names files outside its version; not a ParquetSink pointer")
    return [f"{parsed.url}/{p}" for p in paths]
