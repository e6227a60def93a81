"""Where an attempt's time went, from what it and its launcher recorded (no I/O here).

Phases of one attempt, each in seconds (None where a record is missing, e.g. an attempt that never
wrote):

- ``queue``: its claim until its launcher started it (waiting for a slot, placement);
- ``start``: launch until its Spark session was ready (process start, session, JVM for spark-submit);
- ``app``: session ready until the application called ``ctx.write`` (its own Python, query planning
  and ``verify``, the check of producer files against their manifests);
- ``spark``: the write's Spark job: reading inputs, computing and writing the exchange or sink
  (Spark evaluates lazily, so these are one job and are not told apart);
- ``commit``: describing the written files (checksums, footers) and writing the manifest;
- ``exit``: the manifest until the launcher recorded the attempt's end (session close, process exit).

Across stages, the run's critical path is the chain of stages its end waited for (``critical_path``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PHASES = ("queue", "start", "app", "spark", "commit", "exit")


def _span(start: Any, end: Any) -> float | None:
    if not isinstance(start, int | float) or not isinstance(end, int | float):
        return None
    return max(0.0, float(end) - float(start))


def attempt_phases(created_at: float | None, deploying_at: float | None, end_at: float | None,
                   timings: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The phases of one attempt (see the module docstring) from its claim, status and manifest timings."""
    timings = timings or {}
    write_started = timings.get("write_started_at")
    write_s, manifest_s = timings.get("write_s"), timings.get("manifest_s")
    manifest_at: float | None = None
    if isinstance(write_started, int | float) and isinstance(write_s, int | float) \
            and isinstance(manifest_s, int | float):
        manifest_at = float(write_started) + float(write_s) + float(manifest_s)
    return {
        "queue": _span(created_at, deploying_at),
        "start": _span(deploying_at, timings.get("session_ready_at")),
        "app": _span(timings.get("session_ready_at"), write_started),
        "verify": float(timings["verify_s"]) if isinstance(timings.get("verify_s"), int | float) else None,
        "spark": float(write_s) if isinstance(write_s, int | float) else None,
        "commit": float(manifest_s) if isinstance(manifest_s, int | float) else None,
        "exit": _span(manifest_at, end_at),
    }


def stage_breakdown(phases: Iterable[Mapping[str, float | None]]) -> dict[str, float]:
    """Median seconds of each phase over the given attempts (phases no attempt recorded are left out)."""
    rows = list(phases)
    medians: dict[str, float] = {}
    for phase in (*PHASES, "verify"):
        values = [row[phase] for row in rows if row.get(phase) is not None]
        if values:
            medians[phase] = round(statistics.median(v for v in values if v is not None), 3)
    return medians


def breakdown_line(medians: Mapping[str, float], attempts: int) -> str | None:
    """One line for the status CLI: the median admitted attempt's phases, largest share first marked."""
    if not medians:
        return None
    parts = []
    for phase in PHASES:
        if phase in medians:
            extra = f" (verify {medians['verify']:.2f})" if phase == "app" and "verify" in medians else ""
            parts.append(f"{phase} {medians[phase]:.2f}{extra}")
    return f"time per admitted attempt (median of {attempts}, s): " + ", ".join(parts)


def stage_span(stage: Mapping[str, Any]) -> tuple[float, float] | None:
    """A stage report's first attempt start and its last admitted attempt's end (None until both exist).

    Reused subtasks (no attempt in this run) do not count; a stage with no admitted attempt has no span.
    """
    starts: list[float] = []
    ends: list[float] = []
    for sub in stage.get("subtasks") or []:
        for attempt in sub.get("attempts") or []:
            if isinstance(attempt.get("start"), int | float):
                starts.append(float(attempt["start"]))
            if attempt.get("admitted") and isinstance(attempt.get("end"), int | float):
                ends.append(float(attempt["end"]))
    if not starts or not ends:
        return None
    return min(starts), max(ends)


def critical_path(stages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chain of stages the run's end waited for, first stage first.

    From the stage that ended last, step to the upstream that ended last, until a stage has no upstream
    with a span: what made each stage start when it did. Each entry has the stage, its span in seconds
    and ``gap``: its first start minus that upstream's end (hand-over and scheduling; negative when it
    started before the upstream ended, as a hybrid consumer does; None for the first stage).
    """
    spans: dict[str, tuple[float, float]] = {}
    upstreams: dict[str, list[str]] = {}
    for stage in stages:
        span = stage_span(stage)
        if span is not None:
            spans[str(stage["stage"])] = span
            upstreams[str(stage["stage"])] = [str(u) for u in stage.get("upstreams") or []]
    if not spans:
        return []
    current = max(spans, key=lambda name: (spans[name][1], name))
    chain = [current]
    seen = {current}
    while True:
        before = [u for u in upstreams[current] if u in spans and u not in seen]
        if not before:
            break
        current = max(before, key=lambda name: (spans[name][1], name))
        chain.append(current)
        seen.add(current)
    chain.reverse()
    path: list[dict[str, Any]] = []
    for i, name in enumerate(chain):
        start, end = spans[name]
        gap = None if i == 0 else round(start - spans[chain[i - 1]][1], 3)
        path.append({"stage": name, "span": round(end - start, 3), "gap": gap, "start": start, "end": end})
    return path


def critical_path_line(path: Sequence[Mapping[str, Any]]) -> str | None:
    """One line for the status CLI: the critical path's stages and the gaps between them, in seconds."""
    if not path:
        return None
    parts = []
    for entry in path:
        if entry["gap"] is not None:
            parts.append(f"+{entry['gap']:.2f}" if entry["gap"] >= 0 else f"overlap {-entry['gap']:.2f}")
        parts.append(f"{entry['stage']} {entry['span']:.2f}")
    total = path[-1]["end"] - path[0]["start"]
    in_stages = sum(entry["span"] for entry in path)
    return (f"critical path (s): {' -> '.join(parts)}; {total:.2f} from its first attempt to its last end, "
            f"{in_stages:.2f} in stages")
