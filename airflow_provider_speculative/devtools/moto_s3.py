"""moto's S3 server with conditional writes made atomic: the S3 endpoint ``devtools/services.py`` starts.

moto checks ``If-None-Match: *`` (and ``If-Match``) and stores the object later in the same request
handler, without a lock, on a threaded server: two racing conditional creates can both succeed, which
real S3 never allows. Every object put and delete runs under one lock here, so a test of the store's
exclusive create exercises S3's guarantee and not moto's race.

    python -m airflow_provider_speculative.devtools.moto_s3 -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()


def _serialized(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return method(self, *args, **kwargs)

    return run


def patch() -> None:
    """Run every object put and delete of moto's S3 under one lock (idempotent)."""
    from moto.s3.responses import S3Response

    for name in ("put_object", "delete_object"):
        method = getattr(S3Response, name)
        if not getattr(method, "_speculative_serialized", False):
            wrapped = _serialized(method)
            wrapped._speculative_serialized = True  # type: ignore[attr-defined]
            setattr(S3Response, name, wrapped)


# Tests set a tiny thread switch interval to make an unlocked check-then-store race likely.
SWITCH_INTERVAL_ENV = "SPECULATIVE_MOTO_SWITCH_INTERVAL"


def main(argv: list[str] | None = None) -> None:
    """Patch moto, then serve it with moto's own command line (``-H``, ``-p``)."""
    interval = os.environ.get(SWITCH_INTERVAL_ENV)
    if interval:
        sys.setswitchinterval(float(interval))
    patch()
    from moto.server import main as serve

    serve(argv)


if __name__ == "__main__":
    main()
