"""An in-memory StoreBackend test double: no file, so nothing can be renamed, linked or walked on a disk."""

from __future__ import annotations

import json
import threading
from typing import Any

from airflow_provider_speculative.store.backend import ObjectInfo, StoreBackend


class MemoryBackend(StoreBackend):
    """A store double in memory: exclusive create, listing and deletes, and no file, so nothing can be renamed."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.reads = 0

    @property
    def url(self) -> str:
        """A name for errors."""
        return "memory://"

    def _create_exclusive(self, name: str, data: bytes) -> bool:
        with self.lock:
            if name in self.objects:
                return False
            self.objects[name] = data
            return True

    def _replace(self, name: str, data: bytes) -> None:
        with self.lock:
            self.objects[name] = data

    def _read(self, name: str) -> bytes | None:
        self.reads += 1
        return self.objects.get(name)

    def _stat(self, name: str) -> ObjectInfo | None:
        data = self.objects.get(name)
        return None if data is None else ObjectInfo(name, len(data), 0.0)

    def _list(self, prefix: str) -> list[str]:
        return sorted(n for n in self.objects if n.startswith(prefix + "/"))

    def _children(self, prefix: str) -> list[str]:
        out = set()
        for name in self._list(prefix):
            head, sep, _ = name[len(prefix) + 1:].partition("/")
            out.add(head + ("/" if sep else ""))
        return sorted(out)

    def _append(self, journal: str, record: dict[str, Any]) -> None:
        raise AssertionError("slots never append")

    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        raise AssertionError("slots never read a journal")

    def _read_marker(self, prefix: str) -> Any:
        data = self.objects.get(f"{prefix}/_owner.json")
        return None if data is None else json.loads(data)

    def _delete(self, name: str) -> bool:
        with self.lock:
            return self.objects.pop(name, None) is not None

    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        raise AssertionError("slots delete objects one by one")
