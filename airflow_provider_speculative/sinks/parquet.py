"""Parquet directory sink: the final directory is replaced atomically with the admitted attempts' files.

It only ever replaces a directory it wrote itself (its ``_SUCCESS`` manifest names this DAG and
stage) or an empty one; anything else at the path makes the commit fail with nothing touched.
On S3 (``s3://bucket/prefix``) a commit is a new version prefix published by a ``_CURRENT`` pointer
instead (``sinks/parquet_s3.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.paths import is_object_url, redact_url, split_object_url, url_scheme
from airflow_provider_speculative.exceptions import PipelineError, PlanError, StoreError
from airflow_provider_speculative.sinks import parquet_s3
from airflow_provider_speculative.sinks.base import (
    FinalizationContext,
    InitializationContext,
    PlanContext,
    Sink,
    SinkWriter,
    StagingObject,
    StagingScope,
    SupportsConcurrentExecutionAttempts,
)
from airflow_provider_speculative.store.backend import S3Credentials
from airflow_provider_speculative.store.files import atomic_write_json, read_json, sha256_file
from airflow_provider_speculative.store.layout import StorePath
from airflow_provider_speculative.store.manifest import ETAG, bare_etag, entry_integrity, is_plain_md5

MANIFEST = "_SUCCESS"
# Everything finalize puts into a directory; a staging directory holding anything else is not ours.
_OWN_FILE = re.compile(r"^(part-\d{5}-\d{3}\.parquet|_SUCCESS|\.[^/]*\.tmp)$")


class ParquetSink(Sink, SupportsConcurrentExecutionAttempts):
    """Write the stage's output as Parquet files into ``path`` (absolute, templated, e.g. ``/out/{{ ds }}``).

    Attempts write into their own attempt directories, so concurrent attempts never collide; finalize
    builds a complete staging directory from the admitted attempts only and swaps it in with renames.
    A rerun of the same logical date replaces the directory, never appends to it. ``path`` may be an
    ``s3://bucket/prefix`` URL: finalize then publishes a new version by its ``_CURRENT`` pointer.
    """


    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> dict[str, Any]:
        """Constructor arguments."""
        return {"path": self.path}

    def asset_uri(self) -> str | None:
        """``file://`` URI of the path's fixed part (before its first templated component); None if it has none.

        ``/out/q1/{{ ds }}`` is the asset ``file:///out/q1``: one asset for every logical date, whose events
        carry the rendered path and the logical date (docs/assets.md).
        """
        text = os.fspath(self.path) if isinstance(self.path, str | os.PathLike) else ""
        if is_object_url(text):
            return _object_asset_uri(text)
        fixed: list[str] = []
        for part in text.split("/"):
            if "{{" in part or "{%" in part:
                break
            fixed.append(part)
        prefix = posixpath.normpath("/".join(fixed) or ".")
        if not posixpath.isabs(prefix) or prefix == "/":
            return None
        return Path(prefix).as_uri()

    def validate(self, where: str) -> None:
        """The path must be a non-empty absolute path (a leading template is checked once rendered)."""
        path = self.path
        if path is not None and not isinstance(path, str | os.PathLike):
            raise PipelineError(f"{where}: path must be a string, got {type(path).__name__} {path!r}")
        if path is None or not os.fspath(path).strip():
            raise PipelineError(f"{where}: path is empty ({path!r}); give an absolute directory path")
        text = os.fspath(path)
        if "\0" in text:
            raise PipelineError(f"{where}: path {text!r} contains a NUL byte")
        if text.lstrip().startswith("{{"):
            return  # e.g. "{{ var.value.out }}/q1": only the rendered value can be judged
        scheme = url_scheme(text)
        if scheme is not None:
            if not is_object_url(text):
                raise PipelineError(f"{where}: path {redact_url(text)!r}: scheme {scheme + '://'!r} is not supported "
                                    "(an absolute local path or s3://bucket/prefix)")
            # Templated segments are judged once rendered (validate_plan); the fixed ones now, without I/O.
            checked = _untemplated(text)
            problem = parquet_s3.sink_url_problem(checked)
            if problem:
                raise PipelineError(f"{where}: {problem.replace(redact_url(checked), redact_url(text))}")
            return
        if not posixpath.isabs(text):
            raise PipelineError(f"{where}: path {text!r} is relative; it would be resolved against the worker's "
                                "current directory. Give an absolute path")
        if any(part in (".", "..") for part in text.split("/")):
            raise PipelineError(f"{where}: path {text!r} has a '.' or '..' part; give the directory itself")

    def validate_plan(self, context: PlanContext) -> None:
        """Refuse a path inside (or above) the store, equal to, above or inside a source, or owned by another stage."""
        try:
            self.validate(context.where)
        except PipelineError as exc:
            raise PlanError(str(exc)) from None
        problem = _rendered_problem(os.fspath(self.path), (context.declared or {}).get("path"))
        if problem:
            raise PlanError(f"{context.where}: path {redact_url(os.fspath(self.path))!r} {problem}")
        if is_object_url(os.fspath(self.path)):
            # Outside any local store by construction; whether the prefix is free is checked by finalize, before
            # it writes anything (the plan has no S3 credentials to look with).
            return
        final = Path(os.path.abspath(os.fspath(self.path)))
        resolved = final.resolve()
        # A store without paths (S3: its root a StorePath) cannot overlap a local directory.
        if not isinstance(context.store_root, StorePath):
            store = context.store_root.resolve()
            if _overlaps(resolved, store):
                raise PlanError(f"{context.where}: path {str(final)!r} overlaps the result store {str(store)!r}; "
                                "a sink must write outside the store")
        for source in context.source_paths:
            source = source.resolve()
            if _overlaps(resolved, source):
                raise PlanError(f"{context.where}: path {str(final)!r} overlaps the source {str(source)!r}; "
                                "committing would replace or add to the stage's own input")
        problem = _foreign(final, context.dag_id, context.stage)
        if problem:
            raise PlanError(f"{context.where}: will not replace {str(final)!r}: {problem}")

    def create_writer(self, context: InitializationContext) -> SinkWriter:
        """Attempts write Parquet into their own attempt directory."""
        return _ParquetWriter(context, versioned=is_object_url(os.fspath(self.path)))

    def finalize_global(self, context: FinalizationContext) -> dict[str, Any]:
        """Publish the admitted attempts' files as ``part-<subtask>-<n>.parquet`` plus a ``_SUCCESS`` manifest."""
        if is_object_url(os.fspath(self.path)):
            return parquet_s3.finalize_s3(os.fspath(self.path), context)
        final = Path(os.fspath(self.path))
        if not final.is_absolute():
            raise StoreError(f"ParquetSink will not commit to relative path {str(final)!r}")
        parent = final.parent
        key = _run_key(context.dag_id, context.run_id, context.stage, final)
        token = f"{key}-{uuid.uuid4().hex[:8]}"
        staging = parent / f".{final.name}.staging-{token}"
        # Before anything is created: a foreign directory at the path means nothing may be touched.
        problem = _foreign(final, context.dag_id, context.stage)
        if problem:
            raise StoreError(f"ParquetSink will not replace {final}: {problem}")
        try:
            parent.mkdir(parents=True, exist_ok=True)
            _remove_leftovers(final, key)
            staging.mkdir()
            files = []
            for subtask in range(context.parallelism):
                result = context.attempts[subtask]
                for n, entry in enumerate(sorted(result.files, key=lambda f: f["path"])):
                    name = f"part-{subtask:05d}-{n:03d}.parquet"
                    remote = result.data_name is not None and _without_paths(context.store)
                    source = (context.store.describe(f"{result.data_name}/{entry['path']}") if remote
                              else str(Path(result.data_dir) / entry["path"]))
                    kind = entry_integrity(entry, stage=context.stage, subtask=subtask, attempt=result.attempt,
                                           shown=source)
                    if remote:
                        digests = _download(context.store, f"{result.data_name}/{entry['path']}", staging / name,
                                            expected=entry if kind == ETAG else None)
                    else:
                        _link_or_copy(Path(result.data_dir) / entry["path"], staging / name)
                        digests = _file_digests(staging / name) if kind == ETAG else None
                    checked: dict[str, Any] = {}
                    if kind == ETAG and digests is not None:
                        # The sink's own manifest keeps SHA-256 (of the staged bytes), checked below as ever.
                        checked = {"sha256": digests[0], "checked": _check_by_etag(entry, digests, source, final)}
                    files.append({"path": name, "size": entry["size"], "sha256": entry.get("sha256"), **checked,
                                  "subtask": subtask, "attempt": result.attempt, "records": entry.get("records")})
            for entry in files:
                if sha256_file(staging / entry["path"]) != entry["sha256"]:
                    raise StoreError(f"checksum mismatch while staging {entry['path']} for {final}")
            manifest = {"sink": "ParquetSink", "dag_id": context.dag_id, "run_id": context.run_id,
                        "stage": context.stage, "logical_date": context.logical_date, "files": files,
                        "committed_at": time.time(), "records": sum(f.get("records") or 0 for f in files)}
            atomic_write_json(staging / MANIFEST, manifest)
            _swap_in(staging, final, token, context.dag_id, context.stage)
        except OSError as exc:
            _remove_own(staging)
            raise StoreError(f"ParquetSink could not commit {final}: {exc}") from exc
        except BaseException:
            _remove_own(staging)
            raise
        return {"sink": "parquet", "path": str(final), "files": len(files), "records": manifest["records"]}

    def staging(self, scope: StagingScope) -> list[StagingObject]:
        """Staging and backup directories a crashed finalize of this stage run left next to the path."""
        if is_object_url(os.fspath(self.path)):
            return parquet_s3.staging_s3(os.fspath(self.path), scope)[1]
        final = Path(os.fspath(self.path))
        if not final.is_absolute() or not final.parent.is_dir():
            return []
        key = _run_key(scope.dag_id, scope.run_id, scope.stage, final)
        return [StagingObject(str(p), _dir_bytes(p)) for p in _leftovers(final, key)]

    def cleanup_staging(self, scope: StagingScope) -> list[str]:
        """Remove this stage run's staging leftovers; attempts' own files live in the store, not here."""
        if is_object_url(os.fspath(self.path)):
            return parquet_s3.cleanup_s3(os.fspath(self.path), scope)
        removed = []
        for obj in self.staging(scope):
            if _remove_own(Path(obj.name)):
                removed.append(obj.name)
        return removed


