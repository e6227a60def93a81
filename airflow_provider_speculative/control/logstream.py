"""The driver logs of a stage run's attempts, streamed into the Airflow task log while the stage runs.

A trigger's log records go to its task instance's log in Airflow 3, so what the controller trigger logs
stays where operators look, remote task logging included. A driver log is untrusted and may be
chatty, so every check reads at most ``max_bytes`` and shows at most ``max_lines`` lines per attempt:
the latest ones, after a ``... K lines skipped`` marker. Each line is cut to :data:`LINE_CHARS`, has its
control characters escaped and names its subtask, attempt and target. When an attempt ends, its last
lines not shown yet follow. The whole log stays in the store (``airflow speculative logs``).

On a store without paths (S3) a running attempt's log is a local file of its supervisor's host, uploaded by
name when the attempt ends: the controller follows that file when it runs on the same host, and otherwise shows
the attempt's lines once it ended (see :meth:`DriverLogStream._read_by_name`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_speculative.control.locallog import local_log, runs_here
from airflow_provider_speculative.core.states import TERMINAL, Attempt, AttemptState
from airflow_provider_speculative.exceptions import StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.files import open_in_store
from airflow_provider_speculative.store.layout import StageLayout, local_root

# One minified or binary line cannot take more than this of the task log.
LINE_CHARS = 1000
# C0 and C1 control characters but tab (ESC starts terminal sequences; CR rewrites a line), and the
# Unicode line and paragraph separators that some log viewers split on.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# Claimed but not launched: no status record to read yet.
_NOT_LAUNCHED = frozenset({AttemptState.CREATED, AttemptState.SCHEDULED})


def escape_line(text: str) -> str:
    """``text`` with control characters shown as ``\\xNN`` (``\\uNNNN`` above 0xff): one inert line."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) <= 0xFF
                        else f"\\u{ord(m.group()):04x}", text)


def _show(raw: bytes) -> str:
    text = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
    if len(text) > LINE_CHARS:
        text = text[:LINE_CHARS] + " [...]"
    return escape_line(text)


@dataclass
class _Follow:
    """Where one attempt's log was read up to, and which file that was (a rotated log is another)."""

    offset: int = 0
    identity: tuple[int, int] | None = None
    # On a store without paths: whether the attempt's status was read, and the local log of its supervisor to
    # follow while it runs if that is this host (None: elsewhere, or its local file was refused).
    placed: bool = False
    local: Path | None = None


