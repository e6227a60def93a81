"""The plugin's FastAPI app, mounted by the api-server under ``/speculative``.

Every data route requires an authenticated Airflow user allowed to read the DAG (Airflow's own
``requires_access_dag`` dependency: JWT from the ``Authorization`` header or the UI's cookie).
Imported only by the api-server, when it asks the plugin for its ``fastapi_apps``.
"""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_speculative.control.attemptlog import (
    DEFAULT_TAIL_BYTES,
    attempt_ended,
    attempt_log,
    open_attempt_log,
)
from airflow_provider_speculative.control.rerun import request_rerun
from airflow_provider_speculative.core.states import FINISHED_RUN_STATES
from airflow_provider_speculative.core.urls import safe_http_url
from airflow_provider_speculative.exceptions import NotFoundError, StoreError, UnsafeStorePathError
from airflow_provider_speculative.hooks.masking import redact_lines, redact_text
from airflow_provider_speculative.links import spark_history_url
from airflow_provider_speculative.plugin.model import (
    is_done,
    plan_of,
    resolve_stage,
    run_view,
    stage_view,
)
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.files import check_store_directory
from airflow_provider_speculative.store.layout import StageLayout, layout_root, safe_component, shown_root, store_at

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
REFRESH_SECONDS = 2
_NO_STORE = {"Cache-Control": "no-store"}
# /api/stage lists this many subtasks per page by default (500 subtasks with one attempt each are ~0.3 MB
# of JSON where the whole stage was 16 MB); totals by state always cover every subtask.
DEFAULT_SUBTASK_PAGE = 500
MAX_SUBTASK_PAGE = 2000
MAX_SUBTASK_OFFSET = 32768  # the largest parallelism
# The largest request body (a rerun of 100,000 subtasks is ~700 KB of JSON).
MAX_BODY_BYTES = 1024 * 1024
# Pages and API alike: no inline script or style, no plugins, no <base> rewriting, framed only by the
# Airflow UI itself. Data the pages show comes from DAG authors' strings, so the browser is the last guard.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                           "frame-ancestors 'self'")
SECURITY_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "same-origin"}


