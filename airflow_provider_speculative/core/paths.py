"""Checks of local paths authors give, from their text alone (pure, no I/O)."""

from __future__ import annotations

import posixpath
import re

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
    if url_scheme(path) is not None:
        return source_url_problem(path)
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


# -- object storage URLs ---------------------------------------------------------------------------

# s3a is Hadoop's name for the same store; Spark is configured to serve both (hooks/objectstore.py).
OBJECT_SCHEMES = ("s3", "s3a")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def url_scheme(path: str) -> str | None:
    """The scheme of ``scheme://...`` in lower case; None for a plain path."""
    head, sep, _ = path.partition("://")
    if not sep or not head or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head):
        return None
    return head.lower()


def is_object_url(path: str) -> bool:
    """True for an ``s3://`` or ``s3a://`` URL."""
    return url_scheme(path) in OBJECT_SCHEMES


def split_object_url(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://bucket/key`` URL (the key without its leading ``/``)."""
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced, for messages about a URL that is refused."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return f"{scheme}{sep}{authority}{slash}{tail}"


def object_url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable ``s3://bucket/prefix`` source; None if it is (never echoes credentials)."""
    shown = redact_url(url)
    bucket, key = split_object_url(url)
    if "@" in bucket or ":" in bucket:
        return (f"source URL {shown!r} carries credentials or a port in its authority; give the bucket only and the "
                "credentials through [speculative] s3_conn_id or the AWS environment")
    if "?" in url or "#" in url:
        return f"source URL {shown!r} has a query or fragment; give s3://bucket/prefix"
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        return (f"source URL {shown!r}: {bucket!r} is not an S3 bucket name (3-63 lower-case letters, digits, '.' "
                "and '-')")
    if "\0" in key:
        return f"source URL {shown!r} contains a NUL byte"
    if any(part in (".", "..") for part in key.split("/")):
        return f"source URL {shown!r} has '.' or '..' segments, which S3 keeps as literal key names"
    return None


def source_url_problem(path: str) -> str | None:
    """For a path with a scheme: why it is not a supported source URL (None for plain paths and good URLs)."""
    scheme = url_scheme(path)
    if scheme is None:
        return None
    if scheme in OBJECT_SCHEMES:
        return object_url_problem(path)
    return (f"source scheme {scheme + '://'!r} is not supported (supported: an absolute local path and s3:// or "
            "s3a:// URLs; see docs/store.md)")


def glob_match(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern`` as Python's ``glob(recursive=True)`` would on a local disk.

    ``*``, ``?`` and ``[...]`` match within one ``/``-separated segment and ``**`` matches any number of
    segments, so an object-store source selects the same files as the same glob on a file system.
    """
    import fnmatch

    parts, names = pattern.split("/"), path.split("/")

    def match(i: int, j: int) -> bool:
        if i == len(parts):
            return j == len(names)
        if parts[i] == "**":
            return any(match(i + 1, k) for k in range(j, len(names) + 1))
        return j < len(names) and fnmatch.fnmatchcase(names[j], parts[i]) and match(i + 1, j + 1)

    return match(0, 0)
