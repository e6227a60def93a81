"""What the run and stage views show, built from the store (no FastAPI, no metadata DB)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow_provider_speculative.control.readmodel import journal_records, read_document, run_report
from airflow_provider_speculative.core.events import Event, is_routine
from airflow_provider_speculative.core.states import FINISHED_RUN_STATES, LIVE
from airflow_provider_speculative.core.summary import StageSummary
from airflow_provider_speculative.core.urls import safe_http_url
from airflow_provider_speculative.exceptions import StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.files import open_in_store
from airflow_provider_speculative.store.layout import StageLayout, stage_key

RESTART_REASON = "restart after failure"
SUBTASK_STATES = ("admitted", "running", "failed", "waiting")
# The stage view lists at most this many controller events (the latest); events_total counts them all.
MAX_EVENTS = 200
_LOG_HEAD_BYTES = 256 * 1024
_SPARK_UI_PORT = re.compile(r"Successfully started service '?SparkUI'? on port (\d+)")
_DRIVER_HOST = re.compile(r"(?:Server created on |Starting executor ID driver on host )([^\s:]+)")


def resolve_stage(root: Path | StoreBackend, dag_id: str, run_id: str, task_id: str) -> str | None:
    """The store key of ``task_id``'s stage in this run: the task id itself, or its last part inside a task group.

    The last part only for a pipeline put in a task group by hand (its stages keep their names as store
    keys), and only if that stage's plan was written by this task: a pipeline compiled as a TaskGroup keys its
    stages by task id, so one of them that has not planned yet is not another pipeline's stage of that name.
    """
    own = StageLayout.at(root, dag_id, run_id, task_id)
    if own.store.exists(own.name(own.plan)):
        return task_id
    last = StageLayout.at(root, dag_id, run_id, task_id.rsplit(".", 1)[-1])
    if last.stage == task_id or not last.store.exists(last.name(last.plan)):
        return None
    try:
        plan = plan_of(last)
    except StoreError:
        return last.stage  # unreadable: the stage view reports it
    if not isinstance(plan, dict):
        return last.stage
    planned_by = plan.get("task_id")  # absent from plans written before it was recorded
    return last.stage if not plan.get("store_prefix") and planned_by in (None, "", task_id) else None


def plan_of(layout: StageLayout) -> Any:
    """The stage's plan.json read by name (None if missing), as the read model reads a stage's documents."""
    return read_document(layout.store, layout.name(layout.plan))


def run_view(root: Path | StoreBackend, dag_id: str, run_id: str, *, spark_history_url: str = "",
             now: float | None = None) -> dict[str, Any]:
    """Every stage of a run with the stage graph's edges; raises NotFoundError when none is recorded."""
    now = time.time() if now is None else now
    report = run_report(root, dag_id, run_id, liveness="heartbeat", now=now, with_claims=True)
    # The run page shows stages, not subtasks: each stage comes with its totals by state instead of its
    # subtask list (a 32,768-subtask stage would make every poll of the run page megabytes too).
    stages = [_compact(_enrich(root, dag_id, run_id, s, spark_history_url, now, page=(0, 0)))
              for s in report["stages"]]
    names = {s["stage"] for s in stages}
    edges, sources = [], []
    for s in stages:
        for spec in s["inputs"]:
            if spec["kind"] == "exchange":
                edges.append({"from": spec.get("upstream"), "to": s["stage"], "input": spec["name"],
                              "distribution": spec.get("distribution"), "mode": spec.get("mode")})
            else:
                sources.append({"stage": s["stage"], "input": spec["name"], "kind": spec["kind"],
                                "format": spec.get("format")})
    # A consumer that has not planned yet is still part of the graph: show it as waiting.
    pending = sorted({c for s in stages for c in s["consumers"]} - names)
    all_committed = bool(stages) and not pending and all(s["committed"] for s in stages)
    return {"dag_id": dag_id, "run_id": run_id, "now": now, "stages": stages, "edges": edges, "sources": sources,
            "pending_stages": pending, "all_committed": all_committed}


