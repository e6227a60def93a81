"""URLs the provider renders as links: absolute ``http(s)://host...`` only (pure, no I/O).

A link's scheme is not neutralised by HTML escaping (``javascript:``, ``data:``), so every URL that can
end up in an ``href`` or a redirect is checked here: when the option is parsed, and again where it is
rendered, because a plan already in the store may predate the check or have been written by hand.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

ALLOWED_SCHEMES = ("http", "https")
# Quotes, angle brackets and backticks have no place in a URL and are what breaks out of an attribute.
_FORBIDDEN = frozenset('"<>`\\{}|^')


def http_url_problem(value: Any) -> str | None:
    """Why ``value`` is not an absolute http(s) URL with a host; None if it is one."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if not value:
        return "it is empty"
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in value):
        return "it contains whitespace or control characters"
    if any(c in _FORBIDDEN for c in value):
        return "it contains characters not allowed in a URL (quotes, <, >, `, \\, {, }, |, ^)"
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        return f"it is not a valid URL ({exc})"
    if parts.scheme.lower() not in ALLOWED_SCHEMES:
        return f"scheme {parts.scheme + ':' if parts.scheme else '(none)'} is not http: or https:"
    if not host:
        return "it has no host"
    return None


def safe_http_url(value: Any) -> str | None:
    """``value`` if it is an absolute http(s) URL with a host, else None (the caller shows no link)."""
    return value if http_url_problem(value) is None else None
