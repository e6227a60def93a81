"""``airflow speculative status`` (stages -> subtasks -> attempts of a DAG run) and ``gc`` (store clean-up)."""

from __future__ import annotations

import contextlib
import getpass
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import IO, Any, NoReturn

from airflow_provider_speculative.cli.output import clean, clean_text, emit
from airflow_provider_speculative.core.states import FINISHED_RUN_STATES
from airflow_provider_speculative.core.units import format_bytes

# -- pure formatting (unit-tested) ----------------------------------------------------------------


def _local(ts: float, tz: tzinfo | None) -> datetime:
    """``ts`` as an aware datetime in ``tz`` (default: the machine's local zone)."""
    return datetime.fromtimestamp(ts, tz) if tz is not None else datetime.fromtimestamp(ts).astimezone()


def format_time(ts: float | None, now: float, tz: tzinfo | None = None, seconds: bool = True) -> str:
    """Local wall-clock time; with the date when it is not today (``14:02:07``, ``2026-01-01 14:02:07``)."""
    if ts is None:
        return "-"
    when, today = _local(ts, tz), _local(now, tz)
    clock = when.strftime("%H:%M:%S" if seconds else "%H:%M")
    return clock if when.date() == today.date() else f"{when:%Y-%m-%d} {clock}"


def format_duration(seconds: float | None) -> str:
    """A short human duration: ``850ms``, ``42s``, ``5m 03s``, ``2h 05m``, ``3d 4h``."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, sec = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def format_until(ts: float, now: float, tz: tzinfo | None = None) -> str:
    """A deadline relative to now: ``until 14:02 (in 5m 00s)``, or ``expired at 14:02 (3m 00s ago)``."""
    at = format_time(ts, now, tz, seconds=False)
    if ts > now:
        return f"until {at} (in {format_duration(ts - now)})"
    return f"expired at {at} ({format_duration(now - ts)} ago)"


def iso_time(ts: float | None, tz: tzinfo | None = None) -> str | None:
    """ISO-8601 with the UTC offset (``2026-01-01T14:02:07.123+01:00``), or None."""
    return None if ts is None else _local(ts, tz).isoformat(timespec="milliseconds")


def _utc_offset(now: float, tz: tzinfo | None) -> str:
    offset = _local(now, tz).strftime("%z")
    return f"UTC{offset[:3]}:{offset[3:]}" if offset else "UTC"


def slot_lines(stage: dict[str, Any], now: float | None = None) -> list[str]:
    """Live slots per target at the controller's last check, lost nodes, and the stage's wait, one per line.

    The views are what the controller last saw, not a live probe: the first line says how old they are.
    """
    lines = []
    observed = stage.get("slots_observed_at")
    if stage.get("slots") and isinstance(observed, int | float):
        ago = (time.time() if now is None else now) - observed
        state = "; the stage is over" if stage.get("committed") or stage.get("failed") else ""
        lines.append(f"as of the controller's last check, {format_duration(max(0.0, ago))} ago{state}:")
    for name, view in sorted((stage.get("slots") or {}).items()):
        state = "live" if view.get("live") else f"LOST ({view.get('reason') or 'not live'})"
        nodes = f", workers {', '.join(view['nodes'])}" if view.get("nodes") else ""
        lines.append(f"{name} {state}: {view.get('free', 0)} free of {view.get('capacity', 0)} "
                     f"(held by any stage: {view.get('held', 0)}){nodes}")
    for node, why in sorted((stage.get("lost_nodes") or {}).items()):
        lines.append(f"node {node} lost: {why}")
    if stage.get("target_lost_attempts"):
        lines.append(f"{stage['target_lost_attempts']} attempt(s) rerun after their target or node was lost "
                     "(not counted as failures)")
    if stage.get("slot_status"):
        lines.append(str(stage["slot_status"]))
    if stage.get("speed_line"):
        lines.append(str(stage["speed_line"]))
    return lines


def report_lines(report: dict[str, Any], now: float | None = None, tz: tzinfo | None = None) -> list[str]:
    """The lines above the attempts table: the run, and per stage its state, slots, warnings and inputs."""
    now = time.time() if now is None else now
    lines = [f"DAG {report['dag_id']} run {report['run_id']} (times in local time, {_utc_offset(now, tz)})"]
    for stage in report["stages"]:
        blocked = ", ".join(f"{node} {format_until(until, now, tz)}"
                            for node, until in sorted(stage["blocked_nodes"].items()))
        lines.append(
            f"stage {stage['stage']}: parallelism {stage['parallelism']}, committed {stage['committed']}, "
            f"speculation {stage['speculation']}, numSlowExecutionVertices {stage['numSlowExecutionVertices']}, "
            f"numEffectiveSpeculativeExecutions {stage['numEffectiveSpeculativeExecutions']}"
            + (f", blocked nodes: {blocked}" if blocked else "")
            + (f", results expired (removed by gc at {format_time(stage['expired']['at'], now, tz)})"
               if stage.get("expired") else ""))
        lines.append(f"  parallelism: {stage.get('parallelism_line') or 'fixed'}")
        lines += [f"  slots: {line}" for line in slot_lines(stage, now)]
        lines += [f"  warning: {w}" for w in stage.get("plan_warnings") or []]
        lines += [f"  skew: {note}" for note in stage.get("skew_splits") or []]
        lines += [f"  inputs: {note}" for note in stage.get("input_waits") or []]
        if stage.get("breakdown_line"):
            lines.append(f"  {stage['breakdown_line']}")
    if report.get("critical_path_line"):
        lines.append(str(report["critical_path_line"]))
    return lines


def attempt_rows(report: dict[str, Any], now: float | None = None, tz: tzinfo | None = None) -> list[dict[str, str]]:
    """One row per attempt (a reused subtask without attempts gets one too), times in local time."""
    now = time.time() if now is None else now
    rows: list[dict[str, str]] = []
    for stage in report["stages"]:
        for sub in stage["subtasks"]:
            if not sub["attempts"]:
                rows.append({"stage": stage["stage"], "subtask": str(sub["subtask"]), "attempt": "-",
                             "state": "REUSED" if sub["reused"] else "-", "target": "-", "node": "-", "start": "-",
                             "end": "-", "duration": "-", "exit": "-", "flags": ""})
            for a in sub["attempts"]:
                flags = [f for f, on in (("admitted", a["admitted"]), ("current", a["attempt"] == sub["current"]),
                                         ("speculative", a["speculative"])) if on]
                duration = ((a["end"] or now) - a["start"]) if a["start"] else None
                rows.append({"stage": stage["stage"], "subtask": str(sub["subtask"]), "attempt": str(a["attempt"]),
                             "state": a["state"], "target": a["target"] or "-", "node": a["node"] or "-",
                             "start": format_time(a["start"], now, tz), "end": format_time(a["end"], now, tz),
                             "duration": format_duration(duration)
                             + ("+" if duration is not None and not a["end"] else ""),
                             "exit": "-" if a["exit_code"] is None else str(a["exit_code"]),
                             "flags": ",".join(flags)})
    return rows


_ATTEMPT_TIMES = ("start", "end", "launched_at", "last_seen")


def json_report(report: dict[str, Any], now: float | None = None, tz: tzinfo | None = None) -> dict[str, Any]:
    """The report for ``--output json``: times as ISO-8601 with offset, the epoch seconds under ``*_epoch``."""
    now = time.time() if now is None else now
    stages = []
    for stage in report["stages"]:
        subtasks = []
        for sub in stage["subtasks"]:
            attempts = []
            for a in sub["attempts"]:
                out = {k: v for k, v in a.items() if k not in _ATTEMPT_TIMES}
                for key in _ATTEMPT_TIMES:
                    if key in a:
                        out[key], out[f"{key}_epoch"] = iso_time(a[key], tz), a[key]
                out["duration_seconds"] = ((a["end"] or now) - a["start"]) if a.get("start") else None
                attempts.append(out)
            subtasks.append({**sub, "attempts": attempts})
        blocked = stage["blocked_nodes"]
        expired = stage.get("expired")
        stages.append({**stage, "subtasks": subtasks,
                       "blocked_nodes": {node: iso_time(until, tz) for node, until in blocked.items()},
                       "blocked_nodes_epoch": dict(blocked),
                       "expired": {**expired, "at": iso_time(expired.get("at"), tz), "at_epoch": expired.get("at")}
                       if expired else expired})
    path = [{**entry, "start": iso_time(entry["start"], tz), "start_epoch": entry["start"],
             "end": iso_time(entry["end"], tz), "end_epoch": entry["end"]}
            for entry in report.get("critical_path") or []]
    return {**report, "generated_at": iso_time(now, tz), "stages": stages, "critical_path": path}


PROGRESS_COLUMNS = ("stage", "state", "admitted", "running", "speculative", "slow", "blocked nodes")


def progress_title(report: dict[str, Any], now: float, tz: tzinfo | None = None, run_state: str | None = None) -> str:
    """The line above a ``--watch`` frame: the run, the time of the frame and the Airflow run's state."""
    state = f", Airflow run {run_state}" if run_state else ""
    return f"DAG {report['dag_id']} run {report['run_id']} at {format_time(now, now, tz)}{state}"


