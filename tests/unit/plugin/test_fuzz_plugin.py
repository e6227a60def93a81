"""Fuzzing the plugin's HTTP API (the property a schemathesis run checks): for every endpoint and any query,
authenticated or not, no 5xx; without credentials no data; with them JSON or a page, or a clear 4xx; and
the security headers on every response. Hostile ids never read outside the store."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.plugin.test_plugin_api import DAG, RUN, _app
from tests.unit.plugin.test_plugin_api import store as store

ENDPOINTS = ["/api/run", "/api/stage", "/ui/run", "/ui/stage", "/ui/spark", "/api/nope", "/static/../app.py"]
VALUES = st.one_of(st.sampled_from([DAG, RUN, "scan", "aggregate", "..", "../..", "/etc/passwd", "", "%00",
                                    "a" * 2000, "<script>", "scan/../../x", "\u202e", "0", "-1"]),
                   st.text(max_size=10))
PARAMS = st.dictionaries(st.sampled_from(["dag_id", "run_id", "task_id", "subtask", "attempt", "x"]), VALUES,
                         max_size=5)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(endpoint=st.sampled_from(ENDPOINTS), params=PARAMS, authorized=st.booleans())
def test_no_server_error_and_no_data_without_permission(store: Path, endpoint: str,
                                                         params: dict[str, str], authorized: bool) -> None:
    client = _app(store, authorized=authorized)
    response = client.get(endpoint, params=params, follow_redirects=False)
    assert response.status_code < 500, (endpoint, params, response.status_code, response.text[:300])
    assert response.headers.get("X-Content-Type-Options") == "nosniff"
    assert "script-src 'self'" in response.headers.get("Content-Security-Policy", "")
    if not authorized and endpoint != "/api/nope" and not endpoint.startswith("/static"):
        assert response.status_code in (401, 403, 307, 302, 404, 422), (endpoint, response.status_code)
        assert "local-a" not in response.text and "speculative copy" not in response.text
    if response.status_code == 200 and endpoint.startswith("/api/"):
        assert isinstance(response.json(), dict)
    assert "root:" not in response.text  # /etc/passwd never read


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_endpoint_answers_a_bare_request_without_5xx(store: Path, endpoint: str) -> None:
    for authorized in (False, True):
        assert _app(store, authorized=authorized).get(endpoint, follow_redirects=False).status_code < 500
