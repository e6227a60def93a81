"""Attempt logs: where each attempt's driver output lives, and a bounded tail of it.

Every attempt writes its driver's stdout and stderr (spark-submit, or the Spark Connect client) to
``<stage>/subtask=<i>/attempt=<k>/spark-submit.log`` in the store. The CLI (``airflow speculative
logs``), the UI's log page and the failure message in the task log all read it through here, so they
agree on which attempt is meant and never read more than ``max_bytes`` of a log that may be gigabytes.

On a POSIX store the log is a file of the attempt's directory, read by path under the store's rules
(:func:`~airflow_provider_speculative.store.files.open_in_store`: no link, no FIFO, one hard link). On a store
without paths (S3) it is read by name through the backend (``stat``, then ``read_range``): the attempt's supervisor
writes it to a local file of its host (``store/layout.py``'s ``local_attempt_dir``) and uploads it to that
name when the attempt ends. Until then :class:`AttemptLog` says where it is (``note``); a reader on the
supervisor's own host reads that local file, under the same rules as a store file.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from airflow_provider_speculative.control.locallog import local_log, open_local, runs_here, supervisor_host
from airflow_provider_speculative.control.readmodel import find_stage_key, run_plans
from airflow_provider_speculative.core.states import Attempt
from airflow_provider_speculative.exceptions import NotFoundError, StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.files import open_in_store
from airflow_provider_speculative.store.layout import StageLayout, local_root

# What the UI and CLI show by default: the end of a driver log is where the error is.
DEFAULT_TAIL_BYTES = 64 * 1024
MAX_TAIL_BYTES = 4 * 1024 * 1024
# The task log gets a few lines of the first failed attempt, each cut so one minified line cannot flood it.
FAILURE_TAIL_LINES = 20
FAILURE_LINE_CHARS = 400
FAILURE_TAIL_BYTES = 16 * 1024


@dataclass(frozen=True)
class AttemptLog:
    """The tail of one attempt's log: ``text`` holds the bytes from ``start`` to ``size``."""

    dag_id: str
    run_id: str
    stage: str
    subtask: int
    attempt: int
    path: Path
    size: int
    start: int
    text: str
    exists: bool
    note: str = ""
    """Why the log is not (all) in the store yet, and where it is meanwhile; ``""`` when the store has it."""
    local: Path | None = None
    """The supervisor's local log on this host that ``text`` was read from (a running attempt on S3), else None."""
    elsewhere: bool = False
    """The log exists but is not readable from here: a local file of another host (on S3, until the attempt ends)."""

    @property
    def truncated(self) -> bool:
        """Whether the log has bytes before the tail shown."""
        return self.start > 0

    def to_json(self) -> dict[str, Any]:
        """The JSON the UI and ``--output json`` get."""
        return {"dag_id": self.dag_id, "run_id": self.run_id, "stage": self.stage, "subtask": self.subtask,
                "attempt": self.attempt, "path": str(self.path), "exists": self.exists, "size": self.size,
                "start": self.start, "truncated": self.truncated, "text": self.text, "note": self.note,
                "local": self.local is not None, "elsewhere": self.elsewhere}


def read_tail(root: Path, path: Path, max_bytes: int) -> tuple[int, int, str]:
    """(size, start offset, text) of the last ``max_bytes`` of the store file ``path``; a cut first line is dropped."""
    with open_in_store(root, path) as log:
        size = os.fstat(log.fileno()).st_size
        start = max(0, size - max_bytes)
        log.seek(start)
        data = log.read(max_bytes)
    return (size, *_tail_text(start, data))


def _tail_text(start: int, data: bytes) -> tuple[int, str]:
    """(start, text) of a tail read from offset ``start``: a first line cut by the read is dropped."""
    if start > 0:
        # Start at a line boundary: half a line (or half a UTF-8 character) helps nobody.
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            start += newline + 1
            data = data[newline + 1:]
    return start, data.decode("utf-8", errors="replace")


