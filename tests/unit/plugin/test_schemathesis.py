"""schemathesis against the plugin's own OpenAPI schema: every endpoint, with and without credentials.

No 5xx, responses that conform to the schema (status codes, content types, JSON bodies), and no data
without permission (every data route answers 401, or 403 for an invalid token, to an anonymous caller).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from tests.unit.plugin.test_plugin_api import store as store

pytestmark = pytest.mark.filterwarnings("ignore")


def _schema(store: Path, authorized: bool) -> Any:
    from airflow_provider_speculative.plugin.app import create_app

    app = create_app(store=store)
    # A caller's token is checked by Airflow's auth manager, as in the api-server (SimpleAuthManager here).
    from airflow.api_fastapi.app import init_auth_manager

    init_auth_manager()
    if authorized:
        for dependency in app.state.access.values():
            app.dependency_overrides[dependency] = lambda: None
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def _run(schema: Any, examples: int, check: Any) -> int:
    """Draw ``examples`` cases of every operation of ``schema``, call each and ``check`` the response."""
    operations = _operations(schema)
    assert {op.path for op in operations} >= {"/api/run", "/api/stage", "/ui/run", "/ui/stage", "/ui/spark"}
    calls = 0
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def call(case: Any) -> None:
            nonlocal calls
            calls += 1
            check(case, case.call(allow_redirects=False))

        call()
    return calls


def test_authorized_calls_conform_and_never_fail(store: Path) -> None:
    def check(case: Any, response: Any) -> None:
        case.validate_response(response, checks=(not_a_server_error, content_type_conformance,
                                                 response_schema_conformance))

    assert _run(_schema(store, authorized=True), 30, check) >= 5


def test_anonymous_calls_get_no_data(store: Path) -> None:
    def check(case: Any, response: Any) -> None:
        case.validate_response(response, checks=(not_a_server_error,))
        assert response.status_code in (401, 403), (case.path, response.status_code)
        assert "local-a" not in response.text

    assert _run(_schema(store, authorized=False), 10, check) >= 5