class _ParquetWriter(SinkWriter):
    def __init__(self, context: InitializationContext, *, versioned: bool = False) -> None:
        self.context = context
        self.versioned = versioned

    def write(self, df: Any) -> dict[str, Any]:
        # One file per subtask keeps the committed directory small and its names predictable.
        df.coalesce(1).write.parquet(self.context.data_url or str(self.context.data_dir))
        # On S3 each written output gets an id: a rerun's commit then publishes a version of its own even when
        # its attempt numbers and bytes match the last one, while a retry of one commit keeps its version.
        return {"write_id": uuid.uuid4().hex} if self.versioned else {}


def published_files(location: str, *, credentials: S3Credentials | None = None) -> list[str]:
    """The files a ParquetSink published at ``location`` (a path or ``s3://`` URL): what readers must read.

    On S3 they are the files ``_CURRENT`` names; ``spark.read.parquet(prefix)`` would also read retired and
    unpublished versions. Pass the result to ``spark.read.parquet(*files)`` or ``pyarrow.parquet``.
    ``credentials``: e.g. ``hooks.objectstore.s3_settings(conn_id, where)``; None: the AWS SDK's default chain.
    """
    return parquet_s3.published_files(location, credentials=credentials)


def _untemplated(url: str) -> str:
    """``url`` with each templated segment replaced by a placeholder, so its fixed part can be checked at parse."""
    return "/".join("tmpl" if "{{" in part or "{%" in part else part for part in url.split("/"))


