"""``airflow speculative status``: stages -> subtasks -> attempts of a DAG run."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any


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
            + (f", blocked nodes {stage['blocked_nodes']}" if stage["blocked_nodes"] else ""))
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
    from airflow_provider_speculative.backends.report import run_report
    from airflow_provider_speculative.settings import airflow_config, store_root

    try:
        report = run_report(store_root(airflow_config()), args.dag_id, args.run_id, args.stage)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    if args.output == "json":
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_table(report))
