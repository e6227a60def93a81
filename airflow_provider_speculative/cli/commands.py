"""``airflow speculative status`` (stages -> subtasks -> attempts of a DAG run) and ``gc`` (store clean-up)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn


def _time(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S") if ts else "-"


def format_table(report: dict[str, Any]) -> str:
    """Render a run report as a plain-text table (one row per attempt)."""
    header = ("stage", "subtask", "attempt", "state", "target", "node", "start", "end", "exit", "flags")
    rows: list[tuple[str, ...]] = []
    lines = [f"DAG {report['dag_id']} run {report['run_id']}"]
    for stage in report["stages"]:
        lines.append(
            f"stage {stage['stage']}: parallelism {stage['parallelism']}, committed {stage['committed']}, "
            f"speculation {stage['speculation']}, numSlowExecutionVertices {stage['numSlowExecutionVertices']}, "
            f"numEffectiveSpeculativeExecutions {stage['numEffectiveSpeculativeExecutions']}"
            + (f", blocked nodes {stage['blocked_nodes']}" if stage["blocked_nodes"] else "")
            + (f", results expired (removed by gc at {_time(stage['expired']['at'])})" if stage.get("expired") else ""))
        for sub in stage["subtasks"]:
            if not sub["attempts"]:
                rows.append((stage["stage"], str(sub["subtask"]), "-", "REUSED" if sub["reused"] else "-",
                             "-", "-", "-", "-", "-", ""))
            for a in sub["attempts"]:
                flags = [f for f, on in (("admitted", a["admitted"]), ("current", a["attempt"] == sub["current"]),
                                         ("speculative", a["speculative"])) if on]
                rows.append((stage["stage"], str(sub["subtask"]), str(a["attempt"]), a["state"], a["target"] or "-",
                             a["node"] or "-", _time(a["start"]), _time(a["end"]),
                             "-" if a["exit_code"] is None else str(a["exit_code"]), ",".join(flags)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def status(args: Any) -> None:
    """CLI entry: print the attempts table or JSON for ``--dag-id``/``--run-id``."""
    from airflow_provider_speculative.control.readmodel import run_report
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import airflow_config, store_root

    try:
        report = run_report(store_root(airflow_config()), args.dag_id, args.run_id, args.stage)
    except (SpeculativeError, OSError) as exc:  # unknown run or stage, corrupt plan.json, unreadable store
        _fail(str(exc))
    if args.output == "json":
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_table(report))


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
    facts.deleted_runs = {(d, r) for event, d, r in logged if event == "delete_dag_run" and r}
    # A DAG deleted and later re-added is known again: its runs then need their own deletion record.
    facts.deleted_dags = {d for event, d, _ in logged if event == "delete_dag"} - facts.known_dags
    return facts


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def format_gc_table(root: str, items: list[Any], dry_run: bool, summary: dict[str, Any] | None) -> str:
    """Render gc's plan (or what it removed) as a plain-text table, one row per path."""
    header = ("reason", "bytes", "path", "why")
    rows = [(i.reason, str(i.bytes), i.display(root), i.detail) for i in items]
    widths = [max(len(h), *(len(r[c]) for r in rows)) if rows else len(h) for c, h in enumerate(header)]
    lines = [f"store {root}"]
    if rows:
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    total = sum(i.bytes for i in items)
    if dry_run:
        lines.append(f"dry run: would remove {len(items)} paths, {_size(total)} ({total} bytes)")
    else:
        assert summary is not None
        lines.append(f"removed {summary['removed']} paths, {_size(summary['bytes'])} ({summary['bytes']} bytes)")
        lines += [f"error: {e['path']}: {e['error']}" for e in summary["errors"]]
    return "\n".join(lines)


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit status 1: user errors get no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def gc(args: Any) -> None:
    """CLI entry: remove (or with ``--dry-run`` list) what the store no longer needs."""
    import time

    from airflow_provider_speculative.control.lifecycle import execute_gc, list_sink_staging, plan_gc, store_dag_ids
    from airflow_provider_speculative.core.config import parse_option
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import airflow_config, metadata_db_identity, store_root
    from airflow_provider_speculative.store.identity import claim_store, mismatch, read_store_identity

    try:
        retention = None if args.retention is None else parse_option("retention", args.retention, "--retention")
        older = getattr(args, "older_than", None)
        older_than = None if older is None else parse_option("retention", older, "--older-than")
        root = store_root(airflow_config())
        identity = metadata_db_identity()
        if getattr(args, "claim", False) and identity is not None:
            claim_store(root, identity)
        problem = mismatch(read_store_identity(root), identity) if root.is_dir() else None
    except SpeculativeError as exc:
        _fail(str(exc))
    if problem:
        # Its DagRun table says nothing about this store's runs: every run would look deleted.
        _fail(f"gc deletes nothing in store {root}: {problem}")
    dag_ids = sorted(set(store_dag_ids(root).values()))
    if args.dag_id is not None:
        dag_ids = [d for d in dag_ids if d == args.dag_id]
    facts = _db_facts(dag_ids)
    kept: list[str] = []
    items = plan_gc(root, now=time.time(), run_states=facts.run_states, retention=retention, dag_id=args.dag_id,
                    deleted_runs=facts.deleted_runs, known_dags=facts.known_dags, deleted_dags=facts.deleted_dags,
                    older_than=older_than, sink_staging=list_sink_staging, kept=kept)
    summary = None if args.dry_run else execute_gc(items)
    if args.output == "json":
        print(json.dumps({"store": str(root), "dry_run": bool(args.dry_run), "items": [i.to_json() for i in items],
                          "bytes": sum(i.bytes for i in items), "summary": summary, "kept": kept},
                         indent=2, default=str))
    else:
        print(format_gc_table(str(root), items, bool(args.dry_run), summary))
        for reason in kept:
            print(f"kept: {reason}")
    if summary and summary["errors"]:
        sys.exit(1)