def progress_rows(report: dict[str, Any], progress: dict[str, Any], now: float,
                  tz: tzinfo | None = None) -> list[dict[str, str]]:
    """One row per stage with admitted/total, running, speculative and slow attempts; unplanned stages last."""
    by_name = {s["stage"]: s for s in report["stages"]}
    rows = []
    for p in progress["stages"]:
        blocked = ", ".join(f"{node} {format_until(until, now, tz)}"
                            for node, until in sorted(by_name[p["stage"]]["blocked_nodes"].items()) if until > now)
        rows.append(dict(zip(PROGRESS_COLUMNS, (p["stage"], p["state"], f"{p['admitted']}/{p['total']}",
                                                str(p["running"]), str(p["speculative"]), str(p["slow"]),
                                                blocked or "-"), strict=True)))
    rows += [dict(zip(PROGRESS_COLUMNS, (name, "not planned", "-", "-", "-", "-", "-"), strict=True))
             for name in progress["pending_stages"]]
    return rows


def progress_table(report: dict[str, Any], progress: dict[str, Any], now: float, tz: tzinfo | None = None,
                   run_state: str | None = None) -> Any:
    """The ``--watch`` frame: the title line above a rich table of :func:`progress_rows` (Airflow's table style)."""
    from airflow.cli.simple_table import SimpleTable
    from rich.console import Group
    from rich.text import Text

    table = SimpleTable(show_header=True, caption=None)
    for column in PROGRESS_COLUMNS:
        table.add_column(column)
    for row in progress_rows(report, progress, now, tz):
        table.add_row(*(clean(value) for value in row.values()))
    # Not the table's title: a title wraps at the table's width.
    return Group(Text.from_markup(clean(progress_title(report, now, tz, run_state))), table)