def create_app(store: Path | StoreBackend | None = None) -> FastAPI:
    """Build the app; ``store`` overrides the ``[speculative] store_path`` store (a root or a backend: tests)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag

    read_run = requires_access_dag("GET", DagAccessEntity.RUN)
    read_task = requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)
    # Attempt logs: the right Airflow's own task-log endpoint asks for.
    read_logs = requires_access_dag("GET", DagAccessEntity.TASK_LOGS)
    # A rerun clears task instances: the same right Airflow's own "Clear" asks for.
    edit_task = requires_access_dag("PUT", DagAccessEntity.TASK_INSTANCE)
    # The schema (routes and parameters, no data) is served for API clients and the schemathesis test.
    app = FastAPI(title="Speculative stages", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.store = store
    # Exposed so tests can replace exactly these dependencies (FastAPI overrides are keyed by callable).
    app.state.access = {"run": read_run, "task_instance": read_task, "task_logs": read_logs,
                        "edit_task_instance": edit_task, "user": get_user}
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_exception_handler(StarletteHTTPException, _login_redirect)  # type: ignore[arg-type]
    app.add_exception_handler(StoreError, _damaged_store)  # type: ignore[arg-type]

    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        """Send the security headers with every response: pages, static files, JSON and errors."""
        refused = _oversized(request)
        response = refused if refused is not None else await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.get("/api/run", dependencies=[Depends(read_run)])
    def api_run(request: Request, dag_id: str, run_id: str) -> dict[str, Any]:
        """Stages of a DAG run: graph edges, per-stage progress, restarts and notable journal events."""
        root = _store(request)
        try:
            _check_directory(root, StageLayout.over(root, dag_id, run_id, "-").run_dir)
        except UnsafeStorePathError:
            raise _not_found(f"run {run_id!r}: its records in the store are not served", dag_id, run_id) from None
        except OSError:
            pass  # not there (yet): run_view says so
        try:
            view = run_view(root, dag_id, run_id, spark_history_url=spark_history_url())
        except (FileNotFoundError, NotFoundError) as exc:
            raise _not_found(str(exc), dag_id, run_id) from None
        return _finish(view, dag_id, run_id)

    @app.get("/api/stage", dependencies=[Depends(read_task)])
    def api_stage(request: Request, dag_id: str, run_id: str, task_id: str,
                  offset: int = Query(0, ge=0, le=MAX_SUBTASK_OFFSET),
                  limit: int = Query(DEFAULT_SUBTASK_PAGE, ge=1, le=MAX_SUBTASK_PAGE)) -> dict[str, Any]:
        """One stage (by its task id): totals by state, one page of subtasks with attempts, blocked nodes, metrics."""
        view = stage_view(_store(request), dag_id, run_id, _stage_or_404(request, dag_id, run_id, task_id),
                          spark_history_url=spark_history_url(), offset=offset, limit=limit)
        return _finish(view, dag_id, run_id)

    @app.get("/api/log", dependencies=[Depends(read_logs)])
    def api_log(request: Request, dag_id: str, run_id: str, task_id: str, subtask: int,
                attempt: int | None = None, tail_bytes: int = DEFAULT_TAIL_BYTES) -> dict[str, Any]:
        """The end of one attempt's driver log (default: the subtask's latest attempt), as JSON text."""
        stage = _stage_or_404(request, dag_id, run_id, task_id)
        store = _store(request)
        try:
            log = attempt_log(store, dag_id, run_id, stage, subtask, attempt, max_bytes=tail_bytes)
        except NotFoundError as exc:
            raise _not_found(str(exc), dag_id, run_id) from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        ended = attempt_ended(store, log)
        plan = plan_of(StageLayout.over(store, dag_id, run_id, stage))
        # The store path is the operator's business, not every DAG reader's: the page shows it as a relative path.
        # ``note`` (a running attempt's log on S3: where it is meanwhile) is plain text the page never parses.
        return {**log.to_json(), "text": redact_text(log.text, plan), "path": _relative(log.path, layout_root(store)),
                "ended": ended, "done": ended,
                "refresh_seconds": REFRESH_SECONDS, "now": time.time()}

    @app.get("/api/log/download", dependencies=[Depends(read_logs)], response_class=StreamingResponse)
    def api_log_download(request: Request, dag_id: str, run_id: str, task_id: str, subtask: int,
                         attempt: int | None = None) -> StreamingResponse:
        """The whole log of one attempt as a download (streamed from disk or from the object, whatever its size)."""
        stage = _stage_or_404(request, dag_id, run_id, task_id)
        store = _store(request)
        try:
            log = attempt_log(store, dag_id, run_id, stage, subtask, attempt, max_bytes=1)
            # The file opened under the store's rules is the one streamed: no second open by name.
            handle = open_attempt_log(store, log)
        except NotFoundError as exc:
            raise _not_found(str(exc), dag_id, run_id) from None
        name = safe_component(f"{dag_id}-{stage}-subtask{subtask}-attempt{log.attempt}") + ".log"
        # text/plain with nosniff (the middleware): a browser never renders an attempt's output as a page.
        plan = plan_of(StageLayout.over(store, dag_id, run_id, stage))
        return StreamingResponse(redact_lines(handle, plan), media_type="text/plain; charset=utf-8",
                                 headers={**_NO_STORE, "Content-Disposition": f'attachment; filename="{name}"'})

    @app.post("/api/rerun", dependencies=[Depends(edit_task), Depends(_refuse_cross_site)])
    def api_rerun(request: Request, dag_id: str, run_id: str, task_id: str, body: RerunBody,
                  user: Any = Depends(get_user)) -> dict[str, Any]:
        """Rerun a stage's region (all or some subtasks, with or without consumers); ``dry_run`` only previews it."""
        stage = _stage_or_404(request, dag_id, run_id, task_id)
        name = _user_name(user)
        try:
            return request_rerun(_store(request), dag_id, run_id, stage, body.subtasks, downstream=body.downstream,
                                 dry_run=body.dry_run, by=f"rerun from the UI by {name}", owner=name)
        except NotFoundError as exc:
            raise _not_found(str(exc), dag_id, run_id) from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None

    @app.get("/ui/run", dependencies=[Depends(read_run)], response_class=FileResponse)
    def ui_run() -> FileResponse:
        """The run view page (DAG-run tab); it polls ``/api/run``."""
        return FileResponse(STATIC / "run.html", headers=_NO_STORE)

    @app.get("/ui/stage", dependencies=[Depends(read_task)], response_class=FileResponse)
    def ui_stage() -> FileResponse:
        """The stage view page (task-instance tab); it polls ``/api/stage``."""
        return FileResponse(STATIC / "stage.html", headers=_NO_STORE)

    @app.get("/ui/log", dependencies=[Depends(read_logs)], response_class=FileResponse)
    def ui_log() -> FileResponse:
        """The attempt log page (linked from the stage view); it polls ``/api/log`` until the attempt ends."""
        return FileResponse(STATIC / "log.html", headers=_NO_STORE)

    @app.get("/ui/spark", dependencies=[Depends(read_task)], response_model=None)
    def ui_spark(request: Request, dag_id: str, run_id: str, task_id: str) -> Response:
        """Spark history of the stage's admitted attempts: a redirect when there is one, else a list."""
        history = spark_history_url()
        if not history:
            raise HTTPException(404, "no Spark history server configured: set [speculative] spark_history_url")
        view = stage_view(_store(request), dag_id, run_id, _stage_or_404(request, dag_id, run_id, task_id),
                          spark_history_url=history)
        # The view builds only http(s) links; checked again here because this page redirects to them.
        links = [(s["subtask"], a["attempt"], url) for s in view["subtasks"] for a in s["attempts"]
                 if a["admitted"] and (url := safe_http_url(a["spark_history"]))]
        if len(links) == 1:
            return RedirectResponse(links[0][2])
        items = "".join(f'<li><a href="{html.escape(url)}">subtask {s}, attempt {n}</a></li>'
                        for s, n, url in links) or "<li>no admitted attempt yet</li>"
        return HTMLResponse(f"<!doctype html><title>Spark history: {html.escape(view['stage'])}</title>"
                            f"<h1>Spark history of stage {html.escape(view['stage'])}</h1><ul>{items}</ul>")

    return app


