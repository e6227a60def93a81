"""Parquet directory sink: the final directory is replaced atomically with the admitted attempts' files."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.sinks.base import (
    FinalizationContext,
    InitializationContext,
    Sink,
    SinkWriter,
    SupportsConcurrentExecutionAttempts,
)
from airflow_provider_speculative.store.files import atomic_write_json, sha256_file


class ParquetSink(Sink, SupportsConcurrentExecutionAttempts):
    """Write the stage's output as Parquet files into ``path`` (templated, e.g. ``out/{{ ds }}``).

    Attempts write into their own attempt directories, so concurrent attempts never collide; finalize
    builds a complete staging directory from the admitted attempts only and swaps it in with renames.
    A rerun of the same logical date replaces the directory, never appends to it.
    """


    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> dict[str, Any]:
        """Constructor arguments."""
        return {"path": self.path}

    def create_writer(self, context: InitializationContext) -> SinkWriter:
        """Attempts write Parquet into their own attempt directory."""
        return _ParquetWriter(context)

    def finalize_global(self, context: FinalizationContext) -> dict[str, Any]:
        """Publish the admitted attempts' files as ``part-<subtask>-<n>.parquet`` plus a ``_SUCCESS`` manifest."""
        final = Path(self.path)
        parent = final.parent
        token = uuid.uuid4().hex[:12]
        staging = parent / f".{final.name}.staging-{token}"
        try:
            parent.mkdir(parents=True, exist_ok=True)
            _remove_leftovers(final)
            staging.mkdir()
            files = []
            for subtask in range(context.parallelism):
                result = context.attempts[subtask]
                for n, entry in enumerate(sorted(result.files, key=lambda f: f["path"])):
                    name = f"part-{subtask:05d}-{n:03d}.parquet"
                    _link_or_copy(Path(result.data_dir) / entry["path"], staging / name)
                    files.append({"path": name, "size": entry["size"], "sha256": entry["sha256"],
                                  "subtask": subtask, "attempt": result.attempt, "records": entry.get("records")})
            for entry in files:
                if sha256_file(staging / entry["path"]) != entry["sha256"]:
                    raise StoreError(f"checksum mismatch while staging {entry['path']} for {final}")
            manifest = {"dag_id": context.dag_id, "run_id": context.run_id, "stage": context.stage,
                        "logical_date": context.logical_date, "files": files, "committed_at": time.time(),
                        "records": sum(f.get("records") or 0 for f in files)}
            atomic_write_json(staging / "_SUCCESS", manifest)
            _swap_in(staging, final, token)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise StoreError(f"ParquetSink could not commit {final}: {exc}") from exc
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return {"sink": "parquet", "path": str(final), "files": len(files), "records": manifest["records"]}


class _ParquetWriter(SinkWriter):
    def __init__(self, context: InitializationContext) -> None:
        self.context = context

    def write(self, df: Any) -> dict[str, Any]:
        # One file per subtask keeps the committed directory small and its names predictable.
        df.coalesce(1).write.parquet(str(self.context.data_dir))
        return {}


def _remove_leftovers(final: Path) -> None:
    # A finalize that crashed between its two renames leaves these behind; the retry cleans up.
    for stale in final.parent.glob(f".{final.name}.*-*"):
        if stale.name.startswith((f".{final.name}.staging-", f".{final.name}.old-")):
            shutil.rmtree(stale, ignore_errors=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    # A hard link costs nothing and leaves the attempt's own file untouched for garbage collection.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _swap_in(staging: Path, final: Path, token: str) -> None:
    """Replace ``final`` by ``staging``: readers see the old or the new directory, never a mix."""
    old = final.parent / f".{final.name}.old-{token}"
    if final.exists():
        os.rename(final, old)
    try:
        os.rename(staging, final)
    except OSError:
        if old.exists() and not final.exists():
            os.rename(old, final)  # put the previous commit back untouched
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(old)
