"""What planning reads of the world: source files (listed and checked to be Parquet) and the application.

One place for the operator, the standalone runner, tests and benchmarks, so every path that plans a
stage applies the same checks (each message names pipeline, stage and input).
"""

from __future__ import annotations

import glob
from pathlib import Path
from urllib.parse import urlsplit

from airflow_provider_speculative.core.graph import SourceSpec, StageSpec
from airflow_provider_speculative.core.paths import fixed_part, glob_match, is_object_url, split_object_url
from airflow_provider_speculative.exceptions import PlanError


def list_sources(spec: StageSpec, where: str, s3_conn_id: str = "") -> dict[str, list[tuple[str, int]]]:
    """(path, size) of every source input's files, by input name; raise :class:`PlanError` naming the input."""
    return {name: list_source_files(src, f"{where}, input {name!r}", s3_conn_id)
            for name, src in spec.inputs.items() if isinstance(src, SourceSpec)}


def application_path(application: str, where: str) -> str:
    """An application URL (any ``scheme://``) as given; a local path made absolute and checked to exist."""
    if urlsplit(application).scheme and "://" in application:
        return application
    path = Path(application).resolve()
    if path.is_dir():
        raise PlanError(f"{where}: application {application!r} is a directory (resolved to {path}); give the "
                        ".py file of the stage's PySpark application")
    if not path.is_file():
        raise PlanError(f"{where}: application {application!r} does not exist (resolved to {path})")
    return str(path)


def source_root(source: SourceSpec) -> Path:
    """The fixed directory part of a source path (a glob's directory before its first wildcard)."""
    fixed: list[str] = []
    for part in Path(source.path).parts:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(source.path)


PARQUET_MAGIC = b"PAR1"


def parquet_problem(path: Path, size: int) -> str | None:
    """Why ``path`` is not a Parquet file (magic bytes at both ends); None if it looks like one."""
    if size < 2 * len(PARQUET_MAGIC) + 4:
        return "empty" if size == 0 else f"only {size} bytes"
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(PARQUET_MAGIC))
            handle.seek(-len(PARQUET_MAGIC), 2)
            tail = handle.read(len(PARQUET_MAGIC))
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return "no Parquet magic bytes (PAR1) at its start and end"
    # The footer too (one small read): a truncated or corrupt file would otherwise pass the plan and
    # fail inside Spark, in every attempt that reads it.
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError or others for a bad footer
        return f"its Parquet footer cannot be read ({type(exc).__name__}: {exc})"
    return None


def list_source_files(source: SourceSpec, where: str, s3_conn_id: str = "") -> list[tuple[str, int]]:
    """List a source's data files (a directory, a file or a glob) with their sizes; check they are Parquet."""
    path = source.path
    if is_object_url(path):
        return list_object_files(source, where, s3_conn_id)
    if any(ch in path for ch in "*?["):
        candidates = [Path(p) for p in glob.glob(path, recursive=True)]
    elif Path(path).is_dir():
        candidates = list(Path(path).rglob(f"*.{source.format}"))
    elif Path(path).exists():
        candidates = [Path(path)]
    else:
        raise PlanError(f"{where}: source {path!r} does not exist")
    files = [(str(p.resolve()), p.stat().st_size) for p in candidates
             if p.is_file() and not p.name.startswith((".", "_"))]
    if not files:
        raise PlanError(f"{where}: source {path!r} has no {source.format} files")
    bad = [(f, problem) for f, size in files if (problem := parquet_problem(Path(f), size))]
    if bad:
        first, problem = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PlanError(f"{where}: source {path!r}: {first} is not a Parquet file: {problem}{more}")
    return sorted(files)


# Footer checks of object-store files are round trips, not disk reads: a few in flight at once.
OBJECT_CHECK_THREADS = 16


def list_object_files(source: SourceSpec, where: str, s3_conn_id: str = "") -> list[tuple[str, int]]:
    """An ``s3://`` source's data files with their sizes (a prefix, one object or a glob on keys), checked."""
    from concurrent.futures import ThreadPoolExecutor

    from pyarrow.fs import FileSelector, FileType

    from airflow_provider_speculative.hooks.objectstore import fs_path, s3_filesystem, s3_settings

    url = source.path
    scheme = url.split("://", 1)[0]
    fs = s3_filesystem(s3_settings(s3_conn_id, where))
    bucket, key = split_object_url(url)
    wildcard = any(ch in key for ch in "*?[")
    base = fixed_part("/" + key).lstrip("/") if wildcard else key.rstrip("/")
    root = f"{bucket}/{base}".rstrip("/")
    single = False
    try:
        info = fs.get_file_info(root)
        if info.type == FileType.File and not wildcard:
            entries, single = [info], True
        elif info.type == FileType.Directory or wildcard or not base:
            entries = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
        else:
            raise PlanError(f"{where}: source {url!r} does not exist")
    except PlanError:
        raise
    except OSError as exc:
        # pyarrow's message names bucket and key (never the credentials); the type says which failure.
        raise PlanError(f"{where}: source {url!r} cannot be listed: {exc}") from None
    pattern = fs_path(url) if wildcard else None
    files = []
    for entry in entries:
        name = entry.path.rsplit("/", 1)[-1]
        if entry.type != FileType.File or name.startswith((".", "_")):
            continue
        if pattern is not None and not glob_match(pattern, entry.path):
            continue
        if not single and pattern is None and not name.endswith(f".{source.format}"):
            continue
        files.append((f"{scheme}://{entry.path}", int(entry.size or 0)))
    if not files:
        raise PlanError(f"{where}: source {url!r} has no {source.format} files")

    def check(item: tuple[str, int]) -> tuple[str, str | None]:
        return item[0], object_parquet_problem(fs, fs_path(item[0]), item[1])

    with ThreadPoolExecutor(max_workers=min(OBJECT_CHECK_THREADS, len(files))) as pool:
        bad = [(f, problem) for f, problem in pool.map(check, files) if problem]
    if bad:
        first, problem = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PlanError(f"{where}: source {url!r}: {first} is not a Parquet file: {problem}{more}")
    return sorted(files)


def object_parquet_problem(fs: object, path: str, size: int) -> str | None:
    """Like :func:`parquet_problem` for an object in ``fs`` (magic bytes and footer, two ranged reads)."""
    import pyarrow.parquet as pq

    if size < 2 * len(PARQUET_MAGIC) + 4:
        return "empty" if size == 0 else f"only {size} bytes"
    try:
        with fs.open_input_file(path) as handle:  # type: ignore[attr-defined]
            head = handle.read_at(len(PARQUET_MAGIC), 0)
            tail = handle.read_at(len(PARQUET_MAGIC), size - len(PARQUET_MAGIC))
            if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
                return "no Parquet magic bytes (PAR1) at its start and end"
            pq.read_metadata(handle)
    except OSError as exc:
        return f"unreadable ({exc})"
    except Exception as exc:  # pyarrow raises ArrowInvalid or others for a bad footer
        return f"its Parquet footer cannot be read ({type(exc).__name__}: {exc})"
    return None
