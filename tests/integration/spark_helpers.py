"""Helpers for tests that run real Spark: process checks, UDP StatsD capture, DAG loading."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

from tests.processes import group_processes, processes_mentioning, wait_for

HERE = Path(__file__).resolve().parent
__all__ = ["HERE", "StatsdCapture", "group_processes", "load_dag", "processes_mentioning", "wait_for"]


class StatsdCapture:
    """Collect StatsD datagrams sent to a UDP port in a background thread."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines += data.decode(errors="replace").splitlines()

    def gauges(self, name_suffix: str) -> list[float]:
        """Values of every gauge whose name ends with ``name_suffix``, in arrival order."""
        values = []
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            if name.endswith(name_suffix) and rest.endswith("|g"):
                values.append(float(rest[:-2]))
        return values

    def close(self) -> None:
        """Stop listening."""
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


def load_dag(dag_id: str, folder: Path) -> Any:
    """Parse ``folder`` with Airflow's DagBag and return ``dag_id`` (fail on import errors)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)
