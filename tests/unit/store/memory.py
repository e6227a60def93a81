"""An in-memory StoreBackend for unit tests: no file, no directory, no inode, nothing that can be renamed.

What a store on S3 offers and nothing more: objects by name with a size, a modification time and an ETag,
exclusive create, listings, one ordered list of records per journal, and owned deletes. Code that runs on
it never reached for a POSIX call on a path.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import replace
from typing import Any

from airflow_provider_speculative.store.backend import ObjectInfo, StoreBackend


class MemoryBackend(StoreBackend):
    """A store double in memory: exclusive create, replace, listings, journals and deletes; counts reads."""

    def __init__(self, url: str = "memory://", *, content_token: str | None = None) -> None:
        # ``url``: the root it stands for, e.g. ``s3://bucket/prefix`` to serve an S3 root through store/roots.py.
        # ``content_token="etag"``: manifests carry ETags, as on S3; None: SHA-256, as on POSIX.
        self._url = url
        self.content_token = content_token
        self._written: dict[str, bytes] = {}
        self.objects: dict[str, bytes] = {}
        self.infos: dict[str, ObjectInfo] = {}
        self.journals: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        self.reads = 0
        self.ranged_reads = 0
        self.listings = 0
        self.stats = 0
        self.marker_reads = 0
        self._writes = 0
        # Every request as (kind, name): what a store on S3 would be asked, for tests that bound the cost.
        self.ops: Counter[tuple[str, str]] = Counter()

    @property
    def url(self) -> str:
        """A name for errors, and the root's URL in the process's cache of opened stores."""
        return self._url

    @property
    def writes(self) -> int:
        """Objects created or replaced so far (each one request on S3)."""
        return self._writes

    def _put(self, name: str, data: bytes) -> None:
        # Caller holds the lock. A logical clock: every write has a newer mtime and its own ETag, as on S3.
        self._writes += 1
        self.objects[name] = data
        # With a content token the ETag is S3's for a single-part object (MD5 of the bytes), which a download
        # can check; otherwise each write has its own.
        salt = b"" if self.content_token else str(self._writes).encode()
        etag = hashlib.md5(data + salt, usedforsecurity=False).hexdigest()
        self.infos[name] = ObjectInfo(name, len(data), float(self._writes), etag=f'"{etag}"')
        self._written[name] = data

    def _create_exclusive(self, name: str, data: bytes) -> bool:
        self.ops[("create_exclusive", name)] += 1
        with self.lock:
            if name in self.objects:
                return False
            self._put(name, data)
            return True

    def _replace(self, name: str, data: bytes) -> None:
        self.ops[("replace", name)] += 1
        with self.lock:
            self._put(name, data)

    def _read(self, name: str) -> bytes | None:
        self.ops[("read", name)] += 1
        self.reads += 1
        return self.objects.get(name)

    def _stat(self, name: str) -> ObjectInfo | None:
        self.ops[("stat", name)] += 1
        self.stats += 1
        return self._info(name)

    def _info(self, name: str) -> ObjectInfo | None:
        # A test may change ``objects`` directly (a corrupted file): its size is then what the bytes say.
        data = self.objects.get(name)
        if data is None:
            return None
        info = self.infos.get(name)
        if info is not None and data is self._written.get(name):
            return info
        # Changed behind the store's back: a new ETag, as any replacement of an object's bytes on S3 has.
        etag = f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
        if info is not None and info.size == len(data):
            return replace(info, etag=etag)
        return ObjectInfo(name, len(data), 0.0, etag=etag)

    def _list(self, prefix: str) -> list[str]:
        self.ops[("list", prefix)] += 1
        self.listings += 1
        start = prefix + "/" if prefix else ""
        return sorted(n for n in self.objects if n.startswith(start))

    def _children(self, prefix: str) -> list[str]:
        out = set()
        start = prefix + "/" if prefix else ""
        for name in self._list(prefix):
            head, sep, _ = name[len(start):].partition("/")
            out.add(head + ("/" if sep else ""))
        return sorted(out)

    def _stat_all(self, prefix: str) -> list[ObjectInfo]:
        # One listing, as S3's carries sizes and ETags.
        return [info for name in self._list(prefix) if (info := self._info(name)) is not None]

    def _append(self, journal: str, record: dict[str, Any]) -> None:
        self.ops[("append", journal)] += 1
        with self.lock:
            self.journals.setdefault(journal, []).append(json.loads(json.dumps(record, default=str)))

    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        self.ops[("read_journal", journal)] += 1
        return list(self.journals.get(journal, []))

    def _read_marker(self, prefix: str) -> Any:
        self.ops[("read_marker", prefix)] += 1
        self.marker_reads += 1
        data = self.objects.get(f"{prefix}/_owner.json" if prefix else "_owner.json")
        return None if data is None else json.loads(data)

    def _delete(self, name: str) -> bool:
        self.ops[("delete", name)] += 1
        with self.lock:
            self.infos.pop(name, None)
            self._written.pop(name, None)
            return self.objects.pop(name, None) is not None

    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        return sum(self._delete(name) for name in names)

    def _read_range(self, name: str, offset: int, length: int) -> bytes | None:
        self.ops[("read_range", name)] += 1
        # Counted as a read, as S3 counts a ranged GetObject; only the range is handed back.
        self.reads += 1
        self.ranged_reads += 1
        data = self.objects.get(name)
        return None if data is None else data[offset:offset + length]

    content_token: str | None = None
    """``"etag"`` (set by the constructor): manifests on this double carry ETags, as on S3."""