def _object_asset_uri(url: str) -> str | None:
    """``s3://bucket/fixed/part`` of an S3 sink URL (``s3a`` shown as ``s3``, no credentials); None if unusable."""
    bucket, key = split_object_url(url)
    if "@" in bucket or parquet_s3.sink_url_problem(_untemplated(url)):
        return None
    fixed = []
    for part in key.split("/"):
        if "{{" in part or "{%" in part:
            break
        if part:
            fixed.append(part)
    # A prefix that starts with a template has no fixed part, as a local path starting with one: no asset.
    return f"s3://{bucket}/" + "/".join(fixed) if fixed else None


def clashing_sink_paths(sinks: dict[str, Sink]) -> str | None:
    """Which two stages' ParquetSinks name the same path, or one inside the other; None if none do.

    Compared as written (templates included): two stages with "/out/{{ ds }}" collide in every run.
    """
    paths = {name: _comparable(os.fspath(sink.path)) for name, sink in sorted(sinks.items())
             if isinstance(sink, ParquetSink) and isinstance(sink.path, str | os.PathLike) and os.fspath(sink.path)}
    names = list(paths)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = paths[a], paths[b]
            if pa == pb:
                return f"stages {a!r} and {b!r} both sink to {pa!r}; each commit would replace the other's output"
            if "{" not in pa + pb and (pb.startswith(pa.rstrip("/") + "/") or pa.startswith(pb.rstrip("/") + "/")):
                outer, inner = (a, b) if pb.startswith(pa.rstrip("/") + "/") else (b, a)
                return (f"stage {inner!r} sinks to {paths[inner]!r}, inside the sink path {paths[outer]!r} of "
                        f"stage {outer!r}; committing {outer!r} would move the output of {inner!r} away")
    return None