# Columns a frame written to a pipe may use: as AirflowConsole's tables on a pipe.
PIPE_WIDTH = 200


def format_progress(report: dict[str, Any], progress: dict[str, Any], now: float, tz: tzinfo | None = None,
                    run_state: str | None = None) -> str:
    """The ``--watch`` frame's table as plain text, for output that is not a terminal."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    # Wide enough that a pipe never gets a wrapped row; no colour codes in a file.
    Console(file=buffer, width=PIPE_WIDTH, color_system=None, force_terminal=False).print(
        progress_table(report, progress, now, tz, run_state))
    return "\n".join(line.rstrip() for line in buffer.getvalue().strip("\n").splitlines())


def progress_document(report: dict[str, Any], progress: dict[str, Any], now: float, tz: tzinfo | None = None,
                      run_state: str | None = None) -> dict[str, Any]:
    """A ``--watch`` frame for ``--output json|yaml``: the run, the time (ISO and epoch) and each stage's progress."""
    by_name = {s["stage"]: s for s in report["stages"]}
    stages = [{**p, "blocked_nodes": {node: iso_time(until, tz) for node, until in
                                      sorted(by_name[p["stage"]]["blocked_nodes"].items()) if until > now}}
              for p in progress["stages"]]
    return {"dag_id": report["dag_id"], "run_id": report["run_id"], "at": iso_time(now, tz), "at_epoch": now,
            "airflow_run_state": run_state, **progress, "stages": stages}