def _oversized(request: Request) -> Response | None:
    """413 for a body over MAX_BODY_BYTES, 411 for one without a length: refused before anything parses it."""
    from fastapi.responses import JSONResponse

    if request.method in ("GET", "HEAD", "OPTIONS"):
        return None
    length = request.headers.get("content-length")
    if length is None:
        return JSONResponse({"detail": "a request body needs a Content-Length"}, status_code=411)
    if not length.isdigit() or int(length) > MAX_BODY_BYTES:
        return JSONResponse({"detail": f"a request body may hold at most {MAX_BODY_BYTES} bytes"}, status_code=413)
    return None


async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """422 naming what is wrong, without echoing the input (NaN or Infinity cannot be JSON, a big body is big)."""
    from fastapi.responses import JSONResponse

    errors = [{"loc": [str(part) for part in error.get("loc", ())], "msg": str(error.get("msg", ""))}
              for error in exc.errors()[:20]]
    return JSONResponse({"detail": errors}, status_code=422)


async def _damaged_store(request: Request, exc: StoreError) -> Response:
    """A store file that cannot be read (damaged, or not a regular file): 409 naming it relative to the store."""
    from fastapi.responses import JSONResponse

    root = shown_root(_store(request)).rstrip("/") + "/"
    return JSONResponse({"detail": {"message": str(exc).replace(root, ""), "damaged_store": True}}, status_code=409,
                        headers=_NO_STORE)


def _store(request: Request) -> StoreBackend:
    """The store: the app's override, else ``[speculative] store_path``'s (``settings.configured_store``)."""
    if request.app.state.store is not None:
        return store_at(request.app.state.store)
    from airflow_provider_speculative.settings import configured_store

    return configured_store()


def _check_directory(store: StoreBackend, path: Path) -> None:
    """Refuse a run's or stage's directory reached through a link (POSIX; a store without paths has no links)."""
    if isinstance(store, PosixBackend):
        check_store_directory(store.root, path)


class RerunBody(BaseModel):
    """What a rerun request asks for; a preview unless ``dry_run`` is false."""

    model_config = ConfigDict(extra="forbid")

    subtasks: list[int] | None = Field(default=None, max_length=100_000,
                                       description="subtask indexes to rerun; null: all of the stage")
    downstream: bool = Field(default=True, description="also rerun the consumers of the rerun subtasks")
    dry_run: bool = Field(default=True, description="only compute and return the region")