def stage_view(root: Path | StoreBackend, dag_id: str, run_id: str, stage: str, *, spark_history_url: str = "",
               now: float | None = None, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
    """One stage with its blocked nodes, baseline, metrics and the subtasks ``[offset, offset + limit)``.

    Totals by state (``subtask_totals``) and the stage's aggregates cover every subtask; only the page's
    subtasks are listed with their attempts (``subtask_page`` says which), and only the last
    ``MAX_EVENTS`` controller events (``events_total`` counts them all), so a 32,768-subtask stage is not
    one document of megabytes on every poll. ``limit=None`` lists every subtask.
    """
    now = time.time() if now is None else now
    report = run_report(root, dag_id, run_id, stage, liveness="heartbeat", now=now, with_claims=True)
    stop = None if limit is None else offset + limit
    view = _enrich(root, dag_id, run_id, report["stages"][0], spark_history_url, now, page=(offset, stop))
    subtasks = view["subtasks"]
    page = subtasks[offset:stop]
    view.update(subtasks=page, subtask_totals=subtask_totals(subtasks),
                subtask_page={"offset": offset, "limit": limit, "count": len(page), "total": len(subtasks)},
                events=view["events"][-MAX_EVENTS:], events_total=len(view["events"]))
    return {"dag_id": dag_id, "run_id": run_id, "now": now, **view}


def _compact(stage: dict[str, Any]) -> dict[str, Any]:
    """A stage for the run view: totals by state for its subtasks, the latest events and first restarts."""
    subtasks = stage.pop("subtasks")
    stage.update(subtask_totals=subtask_totals(subtasks), events=stage["events"][-MAX_EVENTS:],
                 events_total=len(stage["events"]), restarts=stage["restarts"][:MAX_EVENTS],
                 restarts_total=len(stage["restarts"]))
    return stage


def subtask_state(subtask: dict[str, Any]) -> str:
    """One word for a subtask: admitted (or reused), running (a live attempt), failed (attempts, none live), waiting."""
    if subtask["admitted"] is not None or subtask["reused"]:
        return "admitted"
    if any(a["state"] in LIVE for a in subtask["attempts"]):
        return "running"
    return "failed" if subtask["attempts"] else "waiting"


def subtask_totals(subtasks: list[dict[str, Any]]) -> dict[str, int]:
    """How many subtasks are in each state of :func:`subtask_state` (every state present, summing to the count)."""
    totals = dict.fromkeys(SUBTASK_STATES, 0)
    for sub in subtasks:
        totals[subtask_state(sub)] += 1
    return totals


def _enrich(root: Path | StoreBackend, dag_id: str, run_id: str, stage: dict[str, Any], history: str,
            now: float, page: tuple[int, int | None] = (0, None)) -> dict[str, Any]:
    """Add to run_report's stage what the views need: reasons, inputs, progress, restarts, events, window.

    Links (Spark UI, history) are looked up only for the subtasks of ``page`` ([start, stop)), the ones listed.
    """
    layout = StageLayout.at(root, dag_id, run_id, stage["stage"])
    plan = plan_of(layout) or {}
    summary: StageSummary = read_document(layout.store, layout.name(layout.summary)) or StageSummary()
    journal = journal_records(layout)
    # The stage's own config (pipeline and stage overrides applied) wins over the global one. It was
    # validated when the DAG was parsed, but the plan is a file: one written before that check, or by
    # hand, must not turn into a javascript: link, so an unsafe value means no link at all.
    own = (plan.get("config") or {}).get("spark_history_url")
    stage_history = (safe_http_url(own) or "") if own else history
    starts, ends, restarts = [], [], []
    first, stop = page
    for sub in stage["subtasks"]:
        listed = sub["subtask"] >= first and (stop is None or sub["subtask"] < stop)
        for a in sub["attempts"]:
            # run_report(with_claims=True) set reason and created from the claim, cached with ended attempts.
            a["restart"] = a["reason"] == RESTART_REASON
            a["live"] = a["state"] in LIVE
            begin = a["start"] or a["created"]
            # Liveness comes from the store's timestamps (the read model's heartbeat mode), never from a
            # pid lookup on the api-server's host, which knows nothing of attempts on other machines.
            a["heartbeat_age"] = (now - a["last_seen"]) if a["live"] and a["last_seen"] else None
            a["spark_ui"] = _live_spark_ui(layout, sub["subtask"], a) if a["live"] and listed else None
            a["spark_history"] = _history_link(layout, sub["subtask"], a, stage_history) if listed else None
            if begin:
                starts.append(begin)
                ends.append(a["end"] or now)
            if a["restart"]:
                restarts.append({"subtask": sub["subtask"], "attempt": a["attempt"], "target": a["target"],
                                 "node": a["node"], "state": a["state"], "cause": a["cause"]})
    done = [s for s in stage["subtasks"] if s["admitted"] is not None or s["reused"]]
    events = [e for e in journal if not is_routine(e.get("event"))]
    failed = bool(events) and events[-1].get("event") == Event.STAGE_FAILED and not stage["committed"]
    live = any(a["live"] for s in stage["subtasks"] for a in s["attempts"])
    first_inputs = plan.get("inputs") or {}
    stage.update(
        state="committed" if stage["committed"] else "failed" if failed else "running" if live else "waiting",
        progress={"admitted": len(done), "parallelism": stage["parallelism"]},
        inputs=[{"name": name, "kind": spec.get("kind"),
                 "upstream": stage_key(plan, spec["upstream"]) if spec.get("upstream") else spec.get("upstream"),
                 "distribution": spec.get("distribution"), "mode": spec.get("mode"), "format": spec.get("format")}
                for name, spec in sorted(first_inputs.items())],
        attempts_total=sum(len(s["attempts"]) for s in stage["subtasks"]),
        speculative_attempts=sum(a["speculative"] for s in stage["subtasks"] for a in s["attempts"]),
        peakSlowExecutionVertices=summary.get("peakSlowExecutionVertices", 0),
        speculation_blocker=plan.get("speculation_blocker"),
        blocked=[{"node": node, "until": until, "expired": until <= now}
                 for node, until in sorted(stage["blocked_nodes"].items())],
        restarts=restarts, events=events,
        window={"start": min(starts) if starts else None, "end": max(ends) if ends else None},
    )
    return stage


def _history_link(layout: StageLayout, subtask: int, attempt: dict[str, Any], history: str) -> str | None:
    """The Spark history server page of a finished attempt, where a history server is configured."""
    if not history or attempt["live"]:
        return None
    app_id = attempt.get("app_id") or _app_id(layout, subtask, attempt["attempt"])
    # Without the application id a link could only be the server's front page: better none.
    if not app_id:
        return None
    # The id comes from a file the attempt wrote: quoted, it stays one path segment of the history server.
    return safe_http_url(f"{history.rstrip('/')}/history/{quote(str(app_id), safe='')}/")


def _app_id(layout: StageLayout, subtask: int, number: int) -> str | None:
    """The Spark application id an attempt recorded (status or heartbeat), if any."""
    for path in (layout.status(subtask, number), layout.heartbeat(subtask, number)):
        record = read_document(layout.store, layout.name(path)) or {}
        for key in ("app_id", "application_id", "spark_app_id"):
            if record.get(key):
                return str(record[key])
    return None


def _live_spark_ui(layout: StageLayout, subtask: int, attempt: dict[str, Any]) -> str | None:
    """The driver's Spark UI of a running attempt, read from the head of its spark-submit log.

    A log is read by path, opened under the store's rules (no link anywhere below the root, a regular file
    of its own): an attempt's code writes it and could put a link to the api-server's files in its place.
    """
    if not isinstance(layout.store, PosixBackend):
        return None  # attempt logs are local files: a store without paths has none to read
    path = layout.log(subtask, attempt["attempt"])
    try:
        with open_in_store(layout.root, path) as f:
            head = f.read(_LOG_HEAD_BYTES).decode(errors="replace")
    except (OSError, UnsafeStorePathError):  # a link or a FIFO in place of the log shows no link, never blocks
        return None
    port = _SPARK_UI_PORT.search(head)
    if not port:
        return None
    host = _DRIVER_HOST.search(head)
    # The host comes from a log any attempt's code can write to: only a well-formed http URL is shown.
    return safe_http_url(f"http://{host.group(1) if host else attempt['node'] or 'localhost'}:{port.group(1)}/")


def is_done(view: dict[str, Any], run_state: str | None) -> bool:
    """True once nothing in the view can change: all committed, or the Airflow run has finished."""
    if run_state in FINISHED_RUN_STATES:
        return True
    return bool(view.get("all_committed", view.get("committed")))

