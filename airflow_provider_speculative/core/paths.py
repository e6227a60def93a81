"""Checks of local paths authors give, from their text alone (pure, no I/O)."""

from __future__ import annotations

import posixpath

# Kernel and device trees: listing them walks endless or vanishing entries, and nothing there is data.
SYSTEM_ROOTS = ("/proc", "/sys", "/dev", "/run")
_WILDCARDS = "*?["


def fixed_part(path: str) -> str:
    """The directory part of ``path`` before its first wildcard, normalised ("/data/*/x" -> "/data")."""
    fixed = []
    for part in path.split("/"):
        if any(c in part for c in _WILDCARDS):
            break
        fixed.append(part)
    return posixpath.normpath("/".join(fixed) or "/")


def source_root_problem(path: str) -> str | None:
    """Why a source path (absolute, maybe a glob) would make planning list the whole filesystem; None if fine."""
    if "\0" in path:
        return f"source path {path!r} contains a NUL byte"
    root = fixed_part(path)
    if root == "/":
        return (f"source path {path!r} is rooted at '/': planning would list the whole filesystem; give the "
                "dataset's own directory")
    for system in SYSTEM_ROOTS:
        if root == system or root.startswith(system + "/"):
            return f"source path {path!r} lies in the system directory {system}, which holds no datasets"
    return None