def read_stored_tail(store: StoreBackend, name: str, max_bytes: int) -> tuple[int, int, str] | None:
    """:func:`read_tail` of object ``name`` by name (``stat``, then one ranged read); None if it does not exist."""
    info = store.stat(name)
    if info is None:
        return None
    start = max(0, info.size - max_bytes)
    data = store.read_range(name, start, max_bytes)
    if data is None:
        return None  # removed since the stat
    return (info.size, *_tail_text(start, data))


def attempt_log(root: Path | StoreBackend, dag_id: str, run_id: str, stage: str, subtask: int,
                attempt: int | None = None, max_bytes: int = DEFAULT_TAIL_BYTES) -> AttemptLog:
    """The tail of an attempt's log (default: the subtask's latest attempt); NotFoundError names what is missing.

    ``root``: the store's backend, or a root path (a POSIX directory, or a store's ``StorePath`` anchor).
    """
    if not 0 < max_bytes <= MAX_TAIL_BYTES:
        raise ValueError(f"max_bytes must be between 1 and {MAX_TAIL_BYTES}, got {max_bytes}")
    layout = StageLayout.at(root, dag_id, run_id, stage)
    if not layout.exists(layout.plan):
        # A stage of a pipeline compiled as a TaskGroup is keyed by its task id; its bare name, if no other
        # grouped pipeline of the DAG has it, names it too.
        stage = find_stage_key(run_plans(layout.store, dag_id, run_id), stage, f"DAG {dag_id!r} run {run_id!r}")
        layout = StageLayout.at(layout.store, dag_id, run_id, stage)
    plan = layout.read_json(layout.plan)
    if not isinstance(plan, dict):
        raise NotFoundError(f"DAG {dag_id!r} run {run_id!r}: no stage {stage!r} is recorded in the store")
    parallelism = plan.get("parallelism")
    if not isinstance(parallelism, int) or not 0 <= subtask < parallelism:
        raise NotFoundError(f"DAG {dag_id!r} run {run_id!r} stage {stage!r}: no subtask {subtask} "
                            f"(parallelism {parallelism})")
    numbers = layout.attempt_numbers(subtask)
    if attempt is None:
        if not numbers:
            raise NotFoundError(f"DAG {dag_id!r} run {run_id!r} stage {stage!r} subtask {subtask}: "
                                "no attempt launched yet")
        attempt = numbers[-1]
    elif attempt not in numbers:
        raise NotFoundError(f"DAG {dag_id!r} run {run_id!r} stage {stage!r} subtask {subtask}: no attempt "
                            f"{attempt} (attempts: {', '.join(map(str, numbers)) or 'none'})")
    path = layout.log(subtask, attempt)
    if not isinstance(layout.store, PosixBackend):
        return _log_by_name(layout, subtask, attempt, max_bytes)
    try:
        size, start, text = read_tail(layout.root, path, max_bytes)
        exists = True
    except FileNotFoundError:  # claimed, not started yet (or removed by gc with the attempt's output)
        size, start, text, exists = 0, 0, "", False
    except UnsafeStorePathError as exc:
        raise NotFoundError(f"DAG {dag_id!r} run {run_id!r} stage {stage!r} subtask {subtask} attempt {attempt}: "
                            f"its log is not served ({exc})") from None
    return AttemptLog(dag_id, run_id, stage, subtask, attempt, path, size, start, text, exists)