def rerun(args: Any) -> None:
    """CLI entry: print the affected region, invalidate exactly it and clear its stage tasks."""
    from airflow_provider_speculative.control.rerun import invalidate_region, plan_rerun
    from airflow_provider_speculative.exceptions import SpeculativeError
    from airflow_provider_speculative.settings import airflow_config, store_root

    try:
        root = store_root(airflow_config())
        region = plan_rerun(root, args.dag_id, args.run_id, args.stage, args.subtask)
    except (SpeculativeError, OSError, ValueError) as exc:  # unknown run/stage/subtask, corrupt plan.json
        _fail(str(exc))
    affected = {stage: sorted(subtasks) for stage, subtasks in region.subtasks.items()}
    result: dict[str, Any] = {"dag_id": args.dag_id, "run_id": args.run_id, "region": affected,
                              "dry_run": bool(args.dry_run)}
    if not args.dry_run:
        result["invalidated"] = invalidate_region(root, args.dag_id, args.run_id, region,
                                                  f"airflow speculative rerun --stage {args.stage}")
        result["cleared_tasks"] = _clear_tasks(args.dag_id, args.run_id, sorted(affected))
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return
    print(f"{'Would rerun' if args.dry_run else 'Rerunning'} in DAG {args.dag_id} run {args.run_id}:")
    for stage, subtasks in affected.items():
        print(f"  stage {stage}: subtasks {', '.join(map(str, subtasks))}")
    if not args.dry_run:
        print(f"Cleared tasks: {', '.join(result['cleared_tasks']) or '(none found)'}")


def _clear_tasks(dag_id: str, run_id: str, task_ids: list[str]) -> list[str]:
    """Clear the stage tasks of the run so the scheduler runs exactly them again."""
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = list(session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id.in_(task_ids))))
        clear_task_instances(tis, session)
        return sorted(ti.task_id for ti in tis)
