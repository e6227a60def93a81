"""The driver logs of a stage run's attempts, streamed into the Airflow task log while the stage runs.

A trigger's log records go to its task instance's log in Airflow 3, so what the controller trigger logs
stays where operators look, remote task logging included. A driver log is untrusted and may be
chatty, so every check reads at most ``max_bytes`` and shows at most ``max_lines`` lines per attempt:
the latest ones, after a ``... K lines skipped`` marker. Each line is cut to :data:`LINE_CHARS`, has its
control characters escaped and names its subtask, attempt and target. When an attempt ends, its last
lines not shown yet follow. The whole log stays in the store (``airflow speculative logs``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_provider_speculative.core.states import TERMINAL, Attempt
from airflow_provider_speculative.exceptions import StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.files import open_in_store
from airflow_provider_speculative.store.layout import StageLayout

# One minified or binary line cannot take more than this of the task log.
LINE_CHARS = 1000
# C0 and C1 control characters but tab (ESC starts terminal sequences; CR rewrites a line), and the
# Unicode line and paragraph separators that some log viewers split on.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


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
            shown, gone = self._read(key, follow, ended)
            lines += [prefix + line for line in shown]
            if ended or gone:
                self._done.add(key)
                del self._following[key]
        return lines

    def _read(self, key: tuple[int, int], follow: _Follow, ended: bool) -> tuple[list[str], bool]:
        """The lines to show of one attempt's log, and whether it can never be read (a refused path)."""
        notes: list[str] = []
        if not isinstance(self.layout.store, PosixBackend):
            return self._read_uploaded(key, follow, ended)
        try:
            with open_in_store(self.layout.root, self.layout.log(*key)) as log:
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
        except FileNotFoundError:  # not started yet, or removed between listing and reading
            return notes, False
        except UnsafeStorePathError as exc:
            return [f"its log is not shown ({exc})"], True
        return self._lines(notes, follow, start, data, ended), False

    def _read_uploaded(self, key: tuple[int, int], follow: _Follow, ended: bool) -> tuple[list[str], bool]:
        """On a store without paths: the log is uploaded by name when the attempt ends, so it is read then, whole.

        While the attempt runs its log is a local file of the host that supervises it (backends/supervised.py).
        """
        if not ended:
            return [], False
        name = self.layout.name(self.layout.log(*key))
        try:
            # Its size, then at most max_bytes of its end: a log of gigabytes is never read whole.
            info = self.layout.store.stat(name)
            start = max(follow.offset, info.size - self.max_bytes) if info is not None else 0
            data = None if info is None else self.layout.store.read_range(name, start, max(0, info.size - start))
        except StoreError as exc:
            return [f"its log is not shown ({exc})"], True
        if data is None:
            return [], True  # ended without an uploaded log (the upload failed): nothing to follow
        return self._lines([], follow, start, data, ended), False

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
