"""Refuse every file-system call on a store's paths, and only on them (local sources, the application, pytest go on).

``refuse_store_paths(monkeypatch, "s3://lake/speculative")`` wraps the ``os`` calls ``pathlib`` and ``open`` reach and
``builtins.open``: a call whose path argument names the store (its URL, a ``StorePath``'s NUL anchor, or the root's
key prefix made into a relative local path by ``Path(str(path))``) fails the test with the call and the argument.
Every call that refused is also kept in the returned list, so a test can assert none was swallowed on the way.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from typing import Any

import pytest

_CALLS = ("stat", "lstat", "open", "scandir", "listdir", "mkdir", "makedirs", "replace", "rename", "link", "unlink",
          "rmdir", "walk", "access", "chmod", "utime", "readlink", "symlink")


def _text(arg: Any) -> str | None:
    if isinstance(arg, bytes):
        return arg.decode(errors="replace")
    if isinstance(arg, str):
        return arg
    if isinstance(arg, os.PathLike):
        return str(arg)  # a StorePath's str is its URL; its __fspath__ would refuse before the wrapper could look
    return None


def refuse_store_paths(monkeypatch: pytest.MonkeyPatch, *markers: str) -> list[str]:
    """Make a file-system call on a path containing any of ``markers`` (or a NUL byte) fail; the refusals made."""
    refused: list[str] = []
    needles = (*markers, "\0", *(m.split("://", 1)[1] for m in markers if "://" in m))

    def guard(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            for arg in (*args[:2], kwargs.get("path"), kwargs.get("src"), kwargs.get("dst")):
                text = _text(arg)
                if text is not None and any(n in text for n in needles):
                    refused.append(f"{name}({text!r})")
                    raise AssertionError(f"{name}({text!r}): a file-system call on a path of a store without paths")
            return call(*args, **kwargs)
        return wrapped

    for name in _CALLS:
        monkeypatch.setattr(os, name, guard(f"os.{name}", getattr(os, name)))
    monkeypatch.setattr(builtins, "open", guard("open", builtins.open))
    return refused