class DriverLogStream:
    """New lines of each attempt's driver log for the task log, bounded per attempt and check."""

    def __init__(self, layout: StageLayout, *, max_lines: int, max_bytes: int, since: float,
                 period: float = 0.0) -> None:
        self.layout = layout
        self.max_lines = max_lines
        self.max_bytes = max(1, max_bytes)
        # Attempts that ended before this stream started are not shown: a restarted trigger would repeat
        # the end of every finished attempt of the stage.
        self.since = since
        # A controller woken early by change notices steps more often than its check interval: its logs
        # are read at most once a period.
        self.period = period
        self._following: dict[tuple[int, int], _Follow] = {}
        self._done: set[tuple[int, int]] = set()
        self._read_at = float("-inf")

    def due(self, now: float, final: bool = False) -> bool:
        """Whether a step at ``now`` reads anything (``final``: the stage is decided, whatever the period says)."""
        return self.max_lines > 0 and (final or now - self._read_at >= self.period)

    def step(self, attempts: Iterable[Attempt], now: float, *, final: bool = False) -> list[str]:
        """Lines for the task log: what the live attempts wrote since the last step, the end of those that ended.

        ``final``: the stage is decided; read whatever the period says, so the last lines are not lost.
        """
        if not self.due(now, final):
            return []
        self._read_at = now
        lines: list[str] = []
        done = self._done
        for attempt in sorted((a for a in attempts if (a.subtask, a.number) not in done),
                              key=lambda a: (a.subtask, a.number)):
            key = (attempt.subtask, attempt.number)
            ended = attempt.state in TERMINAL
            follow = self._following.get(key)
            if follow is None:
                if ended and (attempt.end_at is None or attempt.end_at < self.since):
                    self._done.add(key)
                    continue
                follow = self._following[key] = _Follow()
            prefix = (f"subtask {attempt.subtask} attempt {attempt.number} "
                      f"(target {escape_line(attempt.target)}): ")
            shown, gone = self._read(key, follow, ended, attempt.state)
            lines += [prefix + line for line in shown]
            if ended or gone:
                self._done.add(key)
                del self._following[key]
        return lines

    def _read(self, key: tuple[int, int], follow: _Follow, ended: bool, state: AttemptState) -> tuple[list[str], bool]:
        """The lines to show of one attempt's log, and whether it can never be read (a refused path)."""
        if not isinstance(self.layout.store, PosixBackend):
            return self._read_by_name(key, follow, ended, state)
        try:
            return self._follow_file(self.layout.root, self.layout.log(*key), follow, ended), False
        except FileNotFoundError:  # not started yet, or removed between listing and reading
            return [], False
        except UnsafeStorePathError as exc:
            return [f"its log is not shown ({exc})"], True

    def _follow_file(self, root: Path, path: Path, follow: _Follow, ended: bool) -> list[str]:
        """The lines ``path`` gained past ``follow``, opened under ``root`` by the store's rules (no link, no FIFO).

        A replaced or truncated file is followed again from its start, with a note saying so.
        """
        notes: list[str] = []
        with open_in_store(root, path) as log:
            info = os.fstat(log.fileno())
            identity = (info.st_dev, info.st_ino)
            if follow.identity is not None and identity != follow.identity:
                notes.append("... log file replaced: following the new one from its start")
                follow.offset = 0
            elif info.st_size < follow.offset:
                notes.append(f"... log truncated to {info.st_size} bytes: following it from its start")
                follow.offset = 0
            follow.identity = identity
            start = max(follow.offset, info.st_size - self.max_bytes)
            log.seek(start)
            data = log.read(info.st_size - start)
        return self._lines(notes, follow, start, data, ended)

    def _read_by_name(self, key: tuple[int, int], follow: _Follow, ended: bool,
                      state: AttemptState) -> tuple[list[str], bool]:
        """On a store without paths: a running attempt's local log on this host, then the uploaded one by name.

        While the attempt runs its log is a local file of the host that supervises it (backends/supervised.py),
        uploaded to the store when it ends. On that host the file is followed as a POSIX store's log is, opened
        under the same rules below ``$AIRFLOW_HOME/speculative-local`` (the attempt's code can write there too); an
        attempt supervised elsewhere shows nothing until it ends. A local file refused (a link, a FIFO) is named
        once and never opened again; the uploaded log is still shown at the end, because the supervisor uploads
        through the same rules (a link is never copied) and the store's copy is what the CLI and UI serve anyway.
        """
        if ended:
            return self._read_uploaded(key, follow)
        local = self._local_file(key, follow, state)
        if local is None:
            return [], False
        try:
            return self._follow_file(local_root(), local, follow, ended), False
        except UnsafeStorePathError as exc:
            follow.local = None
            return [f"its log is not shown while it runs ({exc})"], False
        except OSError:  # not created yet, or not readable now: tried again at the next check
            return [], False

    def _local_file(self, key: tuple[int, int], follow: _Follow, state: AttemptState) -> Path | None:
        """The supervisor's local log of a running attempt if it is on this host; its status is read once."""
        if follow.placed or state in _NOT_LAUNCHED:
            return follow.local
        try:
            status = self.layout.read_json(self.layout.status(*key))
        except StoreError:
            return None  # unreadable now: read again at the next check, as a status not written yet
        if not isinstance(status, dict):
            return None
        # Its supervisor's host never changes: one status read per attempt, not one per check.
        follow.placed = True
        follow.local = local_log(self.layout, *key) if runs_here(status) else None
        return follow.local

    def _read_uploaded(self, key: tuple[int, int], follow: _Follow) -> tuple[list[str], bool]:
        """An ended attempt's uploaded log by name, from where its local file was followed to (the same bytes).

        Without an upload (it failed, or the supervisor died first) a local file followed on this host is read
        to its end instead.
        """
        notes: list[str] = []
        name = self.layout.name(self.layout.log(*key))
        try:
            # Its size, then at most max_bytes of its end: a log of gigabytes is never read whole.
            info = self.layout.store.stat(name)
            data = None
            if info is not None:
                if info.size < follow.offset:
                    notes.append(f"... uploaded log is {info.size} bytes, fewer than the {follow.offset} read from "
                                 "its local file: showing its end")
                    follow.offset = 0
                start = max(follow.offset, info.size - self.max_bytes)
                data = self.layout.store.read_range(name, start, max(0, info.size - start))
        except StoreError as exc:
            return [f"its log is not shown ({exc})"], True
        if data is not None:
            return self._lines(notes, follow, start, data, True), False
        if follow.local is not None:
            try:
                return self._follow_file(local_root(), follow.local, follow, True), True
            except (OSError, UnsafeStorePathError):
                pass  # gone from this host as well
        return [], True  # ended without an uploaded log (the upload failed): nothing to follow

    def _lines(self, notes: list[str], follow: _Follow, start: int, data: bytes, ended: bool) -> list[str]:
        """The lines to show of ``data``, read from offset ``start`` of the log; advances ``follow``."""
        unread = start - follow.offset
        if unread and b"\n" in data[:-1]:
            # The first line read is the end of a line not read: half a line helps nobody.
            cut = data.index(b"\n") + 1
            unread, start, data = unread + cut, start + cut, data[cut:]
        if ended or (len(data) >= self.max_bytes and b"\n" not in data):
            # The log does not grow any more, or one line fills the whole read: show what there is.
            body = data
        else:
            # A line without its newline yet is shown whole at a later step.
            body = data[:data.rfind(b"\n") + 1]
        follow.offset = start + len(body)
        raw = body.split(b"\n")
        if raw and raw[-1] == b"":
            raw.pop()
        skipped = max(0, len(raw) - self.max_lines)
        if skipped or unread:
            counts = [f"{skipped} line{'s' if skipped != 1 else ''}"] if skipped else []
            counts += [f"{unread} bytes" if not skipped else f"{unread} more bytes"] if unread else []
            notes.append(f"... {' and '.join(counts)} skipped")
        return notes + [_show(line) for line in raw[skipped:]]