def _refuse_cross_site(request: Request) -> None:
    """A state change only from this origin's own script: JSON (a form cannot send it) and no foreign Origin.

    The UI authenticates by cookie (Airflow sets it SameSite=Lax, so a cross-site POST carries none),
    and a page on another site must not make a logged-in user's browser post a rerun anyway. A
    cross-origin ``application/json`` request needs a CORS preflight, and a browser names the page's
    origin, whose host must be this server's (the Host a proxy forwarded, or X-Forwarded-Host; the
    scheme is not compared because a TLS-terminating proxy changes it).
    """
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise HTTPException(415, "a rerun request must be application/json")
    origin = request.headers.get("origin")
    if origin is None:
        return  # not a browser (curl, an API client with a bearer token): no ambient cookie to abuse
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")} - {None}
    if urlsplit(origin).netloc.lower() not in {h.lower() for h in hosts if h}:
        raise HTTPException(403, f"cross-origin rerun refused: origin {origin!r} is not this server")


def _user_name(user: Any) -> str:
    """The requesting user's name for the journal (tests without an auth manager have none)."""
    try:
        return str(user.get_name())
    except Exception:  # no user object: an override in tests, or an auth manager without names
        return "an unnamed user"


def _relative(path: Path, root: Path) -> str:
    """``path`` relative to the store root (the page needs no absolute path of the api-server's host)."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return path.name


def _stage_or_404(request: Request, dag_id: str, run_id: str, task_id: str) -> str:
    root = _store(request)
    stage = resolve_stage(root, dag_id, run_id, task_id)
    if stage is None:
        raise _not_found(f"task {task_id!r} has no speculative stage recorded in run {run_id!r} "
                         "(not a stage task, or not planned yet)", dag_id, run_id)
    try:
        # The run's and stage's directories must be this DAG's own, not links to another DAG's.
        _check_directory(root, StageLayout.over(root, dag_id, run_id, stage).dir)
    except (OSError, UnsafeStorePathError):
        raise _not_found(f"task {task_id!r}: its stage's records in the store are not served", dag_id, run_id) from None
    return stage


def _not_found(message: str, dag_id: str, run_id: str) -> HTTPException:
    """A 404 that tells the page whether to keep waiting (the run may still plan the stage) or stop."""
    state = airflow_run_state(dag_id, run_id)
    return HTTPException(404, {"message": message, "run_state": state, "done": state in FINISHED_RUN_STATES})


def _finish(view: dict[str, Any], dag_id: str, run_id: str) -> dict[str, Any]:
    """Add the Airflow run state and whether the page may stop polling."""
    state = airflow_run_state(dag_id, run_id)
    return {**view, "run_state": state, "done": is_done(view, state), "refresh_seconds": REFRESH_SECONDS}


def airflow_run_state(dag_id: str, run_id: str) -> str | None:
    """The DAG run's state from the metadata DB, or None when it cannot be read (the views work without it)."""
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            state = session.scalar(select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    except Exception:  # no DB (store-only deployments, tests): the page stops on "all committed" instead
        log.debug("cannot read the state of dag %s run %s", dag_id, run_id, exc_info=True)
        return None
    return None if state is None else str(getattr(state, "value", state))


async def _login_redirect(request: Request, exc: StarletteHTTPException) -> Response:
    """Send a browser that opens a page without a session to the auth manager's login page."""
    if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
        from airflow.api_fastapi.app import get_auth_manager

        try:
            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)))
        except Exception:  # no auth manager initialised (tests): plain 401
            log.debug("no login redirect", exc_info=True)
    if exc.status_code == 404 and isinstance(exc, HTTPException):
        # Where the store lives on the api-server's host is the operator's business, not every reader's.
        exc = HTTPException(404, _without_root(exc.detail, shown_root(_store(request)).rstrip("/") + "/"), exc.headers)
    return await http_exception_handler(request, exc)


def _without_root(detail: Any, root: str) -> Any:
    """``detail`` (a string or a dict of them) with the store root's absolute path removed."""
    if isinstance(detail, str):
        return detail.replace(root, "").replace(root.rstrip("/"), "<store>")
    if isinstance(detail, dict):
        return {key: _without_root(value, root) for key, value in detail.items()}
    return detail
