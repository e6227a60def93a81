"""The UI plugin's app served by uvicorn on a real loopback socket, access checks off (for browser and load tests)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def served_plugin(store: Path, backlog: int = 16) -> Iterator[str]:
    """Serve ``create_app(store=store)`` with every access dependency overridden; yields its base URL."""
    import uvicorn

    from airflow_provider_speculative.plugin.app import create_app

    app = create_app(store=store)
    for dependency in app.state.access.values():
        app.dependency_overrides[dependency] = lambda: None
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)  # connections queue in the backlog until uvicorn accepts: no readiness wait needed
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
