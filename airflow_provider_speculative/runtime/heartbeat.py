"""A daemon thread that keeps ``heartbeat.json`` fresh with node and progress."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.states import HeartbeatPhase
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend


def current_node() -> str:
    """The node this attempt runs on: the target's node label if the launcher set one, else the host."""
    return os.environ.get("SPECULATIVE_NODE") or socket.gethostname()


class Heartbeat:
    """Writes progress every ``interval`` seconds until stopped; the last write says why it stopped.

    The document is ``path``, or with ``store`` the object named ``path`` in it; every beat is an atomic replace.
    """

    def __init__(self, path: str | Path, progress: Callable[[], dict[str, Any]], interval: float = 2.0, *,
                 store: StoreBackend | None = None) -> None:
        if store is None:
            store, path = PosixBackend(Path(path).parent), Path(path).name
        self.store, self.name = store, str(path)
        self.progress = progress
        self.interval = interval
        self.started_at = time.time()
        self.phase: str = HeartbeatPhase.RUNNING
        # Time spent in WAITING_FOR_INPUT (hybrid inputs): finished waits, and the start of the current one.
        self.input_wait = 0.0
        self.waiting_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="speculative-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        """Write the first beat synchronously (so RUNNING is visible at once), then keep beating."""
        self.beat(self.phase)
        self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        """Change the phase every later beat reports (accounting for time waiting for input), and beat now."""
        now = time.time()
        if phase == HeartbeatPhase.WAITING_FOR_INPUT and self.waiting_since is None:
            self.waiting_since = now
        elif phase != HeartbeatPhase.WAITING_FOR_INPUT and self.waiting_since is not None:
            self.input_wait += max(0.0, now - self.waiting_since)
            self.waiting_since = None
        self.phase = phase
        self.beat(phase)

    def beat(self, phase: str) -> None:
        """Write one heartbeat."""
        try:
            extra = self.progress()
        except Exception as exc:  # progress is best effort; the beat itself must not fail
            extra = {"progress_error": str(exc)}
        try:
            self.store.replace_json(self.name, {
                "node": current_node(), "pid": os.getpid(), "phase": phase, "started_at": self.started_at,
                "at": time.time(), "input_wait": round(self.input_wait, 3), "waiting_since": self.waiting_since,
                **extra})
        except StoreError as exc:
            # A full store must fail the attempt through its write, not kill the heartbeat thread.
            print(f"[speculative] heartbeat not written: {exc}", file=sys.stderr)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat(self.phase)

    def stop(self, phase: str) -> None:
        """Stop beating and record the final phase."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 1)
        self.beat(phase)