def _log_by_name(layout: StageLayout, subtask: int, attempt: int, max_bytes: int) -> AttemptLog:
    """:func:`attempt_log` on a store without paths: the uploaded log by name, else where the log is meanwhile."""
    path = layout.log(subtask, attempt)
    ids = (layout.dag_id, layout.run_id, layout.stage, subtask, attempt, path)
    found = read_stored_tail(layout.store, layout.name(path), max_bytes)
    if found is not None:
        return AttemptLog(*ids, *found, exists=True)
    status = layout.read_json(layout.status(subtask, attempt))
    if not isinstance(status, dict):
        return AttemptLog(*ids, 0, 0, "", exists=False)  # claimed, its supervisor not started yet
    host, where = supervisor_host(status), _local_log_shown(layout, subtask, attempt)
    on_host = f"on host {host}" if host else "on its supervisor's host"
    if status.get("end_at") is not None:
        return AttemptLog(*ids, 0, 0, "", exists=False, elsewhere=True, note=(
            f"attempt {attempt} ended but its log is not in the store (its upload failed, or gc removed it); "
            f"its supervisor's local copy may still be {on_host}, in {where} under its $AIRFLOW_HOME"))
    if runs_here(status):
        local = local_log(layout, subtask, attempt)
        try:
            # Under the rules of a store file: the attempt's code on this host can write that directory too.
            size, start, text = read_tail(local_root(), local, max_bytes)
        except (OSError, UnsafeStorePathError):
            pass  # not readable here after all (a link or a FIFO is refused): say where it is instead
        else:
            return AttemptLog(*ids, size, start, text, exists=True, local=local, note=(
                f"attempt {attempt} is running: its log is read from its supervisor's local file on this host "
                f"({where} under $AIRFLOW_HOME); the store has it once the attempt ends"))
    return AttemptLog(*ids, 0, 0, "", exists=False, elsewhere=True, note=(
        f"attempt {attempt} is running: its log is in the store once it ends; until then it is a local file "
        f"{on_host}, in {where} under its $AIRFLOW_HOME"))


def _local_log_shown(layout: StageLayout, subtask: int, attempt: int) -> str:
    """The local log's path relative to ``$AIRFLOW_HOME``: no absolute path of this host in a message."""
    root = local_root()
    return (Path(root.name) / local_log(layout, subtask, attempt).relative_to(root)).as_posix()


def open_attempt_log(root: Path | StoreBackend, log: AttemptLog) -> BinaryIO:
    """The whole log of ``log``'s attempt, opened under the store's rules (see :func:`open_in_store`).

    On a store without paths: the uploaded object, streamed; while the attempt runs, the supervisor's local file
    on this host that :func:`attempt_log` read (``log.local``), under the same rules.
    """
    layout = StageLayout.at(root, log.dag_id, log.run_id, log.stage)
    try:
        if isinstance(layout.store, PosixBackend):
            return open_in_store(layout.root, log.path)
        stream = layout.store.open_read(layout.name(log.path))
        if stream is not None:
            return stream
        if log.local is not None:
            return open_local(log.local)
        raise FileNotFoundError(log.note)
    except (FileNotFoundError, UnsafeStorePathError) as exc:
        if isinstance(exc, UnsafeStorePathError):
            reason = f"its log is not served ({exc})"
        else:
            reason = log.note or "it has written no log yet"
        raise NotFoundError(f"DAG {log.dag_id!r} run {log.run_id!r} stage {log.stage!r} subtask {log.subtask} "
                            f"attempt {log.attempt}: {reason}") from None


def logs_command(dag_id: str, run_id: str, stage: str, subtask: int | str, attempt: int | str) -> str:
    """The CLI command that prints this attempt's log (``subtask``/``attempt`` may be placeholders)."""
    # Ids come from DAG authors and the store: quoted, the line is safe to paste into a shell.
    return (f"airflow speculative logs -d {shlex.quote(dag_id)} -r {shlex.quote(run_id)} -s {shlex.quote(stage)} "
            f"--subtask {subtask} --attempt {attempt}")


def failure_log_lines(layout: StageLayout, failed: list[tuple[int, int]]) -> list[str]:
    """For a failed stage's task log: where the failed attempts' logs are, and the end of the first one."""
    if not failed:
        return []
    lines = [f"attempt logs are in the store under {layout.dir}/subtask=<i>/attempt=<k>/spark-submit.log; "
             f"print one with: {logs_command(layout.dag_id, layout.run_id, layout.stage, *failed[0])}"]
    subtask, attempt = failed[0]
    try:
        if isinstance(layout.store, PosixBackend):
            _, _, text = read_tail(Path(layout.root), layout.log(subtask, attempt), FAILURE_TAIL_BYTES)
        else:
            # A store without paths holds the log once the attempt ended (its supervisor uploads it by name).
            found = read_stored_tail(layout.store, layout.name(layout.log(subtask, attempt)), FAILURE_TAIL_BYTES)
            if found is None:
                note = _log_by_name(layout, subtask, attempt, 1).note or "not written (its supervisor never started)"
                lines.append(f"subtask {subtask} attempt {attempt}'s log {layout.log(subtask, attempt)}: {note}")
                return lines
            text = found[2]
    except (OSError, StoreError):
        return lines
    tail = [line if len(line) <= FAILURE_LINE_CHARS else line[:FAILURE_LINE_CHARS] + " [...]"
            for line in text.splitlines()[-FAILURE_TAIL_LINES:]]
    if tail:
        lines.append(f"last {len(tail)} lines of subtask {subtask} attempt {attempt}'s log:")
        lines += [f"  | {line}" for line in tail]
    return lines


