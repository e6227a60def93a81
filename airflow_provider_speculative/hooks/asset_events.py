"""Record asset events through Airflow's public REST API, from the triggerer (no worker run).

Airflow 3.3 records a task's outlet asset events only when a worker finishes the task: a task ended
from the triggerer (``TaskSuccessEvent``) records none, and a trigger has no supervisor message for it.
So a sink stage that ends in the triggerer either resumes on a worker (a scheduler round trip, an
executor slot, a worker start and a DAG parse) or records its event through ``POST /api/v2/assets/events``
with an ``http`` connection to the api-server (``[speculative] asset_events_conn_id``). This module is the
HTTP part, through Airflow's ``HttpHook``; control/asset_events.py makes it happen once per task try.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from requests import PreparedRequest
from requests.auth import AuthBase

from airflow_provider_speculative.core.config import DEFAULT_ASSET_EVENTS_CONN_ID
from airflow_provider_speculative.core.urls import http_url_problem
from airflow_provider_speculative.exceptions import ConfigError, PlanError

# Seconds per request unless the connection's extra ``timeout`` says otherwise: the trigger waits for the
# answer, and on a timeout falls back to the worker path.
TIMEOUT = 10.0
# Extras of the connection: HttpHook's request options, and ``token`` (a bearer token, never sent as a header).
KNOWN_EXTRAS = ("token", "verify", "verify_ssl", "cert", "timeout", "proxies", "proxy", "trust_env", "srv_lookup")


class _Bearer(AuthBase):
    """``Authorization: Bearer`` with the token ``token()`` gives (the connection's, or one from /auth/token)."""

    def __init__(self, token: Callable[[], str]) -> None:
        self._token = token

    def __call__(self, request: PreparedRequest) -> PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._token()}"
        return request


class _NoAuth(AuthBase):
    """No credentials: the request for a token."""

    def __call__(self, request: PreparedRequest) -> PreparedRequest:
        return request


class AssetApiError(RuntimeError):
    """The api-server refused or did not answer; the caller falls back to recording on a worker."""


@dataclass(frozen=True)
class AssetApiConnection:
    """Where the api-server is and how to authenticate (from an Airflow ``http`` connection)."""

    conn_id: str
    base_url: str
    # What HttpHook reads: the connection without the token extra, which it would send as a header.
    hook_connection: Any = field(compare=False)
    login: str = ""
    password: str = ""
    token: str = ""
    verify: bool | str = True

    def __repr__(self) -> str:
        # Never the password or token: this object reaches logs through exceptions.
        return f"AssetApiConnection(conn_id={self.conn_id!r}, base_url={self.base_url!r}, login={self.login!r})"

    @classmethod
    def from_connection(cls, conn: Any, where: str) -> AssetApiConnection:
        """Build from an Airflow connection: host (a URL, or a host name with schema and port), login, password.

        Extras: ``token`` (a bearer token instead of login and password), and HttpHook's ``verify`` (false, or a
        CA bundle path), ``cert``, ``timeout``, ``proxies``, ``trust_env``, ``srv_lookup``.
        """
        conn_id = str(getattr(conn, "conn_id", "") or "")
        extra = dict(conn.extra_dejson) if hasattr(conn, "extra_dejson") else {}
        unknown = sorted(set(extra) - set(KNOWN_EXTRAS))
        if unknown:
            raise ConfigError(f"{where}: connection {conn_id!r} ([speculative] asset_events_conn_id) has unknown "
                              f"extras {unknown}; known: {', '.join(KNOWN_EXTRAS)}")
        verify = extra.get("verify", extra.get("verify_ssl", True))
        if not isinstance(verify, bool | str):
            raise ConfigError(f"{where}: connection {conn_id!r}: extra 'verify' must be true, false or a CA "
                              "bundle path")
        token = str(extra.pop("token", "") or "")
        login, password = str(getattr(conn, "login", "") or ""), str(getattr(conn, "password", "") or "")
        # The hook authenticates with a bearer token (_Bearer), never with the login as basic auth.
        view = SimpleNamespace(conn_id=conn_id, conn_type="http", host=getattr(conn, "host", None),
                               schema=getattr(conn, "schema", None), port=getattr(conn, "port", None), login=None,
                               password=None, extra=json.dumps(extra) if extra else None, extra_dejson=extra)
        try:
            base_url = str(_hook(view).url_from_endpoint(None)).rstrip("/")
            problem = http_url_problem(base_url)
        except ValueError as exc:
            base_url, problem = "", str(exc)
        if problem:
            raise ConfigError(f"{where}: connection {conn_id!r} ([speculative] asset_events_conn_id) is not the "
                              f"api-server's base URL: {problem}; expected e.g. http://airflow-api:8080")
        if not token and not (login and password):
            raise ConfigError(f"{where}: connection {conn_id!r} ([speculative] asset_events_conn_id) needs login and "
                              "password of a user who may create asset events, or extra 'token'")
        return cls(conn_id=conn_id, base_url=base_url, login=login, password=password, token=token, verify=verify,
                   hook_connection=view)


