"""The api-server calls go through HttpHook: endpoints, bearer auth, no redirects, timeouts (a local HTTP server)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from airflow_provider_speculative.hooks.asset_events import AssetApiConnection, AssetApiError, AssetEventsApi

URI = "file:///out/q3"


class ApiServer:
    """Answers like the api-server's asset endpoints; records every request it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status: dict[tuple[str, str], int] = {}  # (method, path) -> status to answer instead
        self.delay = 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                server.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                        "headers": dict(self.headers), "body": body})
                time.sleep(server.delay)
                status = server.status.get((method, url.path), 200)
                answer: Any = {"detail": "no"}
                if status == 200:
                    answer = {("POST", "/auth/token"): {"access_token": "jwt-from-login"},
                              ("GET", "/api/v2/assets"): {"assets": [{"id": 6, "uri": URI + "x"},
                                                                     {"id": 7, "uri": URI}]},
                              ("GET", "/api/v2/assets/events"): {"asset_events": [{"id": 41, "extra": {"k": "a"}},
                                                                                  {"id": 42, "extra": {"k": "b"}}]},
                              ("POST", "/api/v2/assets/events"): {"id": 43, **(body or {})}}[(method, url.path)]
                data = json.dumps(answer).encode()
                self.send_response(status)
                if status in (302, 307):
                    self.send_header("Location", f"http://127.0.0.1:{server.port}/elsewhere")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]

    def paths(self) -> list[tuple[str, str]]:
        """(method, path) of each request, in order."""
        return [(r["method"], r["path"]) for r in self.requests]


@pytest.fixture
def server() -> Iterator[ApiServer]:
    api = ApiServer()
    thread = threading.Thread(target=api.httpd.serve_forever, daemon=True)
    thread.start()
    yield api
    api.httpd.shutdown()
    api.httpd.server_close()


def _api(server: ApiServer, **fields: Any) -> AssetEventsApi:
    base = {"conn_id": "speculative_api", "host": f"http://127.0.0.1:{server.port}/", "schema": "", "port": None,
            "login": "publisher", "password": "pw-SECRET", "extra_dejson": {}}
    conn = AssetApiConnection.from_connection(SimpleNamespace(**{**base, **fields}), "pipeline 'p', stage 's'")
    return AssetEventsApi(conn)


def test_login_gets_a_token_then_every_call_is_a_bearer_call_to_its_endpoint(server: ApiServer) -> None:
    api = _api(server)
    assert api.asset_id(URI) == 7
    assert api.find_event(7, "2026-01-01T00:00:00+00:00", lambda extra: extra.get("k") == "b") == \
        {"id": 42, "extra": {"k": "b"}}
    assert api.create_event(7, {"records": 3}, "2026-01-01")["id"] == 43
    assert server.paths() == [("POST", "/auth/token"), ("GET", "/api/v2/assets"), ("GET", "/api/v2/assets/events"),
                              ("POST", "/api/v2/assets/events")]
    login, assets, events, create = server.requests
    assert login["body"] == {"username": "publisher", "password": "pw-SECRET"}
    assert "Authorization" not in login["headers"]
    for request in (assets, events, create):
        assert request["headers"]["Authorization"] == "Bearer jwt-from-login"  # never basic auth with the login
    assert assets["query"] == {"uri_pattern": [URI], "limit": ["100"]}
    assert events["query"]["asset_id"] == ["7"] and events["query"]["order_by"] == ["-timestamp"]
    assert create["body"] == {"asset_id": 7, "extra": {"records": 3}, "partition_key": "2026-01-01"}


def test_a_token_extra_is_the_bearer_and_never_a_header_of_its_own(server: ApiServer) -> None:
    api = _api(server, login="", password="", extra_dejson={"token": "t0k-SECRET", "verify": False})
    assert api.asset_id(URI) == 7
    assert server.paths() == [("GET", "/api/v2/assets")]
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert headers["authorization"] == "Bearer t0k-SECRET" and "token" not in headers
    assert "t0k-SECRET" not in repr(api.connection)


def test_a_refusal_names_the_call_and_never_the_credentials(server: ApiServer) -> None:
    server.status[("POST", "/api/v2/assets/events")] = 503
    api = _api(server)
    with pytest.raises(AssetApiError) as refused:
        api.create_event(7, {}, None)
    message = str(refused.value)
    assert f"POST http://127.0.0.1:{server.port}/api/v2/assets/events answered 503" in message
    assert "pw-SECRET" not in message and "jwt-from-login" not in message


def test_a_redirect_is_not_followed(server: ApiServer) -> None:
    server.status[("GET", "/api/v2/assets")] = 307
    with pytest.raises(AssetApiError, match="answered 307"):
        _api(server, login="", password="", extra_dejson={"token": "t0k"}).asset_id(URI)
    assert server.paths() == [("GET", "/api/v2/assets")]  # the bearer token went nowhere else


def test_a_slow_or_absent_server_is_an_asset_api_error(server: ApiServer) -> None:
    server.delay = 2.0
    with pytest.raises(AssetApiError, match="Timeout"):
        _api(server, login="", password="", extra_dejson={"token": "t0k", "timeout": 0.3}).asset_id(URI)
    server.delay = 0.0
    api = _api(server, login="", password="", extra_dejson={"token": "t0k"})
    server.httpd.shutdown()
    server.httpd.server_close()
    with pytest.raises(AssetApiError, match=f"GET http://127.0.0.1:{server.port}/api/v2/assets: ConnectionError"):
        api.asset_id(URI)