def attempt_ended(root: Path | StoreBackend, log: AttemptLog) -> bool:
    """Whether the attempt's launcher recorded its end (its log will not grow any more)."""
    layout = StageLayout.at(root, log.dag_id, log.run_id, log.stage)
    status = layout.read_json(layout.status(log.subtask, log.attempt))
    return isinstance(status, dict) and status.get("end_at") is not None


def read_from(root: Path, path: Path, offset: int, max_bytes: int = 1024 * 1024) -> tuple[int, str]:
    """(new offset, text) of store file ``path`` past ``offset`` (at most ``max_bytes``; a cut line waits)."""
    try:
        with open_in_store(root, path) as log:
            log.seek(offset)
            data = log.read(max_bytes)
    except (FileNotFoundError, UnsafeStorePathError):
        return offset, ""
    return _advance(offset, data, max_bytes)


def _advance(offset: int, data: bytes, max_bytes: int) -> tuple[int, str]:
    """(new offset, text) of ``data`` read at ``offset``: a line cut at a full buffer's end waits for the next read."""
    if len(data) == max_bytes and b"\n" in data:
        data = data[:data.rindex(b"\n") + 1]  # a line cut at the buffer's end is printed whole next time
    return offset + len(data), data.decode("utf-8", errors="replace")


def read_log_from(root: Path | StoreBackend, log: AttemptLog, offset: int,
                  max_bytes: int = 1024 * 1024) -> tuple[int, str]:
    """:func:`read_from` of ``log``'s attempt log on any store: what it gained past ``offset`` (``--follow``).

    On a store without paths the uploaded object by a ranged read; while it is not there, the supervisor's local
    file on this host that :func:`attempt_log` read (the upload is a copy of it: offsets carry over), else nothing.
    """
    layout = StageLayout.at(root, log.dag_id, log.run_id, log.stage)
    if isinstance(layout.store, PosixBackend):
        return read_from(layout.root, log.path, offset, max_bytes)
    data = layout.store.read_range(layout.name(log.path), offset, max_bytes)
    if data is None and log.local is not None:
        return read_from(local_root(), log.local, offset, max_bytes)
    return _advance(offset, data or b"", max_bytes)


def attempt_lines(layout: StageLayout, attempts: Iterable[Attempt], admitted: Mapping[int, int]) -> list[str]:
    """For the task log when a stage ends: every attempt with its target, node, state and log file, one line each.

    Linear in attempts; the paths are relative to the stage directory, named once in the first line.
    """
    lines = [f"attempts of stage {layout.stage} (logs under {layout.dir}; print one with "
             f"`{logs_command(layout.dag_id, layout.run_id, layout.stage, 'I', 'K')}`):"]
    for a in sorted(attempts, key=lambda a: (a.subtask, a.number)):
        flags = [f for f, on in (("speculative", a.speculative), ("admitted", admitted.get(a.subtask) == a.number))
                 if on]
        exit_code = "" if a.exit_code is None else f", exit {a.exit_code}"
        lines.append(f"  subtask {a.subtask} attempt {a.number} on {a.target} (node {a.node or a.target}): "
                     f"{a.state.name}{exit_code}{' [' + ', '.join(flags) + ']' if flags else ''}; "
                     f"log subtask={a.subtask}/attempt={a.number}/spark-submit.log")
    return lines