def _comparable(path: str) -> str:
    """``path`` as two sink paths are compared: a local path normalised, an S3 URL as ``s3://`` without trailing '/'."""
    if is_object_url(path):
        return "s3://" + path.split("://", 1)[1].rstrip("/")
    return posixpath.normpath(path)


def _run_key(dag_id: str, run_id: str, stage: str, final: Path) -> str:
    """Short key naming one stage run's staging next to ``final`` (so clean-up finds only its own)."""
    return hashlib.sha1(f"{dag_id}\0{run_id}\0{stage}\0{final}".encode()).hexdigest()[:12]


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def _rendered_problem(rendered: str, declared: Any) -> str | None:
    """Why a rendered path cannot be trusted to name the intended directory; None if it can.

    A template that renders empty leaves an empty part ("/out/q1/" from "/out/q1/{{ params.day }}"), and the
    sink would commit to the parent, which later dated runs then land inside; '.' and '..' parts name some
    other directory than the one written. Doubled or trailing slashes the author wrote are kept as written.
    """
    if "\0" in rendered:
        return "contains a NUL byte"
    parts = rendered.split("/")
    if any(part in (".", "..") for part in parts):
        return "has a '.' or '..' part once rendered"
    template = os.fspath(declared) if isinstance(declared, str | os.PathLike) else rendered
    if rendered != "/" and rendered.endswith("/") and not template.endswith("/"):
        return f"ends with '/' once rendered from {template!r}: a template rendered empty"
    if rendered.count("//") > template.count("//"):
        return f"has an empty part once rendered from {template!r}: a template rendered empty"
    return None


def _committed_output_above(final: Path) -> str | None:
    """Why ``final`` lies inside another ParquetSink's committed output; None if no ancestor is one."""
    for parent in final.parents:
        try:
            manifest = read_json(parent / MANIFEST)
        except StoreError:
            continue  # an unreadable file named _SUCCESS is no manifest of ours
        if isinstance(manifest, dict) and manifest.get("sink") == "ParquetSink" and "files" in manifest:
            return (f"it lies inside {str(parent)!r}, the committed output of DAG {manifest.get('dag_id')!r}, "
                    f"stage {manifest.get('stage')!r}; its readers would see these files and its next commit "
                    "would move them away")
    return None


def _foreign(final: Path, dag_id: str, stage: str) -> str | None:
    """Why ``final`` may not be replaced by this sink of ``dag_id``/``stage``; None if it is empty or ours."""
    if final.is_symlink():
        return "it is a symbolic link"
    nested = _committed_output_above(final)
    if nested:
        return nested
    if not final.exists():
        return None
    if not final.is_dir():
        return "it is not a directory"
    try:
        entries = [p.name for p in final.iterdir()]
    except OSError as exc:
        return f"it cannot be listed ({exc})"
    if not entries:
        return None
    try:
        manifest = read_json(final / MANIFEST)
    except StoreError:
        manifest = None
    if not isinstance(manifest, dict) or "files" not in manifest:
        return (f"it holds {len(entries)} entries (e.g. {sorted(entries)[0]!r}) and no ParquetSink manifest; "
                "the sink only replaces a directory it wrote or an empty one")
    if (manifest.get("dag_id"), manifest.get("stage")) != (dag_id, stage):
        return (f"it was committed by DAG {manifest.get('dag_id')!r}, stage {manifest.get('stage')!r}; "
                "two stages may not share a sink path")
    # Our own output, but something else was put inside it since: replacing it would move that away too.
    alien = sorted(name for name in entries if not _OWN_FILE.match(name) or (final / name).is_dir())
    if alien:
        return (f"besides this stage's committed files it holds {len(alien)} entries it did not write "
                f"(e.g. {alien[0]!r}); the sink never moves what it did not write")
    return None


