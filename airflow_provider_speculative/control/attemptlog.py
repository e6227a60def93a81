"""Attempt logs: where each attempt's driver output lives, and a bounded tail of it.

Every attempt writes its driver's stdout and stderr (spark-submit, or the Spark Connect client) to
``<stage>/subtask=<i>/attempt=<k>/spark-submit.log`` in the store. The CLI (``airflow speculative
logs``), the UI's log page and the failure message in the task log all read it through here, so they
agree on which attempt is meant and never read more than ``max_bytes`` of a log that may be gigabytes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from airflow_provider_speculative.control.readmodel import find_stage_key, run_plans
from airflow_provider_speculative.core.states import Attempt
from airflow_provider_speculative.exceptions import NotFoundError, StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.files import open_in_store
from airflow_provider_speculative.store.layout import StageLayout

# What the UI and CLI show by default: the end of a driver log is where the error is.
DEFAULT_TAIL_BYTES = 64 * 1024
MAX_TAIL_BYTES = 4 * 1024 * 1024
# The task log gets a few lines of the first failed attempt, each cut so one minified line cannot flood it.
FAILURE_TAIL_LINES = 20
FAILURE_LINE_CHARS = 400


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

    @property
    def truncated(self) -> bool:
        """Whether the log has bytes before the tail shown."""
        return self.start > 0

    def to_json(self) -> dict[str, Any]:
        """The JSON the UI and ``--output json`` get."""
        return {"dag_id": self.dag_id, "run_id": self.run_id, "stage": self.stage, "subtask": self.subtask,
                "attempt": self.attempt, "path": str(self.path), "exists": self.exists, "size": self.size,
                "start": self.start, "truncated": self.truncated, "text": self.text}


def read_tail(root: Path, path: Path, max_bytes: int) -> tuple[int, int, str]:
    """(size, start offset, text) of the last ``max_bytes`` of the store file ``path``; a cut first line is dropped."""
    with open_in_store(root, path) as log:
        size = os.fstat(log.fileno()).st_size
        start = max(0, size - max_bytes)
        log.seek(start)
        data = log.read(max_bytes)
    if start > 0:
        # Start at a line boundary: half a line (or half a UTF-8 character) helps nobody.
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            start += newline + 1
            data = data[newline + 1:]
    return size, start, data.decode("utf-8", errors="replace")


def attempt_log(root: Path, dag_id: str, run_id: str, stage: str, subtask: int, attempt: int | None = None,
                max_bytes: int = DEFAULT_TAIL_BYTES) -> AttemptLog:
    """The tail of an attempt's log (default: the subtask's latest attempt); NotFoundError names what is missing."""
    if not 0 < max_bytes <= MAX_TAIL_BYTES:
        raise ValueError(f"max_bytes must be between 1 and {MAX_TAIL_BYTES}, got {max_bytes}")
    layout = StageLayout(root, dag_id, run_id, stage)
    if not layout.exists(layout.plan):
        # A stage of a pipeline compiled as a TaskGroup is keyed by its task id; its bare name, if no other
        # grouped pipeline of the DAG has it, names it too.
        stage = find_stage_key(run_plans(root, dag_id, run_id), stage, f"DAG {dag_id!r} run {run_id!r}")
        layout = StageLayout(root, dag_id, run_id, stage)
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
    try:
        size, start, text = read_tail(root, path, max_bytes)
        exists = True
    except FileNotFoundError:  # claimed, not started yet (or removed by gc with the attempt's output)
        size, start, text, exists = 0, 0, "", False
    except UnsafeStorePathError as exc:
        raise NotFoundError(f"DAG {dag_id!r} run {run_id!r} stage {stage!r} subtask {subtask} attempt {attempt}: "
                            f"its log is not served ({exc})") from None
    return AttemptLog(dag_id, run_id, stage, subtask, attempt, path, size, start, text, exists)


def open_attempt_log(root: Path, log: AttemptLog) -> BinaryIO:
    """The whole log of ``log``'s attempt, opened under the store's rules (see :func:`open_in_store`)."""
    try:
        return open_in_store(root, log.path)
    except (FileNotFoundError, UnsafeStorePathError) as exc:
        reason = "it has written no log yet" if isinstance(exc, FileNotFoundError) else f"its log is not served ({exc})"
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
            _, _, text = read_tail(Path(layout.root), layout.log(subtask, attempt), 16 * 1024)
        else:
            # A store without paths holds the log once the attempt ended (its supervisor uploads it by name).
            data = layout.store.read(layout.name(layout.log(subtask, attempt))) or b""
            text = data[-16 * 1024:].decode("utf-8", errors="replace")
    except (OSError, StoreError):
        return lines
    tail = [line if len(line) <= FAILURE_LINE_CHARS else line[:FAILURE_LINE_CHARS] + " [...]"
            for line in text.splitlines()[-FAILURE_TAIL_LINES:]]
    if tail:
        lines.append(f"last {len(tail)} lines of subtask {subtask} attempt {attempt}'s log:")
        lines += [f"  | {line}" for line in tail]
    return lines


def attempt_ended(root: Path, log: AttemptLog) -> bool:
    """Whether the attempt's launcher recorded its end (its log will not grow any more)."""
    layout = StageLayout(root, log.dag_id, log.run_id, log.stage)
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
    if len(data) == max_bytes and b"\n" in data:
        data = data[:data.rindex(b"\n") + 1]  # a line cut at the buffer's end is printed whole next time
    return offset + len(data), data.decode("utf-8", errors="replace")


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
