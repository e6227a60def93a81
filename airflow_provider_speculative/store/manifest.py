"""Attempt manifests: the list of output files with sizes and checksums, written last."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from airflow_provider_speculative.exceptions import PartitionError
from airflow_provider_speculative.store.files import atomic_write_json, read_json, sha256_file

SUBPARTITION_COLUMN = "_sp"
_SP = re.compile(rf"(?:^|/){SUBPARTITION_COLUMN}=(\d+)(?:/|$)")


def _data_files(data_dir: Path) -> list[Path]:
    # Spark's own bookkeeping files are not data.
    return sorted(p for p in data_dir.rglob("*") if p.is_file()
                  and not p.name.startswith((".", "_")) and not p.name.endswith(".crc"))


def build_manifest(data_dir: str | Path, **extra: Any) -> dict[str, Any]:
    """Describe every data file under ``data_dir``: relative path, size, SHA-256, subpartition."""
    data_dir = Path(data_dir)
    files = []
    for path in _data_files(data_dir) if data_dir.is_dir() else []:
        rel = path.relative_to(data_dir).as_posix()
        match = _SP.search(rel)
        files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path),
                      "subpartition": int(match.group(1)) if match else None})
    return {"version": 1, "files": files, "bytes": sum(f["size"] for f in files), **extra}


def write_manifest(manifest_path: str | Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically; its presence marks the attempt's output complete."""
    atomic_write_json(manifest_path, manifest)


def read_manifest(manifest_path: str | Path) -> dict[str, Any] | None:
    """Read a manifest, or None if the attempt has not completed its output."""
    manifest: dict[str, Any] | None = read_json(manifest_path)
    return manifest


def verify_files(data_dir: str | Path, files: list[dict[str, Any]], *, checksums: bool = True,
                 stage: str | None = None, subtask: int | None = None, attempt: int | None = None) -> None:
    """Raise :class:`PartitionError` if a listed file is missing, has another size or checksum."""
    data_dir = Path(data_dir)
    who = f"stage {stage!r} subtask {subtask} attempt {attempt}"
    for entry in files:
        path = data_dir / entry["path"]
        if not path.is_file():
            raise PartitionError(f"missing partition file {path} ({who})",
                                 stage=stage, subtask=subtask, attempt=attempt)
        size = path.stat().st_size
        if size != entry["size"]:
            raise PartitionError(f"corrupt partition file {path} ({who}): size {size} != manifest {entry['size']}",
                                 stage=stage, subtask=subtask, attempt=attempt)
        if checksums and sha256_file(path) != entry["sha256"]:
            raise PartitionError(f"corrupt partition file {path} ({who}): checksum mismatch",
                                 stage=stage, subtask=subtask, attempt=attempt)