def write_progress(out: IO[str], output: str, report: dict[str, Any], progress: dict[str, Any], now: float,
                   tz: tzinfo | None = None, run_state: str | None = None, first: bool = True) -> None:
    """Write one ``--watch`` frame that is not redrawn in place, in ``output``'s format.

    json: one document per line; yaml: one document per frame (``---``); plain and table: frames separated by
    a blank line.
    """
    if output == "json":
        out.write(json.dumps(progress_document(report, progress, now, tz, run_state), default=str) + "\n")
    elif output == "yaml":
        import yaml

        document = json.loads(json.dumps(progress_document(report, progress, now, tz, run_state), default=str))
        out.write(yaml.safe_dump(document, sort_keys=False, explicit_start=True))
    else:
        out.write("" if first else "\n")
        if output == "plain":
            out.write(clean_text(progress_title(report, now, tz, run_state)) + "\n")
            out.flush()
            # emit prints plain rows with Airflow's console, to sys.stdout.
            with contextlib.redirect_stdout(out):
                emit("plain", rows=progress_rows(report, progress, now, tz), document=None)
        else:
            out.write(format_progress(report, progress, now, tz, run_state) + "\n")
    out.flush()


# -- status ---------------------------------------------------------------------------------------


def watch(root: Any, dag_id: str, run_id: str, *, out: IO[str], interval: float, stage: str | None = None,
          run_state: Callable[[], str | None] = lambda: None, in_place: bool | None = None, output: str = "table",
          clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
          max_frames: int | None = None) -> dict[str, Any]:
    """Redraw the progress table every ``interval`` s until the run ends; return the last progress.

    The run ends when every stage committed, a stage failed and nothing else runs, or the Airflow run
    finished. A table on a terminal replaces the previous frame; otherwise frames follow each other, in
    ``output``'s format (json: one document per line).
    """
    in_place = output == "table" and (out.isatty() if in_place is None else in_place)
    live = None
    if in_place:
        from rich.console import Console
        from rich.live import Live

        # rich redraws the frame in place (and restores the cursor on exit).
        live = Live(console=Console(file=out, force_terminal=True), auto_refresh=False, transient=False)
        live.start()
    try:
        return _watch_frames(root, dag_id, run_id, out=out, live=live, output=output, interval=interval, stage=stage,
                             run_state=run_state, clock=clock, sleep=sleep, max_frames=max_frames)
    finally:
        if live is not None:
            live.stop()


def _watch_frames(root: Any, dag_id: str, run_id: str, *, out: IO[str], live: Any, output: str, interval: float,
                  stage: str | None, run_state: Callable[[], str | None], clock: Callable[[], float],
                  sleep: Callable[[float], None], max_frames: int | None) -> dict[str, Any]:
    """The loop of :func:`watch`: read the store, draw a frame, stop when the run ends."""
    from airflow_provider_speculative.control.readmodel import run_progress, run_report
    from airflow_provider_speculative.exceptions import NotFoundError

    frames = 0
    while True:
        now = clock()
        state = run_state()
        try:
            report = run_report(root, dag_id, run_id, stage)
        except NotFoundError:
            # A queued run has planned no stage yet: wait for it, unless Airflow does not know it or it is over.
            if state is None or state in FINISHED_RUN_STATES:
                raise
            report = {"dag_id": dag_id, "run_id": run_id, "stages": []}
        progress = run_progress(report)
        if not report["stages"]:
            progress["done"] = False
        if live is not None:
            live.update(progress_table(report, progress, now, run_state=state), refresh=True)
        else:
            write_progress(out, output, report, progress, now, run_state=state, first=not frames)
        frames += 1
        if progress["done"] or state in FINISHED_RUN_STATES or (max_frames and frames >= max_frames):
            return progress
        sleep(interval)