async def resolve_asset_api(conn_id: str, where: str) -> AssetApiConnection | None:
    """The connection to record asset events through, or None (off: a worker records them).

    Only the default connection may be undefined; a connection named explicitly that does not exist, or
    is not an api-server URL with credentials, raises PlanError naming ``where`` and the connection.
    """
    if not conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException:
        if conn_id == DEFAULT_ASSET_EVENTS_CONN_ID:
            return None
        raise PlanError(f"{where}: [speculative] asset_events_conn_id names connection {conn_id!r}, which is not "
                        "defined; define it or set the option to empty") from None
    try:
        return AssetApiConnection.from_connection(conn, where)
    except ConfigError as exc:
        raise PlanError(str(exc)) from None


class AssetEventsApi:
    """The few public REST API calls needed to record one asset event and to find it again (through HttpHook)."""

    def __init__(self, connection: AssetApiConnection) -> None:
        self.connection = connection
        self._token = connection.token
        self._hook = _hook(connection.hook_connection, auth=_Bearer(self._bearer))
        # No redirects: a redirect could carry the bearer token to another host. Statuses are checked here.
        self._options: dict[str, Any] = {"allow_redirects": False, "check_response": False}
        if "timeout" not in connection.hook_connection.extra_dejson:
            self._options["timeout"] = TIMEOUT

    def close(self) -> None:
        """Nothing to release: HttpHook opens a session per request and closes none that outlive it."""

    def _bearer(self) -> str:
        if not self._token:
            answer = self._call("POST", "auth/token", body={"username": self.connection.login,
                                                            "password": self.connection.password}, auth=False)
            token = answer.get("access_token") if isinstance(answer, dict) else None
            if not isinstance(token, str) or not token:
                raise AssetApiError(f"{self.connection.base_url}/auth/token gave no access_token")
            self._token = token
        return self._token

    def _call(self, method: str, endpoint: str, *, auth: bool = True, params: dict[str, Any] | None = None,
              body: Any = None) -> Any:
        import requests

        if auth:
            self._bearer()  # before this request is built: the token request uses the same hook
        where = f"{method} {self.connection.base_url}/{endpoint}"
        self._hook.method = method
        kwargs: dict[str, Any] = {} if auth else {"auth": _NoAuth()}
        if body is not None:
            kwargs["json"] = body
        try:
            # HttpHook sends GET's data as the query string.
            response = self._hook.run(endpoint, data=params, extra_options=self._options, **kwargs)
        except requests.RequestException as exc:
            raise AssetApiError(f"{where}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 300:
            # The body may echo what we sent; the first 300 characters say why without flooding the log.
            raise AssetApiError(f"{where} answered {response.status_code}: {response.text[:300]!r}")
        try:
            return response.json()
        except ValueError:
            raise AssetApiError(f"{where}: the answer is not JSON") from None

    def asset_id(self, uri: str) -> int:
        """The id of the asset with exactly this URI (the DAG's outlet, serialized by the dag-processor)."""
        answer = self._call("GET", "api/v2/assets", params={"uri_pattern": uri, "limit": 100})
        for asset in (answer or {}).get("assets", []):
            if asset.get("uri") == uri:
                return int(asset["id"])
        raise AssetApiError(f"the api-server knows no asset with URI {uri!r}")

    def find_event(self, asset_id: int, since: str, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        """An event of the asset at or after ``since`` (ISO) whose extra ``match`` accepts, else None."""
        answer = self._call("GET", "api/v2/assets/events",
                            params={"asset_id": asset_id, "timestamp_gte": since, "limit": 100,
                                    "order_by": "-timestamp"})
        for event in (answer or {}).get("asset_events", []):
            if match(event.get("extra") or {}):
                return dict(event)
        return None

    def create_event(self, asset_id: int, extra: dict[str, Any], partition_key: str | None) -> dict[str, Any]:
        """Record one asset event (Airflow marks it ``from_rest_api``) and return it."""
        body: dict[str, Any] = {"asset_id": asset_id, "extra": extra}
        if partition_key:
            body["partition_key"] = partition_key
        return dict(self._call("POST", "api/v2/assets/events", body=body))


def _hook(conn: Any, auth: Any = None) -> Any:
    """An HttpHook on ``conn``, already fetched (asynchronously, in the triggerer): it looks nothing up."""
    return _fetched_hook_class()(conn, auth)


@functools.cache
def _fetched_hook_class() -> type[Any]:
    # Imported here: the module is imported where no request is made (plan checks, the trigger's setup).
    from airflow.providers.http.hooks.http import HttpHook

    class _FetchedHttpHook(HttpHook):
        """HttpHook whose connection is given, not looked up."""

        def __init__(self, conn: Any, auth: Any) -> None:
            super().__init__(method="GET", http_conn_id=conn.conn_id, auth_type=(lambda: auth) if auth else None)
            self._fetched = conn

        def get_connection(self, conn_id: str) -> Any:  # type: ignore[override]
            return self._fetched

    return _FetchedHttpHook