def _leftovers(final: Path, key: str) -> list[Path]:
    out = []
    for prefix in (f".{final.name}.staging-{key}-", f".{final.name}.old-{key}-"):
        out += [p for p in final.parent.glob(prefix + "*") if p.is_dir() and not p.is_symlink()]
    return sorted(out)


def _remove_leftovers(final: Path, key: str) -> None:
    # A finalize of this stage run that crashed between its two renames leaves these behind.
    for stale in _leftovers(final, key):
        _remove_own(stale)


def _remove_own(directory: Path) -> bool:
    """Remove a staging or backup directory only if it holds nothing but what finalize writes."""
    try:
        if not directory.is_dir() or directory.is_symlink():
            return False
        entries = list(directory.iterdir())
    except OSError:
        return False
    if any(not p.is_file() or p.is_symlink() or not _OWN_FILE.match(p.name) for p in entries):
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return True


def _dir_bytes(directory: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for p in directory.iterdir():
            with contextlib.suppress(OSError):
                total += p.stat().st_size
    return total


def _without_paths(store: Any) -> bool:
    """Whether the attempts' output lives in a store without local paths (an object store)."""
    from airflow_provider_speculative.store.backend import PosixBackend

    return store is not None and not isinstance(store, PosixBackend)


def _download(store: Any, name: str, dst: Path,
              expected: dict[str, Any] | None = None) -> tuple[str, str, int] | None:
    """Copy object ``name`` of ``store`` into the local file ``dst`` (the staging checksum check follows).

    With ``expected`` (a manifest entry carrying the store's ETag): the object's size and ETag are checked
    against it first (one HeadObject), and the SHA-256, MD5 and size of the bytes streamed are handed back.
    """
    if expected is not None:
        info = store.stat(name)
        if info is None or info.size != expected["size"] or bare_etag(info.etag) != expected[ETAG]:
            raise StoreError(f"ParquetSink cannot stage {store.describe(name)}: checksum mismatch (the store's "
                             f"size and ETag are not the manifest's {expected['size']}, {expected[ETAG]})")
    stream = store.open_read(name)
    if stream is None:
        raise StoreError(f"ParquetSink cannot stage {store.describe(name)}: it does not exist")
    sha256, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with stream, open(dst, "xb") as out:
        while block := stream.read(1 << 20):
            out.write(block)
            if expected is not None:
                sha256.update(block)
                md5.update(block)
                size += len(block)
    return None if expected is None else (sha256.hexdigest(), md5.hexdigest(), size)


def _file_digests(path: Path) -> tuple[str, str, int]:
    """SHA-256, MD5 and size of the local file ``path``, from one read."""
    sha256, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            sha256.update(block)
            md5.update(block)
            size += len(block)
    return sha256.hexdigest(), md5.hexdigest(), size


def _check_by_etag(entry: dict[str, Any], digests: tuple[str, str, int], source: str, final: Path) -> str:
    """Check staged bytes against a manifest entry's ETag; what they were checked by (``md5`` or ``etag-size``).

    A plain ETag is the MD5 of the bytes: compared with the MD5 of what was staged. A multipart ETag
    (``...-N``) is a digest of the parts' MD5s, which needs the part size to recompute: the store's ETag was
    checked against the manifest before the download, and the staged size is checked here.
    """
    _, md5, size = digests
    if size != entry["size"]:
        raise StoreError(f"size mismatch while staging {source} for {final}: {size} != manifest {entry['size']}")
    if is_plain_md5(entry[ETAG]):
        if md5 != entry[ETAG]:
            raise StoreError(f"checksum mismatch while staging {source} for {final}")
        return "md5"
    return "etag-size"


def _link_or_copy(src: Path, dst: Path) -> None:
    # A hard link costs nothing and leaves the attempt's own file untouched for garbage collection.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _swap_in(staging: Path, final: Path, token: str, dag_id: str, stage: str) -> None:
    """Replace ``final`` by ``staging``: readers see the old or the new directory, never a mix."""
    old = final.parent / f".{final.name}.old-{token}"
    # Checked again right before the rename: another writer may have put something there meanwhile.
    problem = _foreign(final, dag_id, stage)
    if problem:
        raise StoreError(f"ParquetSink will not replace {final}: {problem}")
    if final.exists():
        os.rename(final, old)
    try:
        os.rename(staging, final)
    except OSError:
        if old.exists() and not final.exists():
            os.rename(old, final)  # put the previous commit back untouched
        raise
    _remove_own(old)
