"""Committed stage results and loser clean-up."""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_speculative.core.plan import file_subpartitions
from airflow_provider_speculative.exceptions import PartitionError, StoreError
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout
from airflow_provider_speculative.store.manifest import verify_files_in

log = logging.getLogger(__name__)


def _manifest(layout: StageLayout, subtask: int, attempt: int) -> dict[str, Any] | None:
    """An attempt's manifest by name (``manifest.read_manifest`` on the layout's backend)."""
    manifest: dict[str, Any] | None = layout.store.read_json(layout.name(layout.manifest(subtask, attempt)))
    return manifest


def admitted_results(layout: StageLayout, admitted: dict[int, int]) -> dict[str, Any]:
    """Build the committed record: for every subtask its admitted attempt, data dir and manifest."""
    subtasks = {}
    for subtask, attempt in sorted(admitted.items()):
        manifest = _manifest(layout, subtask, attempt)
        if manifest is None:
            raise PartitionError(
                f"stage {layout.stage!r} subtask {subtask} attempt {attempt} was admitted but has no manifest "
                f"at {layout.manifest(subtask, attempt)}", stage=layout.stage, subtask=subtask, attempt=attempt)
        subtasks[str(subtask)] = {"attempt": attempt, "data": str(layout.data(subtask, attempt)),
                                  "files": manifest["files"], "schema": manifest.get("schema"),
                                  "records": manifest.get("records"), "bytes": manifest.get("bytes"),
                                  "sink": manifest.get("sink") or {},
                                  "partitioning": manifest.get("partitioning")}
    return {"stage": layout.stage, "parallelism": len(subtasks), "subtasks": subtasks}


def compact(entry: dict[str, Any]) -> dict[str, Any]:
    """A committed subtask without its file list: consumers read files from the attempt's manifest.

    What planning needs stays: bytes per subpartition (for ranges and input sizes), totals and schema.
    A 1,000-producer stage with 1,000 subpartitions each would otherwise commit a million file entries.
    """
    files = entry.get("files")
    if files is None:
        return entry
    per_sp: dict[str, int] = {}
    for f in files:
        for sp, size in file_subpartitions(f).items():
            per_sp[str(sp)] = per_sp.get(str(sp), 0) + size
    out = {k: v for k, v in entry.items() if k != "files"}
    out.update(file_count=len(files), subpartition_bytes=per_sp,
               bytes=entry.get("bytes") if entry.get("bytes") is not None else sum(int(f["size"]) for f in files))
    return out


def write_committed(layout: StageLayout, record: dict[str, Any]) -> None:
    """Atomically publish the stage's committed results (compact: file lists stay in the manifests)."""
    subtasks = {k: compact(v) for k, v in (record.get("subtasks") or {}).items()}
    layout.store.replace_json(layout.name(layout.committed), {**record, "subtasks": subtasks})


def committed_files(layout: StageLayout, subtask: int, attempt: int) -> list[dict[str, Any]]:
    """The files of a committed attempt, from its manifest (raises PartitionError if it is gone)."""
    manifest = _manifest(layout, subtask, attempt)
    if manifest is None:
        raise PartitionError(f"stage {layout.stage!r} subtask {subtask} attempt {attempt} is committed but its "
                             f"manifest {layout.manifest(subtask, attempt)} is missing",
                             stage=layout.stage, subtask=subtask, attempt=attempt)
    return list(manifest["files"])


def read_committed(layout: StageLayout) -> dict[str, Any]:
    """Read a stage's committed results or raise naming the stage that has none."""
    record: dict[str, Any] | None = layout.store.read_json(layout.name(layout.committed))
    if record is None:
        raise StoreError(f"stage {layout.stage!r} has no committed result at {layout.committed}")
    return record


def remove_attempt_output(layout: StageLayout, subtask: int, attempt: int) -> bool:
    """Delete a losing attempt's manifest, then its data, by owned deletes (its status stays for the record).

    True if anything was there. Idempotent: what is gone already is fine. Raises RunNotOwnedError, deleting
    nothing, unless this store owns the DAG run's prefix (``StageLayout.claim_run``).
    """
    layout.require_owned_run()
    # Manifest first: it marks the data complete, so it must never outlive the data.
    removed = layout.delete(layout.manifest(subtask, attempt))
    return layout.delete_tree(layout.data(subtask, attempt)) > 0 or removed


def discard_attempt_output(layout: StageLayout, subtask: int, attempt: int) -> bool:
    """:func:`remove_attempt_output` for a controller's clean-up: a run this store does not own keeps the output.

    Keeping a loser's output costs only space (an invalidated attempt is marked so already), whereas
    failing the controller over it would fail the stage; the refusal is logged with what was kept.
    """
    try:
        return remove_attempt_output(layout, subtask, attempt)
    except RunNotOwnedError as exc:
        log.warning("output of subtask %d attempt %d kept: %s", subtask, attempt, exc)
        return False


def broken_admissions(layout: StageLayout, parallelism: int) -> list[tuple[int, int, str]]:
    """Admitted attempts whose output is gone or damaged (manifest missing, file missing or resized)."""
    broken = []
    for subtask in range(parallelism):
        marker = layout.store.read_json(layout.name(layout.admitted(subtask)))
        if marker is None:
            continue
        attempt = marker["attempt"]
        manifest = _manifest(layout, subtask, attempt)
        if manifest is None:
            broken.append((subtask, attempt, "manifest missing"))
            continue
        try:
            # Sizes only: re-hashing every committed file on each retry would cost a full read.
            verify_files_in(layout.store, layout.name(layout.data(subtask, attempt)), manifest["files"],
                            checksums=False, stage=layout.stage, subtask=subtask, attempt=attempt)
        except PartitionError as exc:
            broken.append((subtask, attempt, str(exc)))
    return broken