def _airflow_run_state(dag_id: str, run_id: str) -> str | None:
    """The DAG run's state in the metadata DB, or None when it cannot be read (the watch then uses the store)."""
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            state = session.scalar(select(DagRun._state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    except Exception:  # a store without a reachable DB still has its own end condition
        return None
    return None if state is None else str(getattr(state, "value", state))


def status(args: Any) -> None:
    """CLI entry: print the attempts table or JSON for ``--dag-id``/``--run-id`` (``--watch``: live progress)."""
    from airflow_provider_speculative.control.readmodel import latest_run_id, run_report
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import configured_store

    root = configured_store()
    try:
        if not args.run_id:
            args.run_id = latest_run_id(root, args.dag_id)
            print(f"DAG {args.dag_id}: latest run in the store is {args.run_id}", file=sys.stderr)
        if getattr(args, "watch", False):
            if args.interval <= 0:
                _fail("--interval must be > 0")
            try:
                watch(root, args.dag_id, args.run_id, out=sys.stdout, interval=args.interval, stage=args.stage,
                      run_state=lambda: _airflow_run_state(args.dag_id, args.run_id), output=args.output)
            except KeyboardInterrupt:
                pass
            return
        report = run_report(root, args.dag_id, args.run_id, args.stage)
    except (SpeculativeError, OSError) as exc:  # unknown run or stage, corrupt plan.json, unreadable store
        _fail(str(exc))
    now = time.time()
    emit(args.output, rows=attempt_rows(report, now), document=json_report(report, now),
         header=report_lines(report, now))


def logs(args: Any) -> None:
    """CLI entry: print the end of an attempt's driver log (default: the subtask's latest attempt).

    On a store without paths (S3) a running attempt's log reaches the store when the attempt ends: unless this is
    its supervisor's host (the local file is read then), the command says where the log is and exits 1, or with
    ``--follow`` waits for the end and prints the log then. An attempt that ended without an uploaded log: exit 1.
    """
    from airflow_provider_speculative.control.attemptlog import attempt_ended, attempt_log, read_log_from
    from airflow_provider_speculative.control.readmodel import latest_run_id
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import configured_store

    if args.follow and args.interval <= 0:
        _fail("--interval must be > 0")
    store = configured_store()
    try:
        if not args.run_id:
            args.run_id = latest_run_id(store, args.dag_id)
            print(f"DAG {args.dag_id}: latest run in the store is {args.run_id}", file=sys.stderr)
        log = attempt_log(store, args.dag_id, args.run_id, args.stage, args.subtask, args.attempt,
                          max_bytes=args.tail_bytes)
    except (SpeculativeError, OSError, ValueError) as exc:  # unknown run/stage/...: bad args
        _fail(str(exc))
    if args.output in ("json", "yaml"):
        emit(args.output, rows=[], document=log.to_json())
        if log.elsewhere:
            sys.exit(1)  # the document says why there is no text: a script must not take it for an empty log
        return
    state = "" if log.exists else " (not in the store)" if log.elsewhere else " (no output yet)"
    cut = f", last {format_bytes(log.size - log.start)} of {format_bytes(log.size)}" if log.truncated else ""
    print(f"stage {log.stage} subtask {log.subtask} attempt {log.attempt}: {log.path}{cut}{state}",
          file=sys.stderr)
    if log.note:
        print(clean_text(log.note), file=sys.stderr)
    sys.stdout.write(clean_text(log.text))
    sys.stdout.flush()
    if not args.follow:
        if log.elsewhere:
            if not attempt_ended(store, log):
                print("run with --follow to wait for the attempt's end and print its log then", file=sys.stderr)
            sys.exit(1)
        return
    offset = log.size
    try:
        while True:
            # Read once more after the end is recorded: the last lines may land just before it.
            ended = attempt_ended(store, log)
            offset, text = read_log_from(store, log, offset)
            if text:
                sys.stdout.write(clean_text(text))
                sys.stdout.flush()
            elif ended:
                if log.elsewhere and offset == 0 and not attempt_log(
                        store, log.dag_id, log.run_id, log.stage, log.subtask, log.attempt, max_bytes=1).exists:
                    _fail(f"attempt {log.attempt} ended and its log is not in the store: nothing to print")
                return
            else:
                time.sleep(args.interval)  # polling a file another process appends to
    except KeyboardInterrupt:
        pass


@dataclass
class DbFacts:
    """What gc reads from the metadata DB about the DAGs in the store."""

    run_states: dict[tuple[str, str], str] = field(default_factory=dict)
    known_dags: set[str] = field(default_factory=set)
    deleted_dags: set[str] = field(default_factory=set)
    deleted_runs: set[tuple[str, str]] = field(default_factory=set)


def _db_facts(dag_ids: list[str]) -> DbFacts:
    """Run states, which DAGs the DB knows, and the deletions its audit log recorded (UI/REST API)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    facts = DbFacts()
    if not dag_ids:
        return facts
    with create_session() as session:
        rows = session.execute(
            select(DagRun.dag_id, DagRun.run_id, DagRun._state).where(DagRun.dag_id.in_(dag_ids))).all()
        # The column holds plain strings; an enum would print as "DagRunState.SUCCESS".
        facts.run_states = {(d, r): str(getattr(state, "value", state)) for d, r, state in rows}
        facts.known_dags = set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids))))
        logged = session.execute(select(Log.event, Log.dag_id, Log.run_id).where(
            Log.dag_id.in_(dag_ids), Log.event.in_(("delete_dag_run", "delete_dag")))).all()
    facts.deleted_runs = {(str(d), r) for event, d, r in logged if event == "delete_dag_run" and r}
    # A DAG deleted and later re-added is known again: its runs then need their own deletion record.
    facts.deleted_dags = {str(d) for event, d, _ in logged if event == "delete_dag"} - facts.known_dags
    return facts


def gc_rows(root: str, items: list[Any]) -> list[dict[str, str]]:
    """One row per path gc removes (or would)."""
    return [{"reason": i.reason, "bytes": str(i.bytes), "path": i.display(root), "why": i.detail} for i in items]


def gc_footer(items: list[Any], dry_run: bool, summary: dict[str, Any] | None) -> list[str]:
    """What gc would remove or removed in total, and each error."""
    total = sum(i.bytes for i in items)
    if dry_run:
        return [f"dry run: would remove {len(items)} paths, {format_bytes(total)} ({total} bytes)"]
    assert summary is not None
    return [f"removed {summary['removed']} paths, {format_bytes(summary['bytes'])} ({summary['bytes']} bytes)",
            *(f"error: {e['path']}: {e['error']}" for e in summary["errors"])]


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit status 1: user errors get no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def gc(args: Any) -> None:
    """CLI entry: remove (or with ``--dry-run`` list) what the store no longer needs."""
    import time

    from airflow_provider_speculative.control.lifecycle import (
        adopt_runs,
        execute_gc,
        list_sink_staging,
        plan_gc,
        store_dag_ids,
    )
    from airflow_provider_speculative.core.config import parse_option
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import configured_store, metadata_db_identity
    from airflow_provider_speculative.store.identity import (
        StoreNotOwnedError,
        claim_store,
        mismatch,
        read_store_identity,
        store_present,
    )
    from airflow_provider_speculative.store.layout import shown_root

    try:
        retention = None if args.retention is None else parse_option("retention", args.retention, "--retention")
        older = getattr(args, "older_than", None)
        older_than = None if older is None else parse_option("retention", older, "--older-than")
        root = configured_store()
        identity = metadata_db_identity()
        if getattr(args, "claim", False):
            if identity is None:
                _fail("gc --claim needs this Airflow's metadata database ([database] sql_alchemy_conn)")
            try:
                claim_store(root, identity)
            except StoreNotOwnedError as exc:
                _fail(f"gc --claim refused, nothing written or deleted: {exc}")
        problem = mismatch(read_store_identity(root), identity) if store_present(root) else None
    except SpeculativeError as exc:
        _fail(str(exc))
    if problem:
        # Its DagRun table says nothing about this store's runs: every run would look deleted.
        _fail(f"gc deletes nothing in store {shown_root(root)}: {problem}")
    adopted: list[str] = []
    if getattr(args, "claim", False):
        try:
            # Runs an older version planned (no _owner.json) become gc's once a plan of this provider names them.
            adopted = adopt_runs(root, dag_id=args.dag_id)
        except SpeculativeError as exc:
            _fail(f"gc --claim could not claim the store's runs: {exc}")
    dag_ids = sorted(set(store_dag_ids(root).values()))
    if args.dag_id is not None:
        dag_ids = [d for d in dag_ids if d == args.dag_id]
    facts = _db_facts(dag_ids)
    kept: list[str] = []
    items = plan_gc(root, now=time.time(), run_states=facts.run_states, retention=retention, dag_id=args.dag_id,
                    deleted_runs=facts.deleted_runs, known_dags=facts.known_dags, deleted_dags=facts.deleted_dags,
                    older_than=older_than, sink_staging=list_sink_staging, kept=kept)
    summary = None if args.dry_run else execute_gc(items, root=root)
    shown = shown_root(root)
    document = {"store": shown, "dry_run": bool(args.dry_run), "items": [i.to_json() for i in items],
                "bytes": sum(i.bytes for i in items), "summary": summary, "kept": kept, "claimed": adopted}
    emit(args.output, rows=gc_rows(shown, items), document=document, header=[f"store {shown}"],
         footer=[*gc_footer(items, bool(args.dry_run), summary), *(f"kept: {reason}" for reason in kept),
                 *(f"claimed: run {run} (a plan of this provider names it)" for run in adopted)])
    if summary and summary["errors"]:
        sys.exit(1)


def format_rerun(result: dict[str, Any]) -> str:
    """The rerun's region in two parts (the named subtasks, their downstream consumers) and what was cleared."""
    def parts(region: dict[str, list[int]]) -> list[str]:
        return [f"    stage {stage}: subtasks {', '.join(map(str, subs))}" for stage, subs in region.items()]

    lines = [f"{'Would rerun' if result['dry_run'] else 'Rerunning'} in DAG {result['dag_id']} run {result['run_id']}:",
             "  named:", *parts(result["requested"]),
             "  downstream (consumers of the named subtasks, transitively):",
             *(parts(result["downstream"]) or ["    (none: --no-downstream)" if result["no_downstream"]
                                               else "    (none)"])]
    if result.get("in_flight"):
        lines += ["  running consumers of hybrid exchanges that read a rerun partition (they restart with it):",
                  *parts(result["in_flight"])]
    if not result["dry_run"]:
        cleared = result["cleared_tasks"]
        lines.append(f"Cleared tasks: {', '.join(cleared) or '(none found)'}")
        missing = [s for s in result["region"] if s not in result.get("stage_tasks", {})]
        if missing:
            lines.append(f"No task instance in the run for stages: {', '.join(missing)}")
    return "\n".join(lines)


def _os_user() -> str | None:
    """The operating-system user running the CLI, for Airflow's audit log (None when it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and no passwd entry, as in some containers
        return None


def rerun(args: Any) -> None:
    """CLI entry: print the affected region, invalidate exactly it and clear its stage tasks."""
    from airflow_provider_speculative.control.rerun import request_rerun
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import configured_store

    try:
        result = request_rerun(configured_store(), args.dag_id, args.run_id, args.stage, args.subtask,
                               downstream=not getattr(args, "no_downstream", False), dry_run=bool(args.dry_run),
                               by=f"airflow speculative rerun --stage {args.stage}", owner=_os_user())
    except (SpeculativeError, OSError, ValueError) as exc:  # unknown run/stage/subtask, corrupt plan.json
        _fail(str(exc))
    if args.output in ("json", "yaml"):
        emit(args.output, rows=[], document=result)
        return
    print(format_rerun(result))


def parse_sets(values: list[str] | None) -> dict[str, str]:
    """``--set key=value`` arguments as a dict; a value without ``=`` fails naming it."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--set {item!r}: expected KEY=VALUE, e.g. --set baseline_multiplier=2")
        out[key.strip()] = value.strip()
    return out


def whatif_rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """Recorded, replayed (the run's settings) and what-if (with --set) figures side by side."""
    rows = []
    for label, key in (("recorded", "recorded"), ("replayed (own settings)", "replayed"), ("what-if", "whatif")):
        figures = result[key]
        rows.append({"run": label, "makespan": format_duration(figures["makespan"]),
                     "attempt-seconds": f"{figures['attempt_seconds']:.1f}",
                     "copies (won)": f"{figures['copies']} ({figures['copies_won']})",
                     "failed": figures["failed"] or ""})
    return rows


def whatif(args: Any) -> None:
    """CLI entry: replay a finished run in the simulator with ``--set`` overrides (devtools/simulator.py)."""
    from airflow_provider_speculative.control.readmodel import latest_run_id
    from airflow_provider_speculative.devtools.simulator import whatif as replay
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import configured_store

    overrides = parse_sets(args.overrides)
    root = configured_store()
    try:
        if not args.run_id:
            args.run_id = latest_run_id(root, args.dag_id)
            print(f"DAG {args.dag_id}: latest run in the store is {args.run_id}", file=sys.stderr)
        result = replay(root, args.dag_id, args.run_id, overrides)
    except (SpeculativeError, OSError) as exc:
        _fail(str(exc))
    header = [f"DAG {args.dag_id} run {args.run_id}: simulated from the store (stages one after the other)",
              "--set " + (", ".join(f"{k}={v}" for k, v in overrides.items()) or "(none)")]
    emit(args.output, rows=whatif_rows(result), document=result, header=header)
