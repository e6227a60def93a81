"""The type of a stage run's ``summary.json``: what its controller reports to the UI, the CLI, metrics and finalize.

Built by ``control/summary.py``; read back from the store (``summary.json``, and ``committed.json``'s
``summary``) by readers that must accept summaries of other provider versions, so every key is optional
to a reader (``total=False``) and read with ``.get``. The keys and their meaning never change.
"""

from __future__ import annotations

from typing import Any, TypedDict


class TargetSpeed(TypedDict):
    """A target's slowness for speed-aware placement, and where it came from (core/speed.py)."""

    slowness: float
    source: str


class HybridProducer(TypedDict):
    """A hybrid input's producer: its admitted subtasks, its parallelism and whether it committed."""

    admitted: int
    parallelism: int
    committed: bool


class StageSummary(TypedDict, total=False):
    """Metrics and speculation status of one stage run (the Flink metric names kept as they are)."""

    stage: str
    parallelism: int
    speculation: str
    numSlowExecutionVertices: int
    peakSlowExecutionVertices: int
    numEffectiveSpeculativeExecutions: int
    baseline_seconds: float | None
    baseline_seconds_per_byte: float | None
    # Where the baseline came from (run: N·R finished; early: fewer) and its lower bound's origin.
    baseline_source: str | None
    baseline_floor_seconds: float | None
    baseline_floor_source: str | None
    # Blocked node -> the time its block ends.
    blocked_nodes: dict[str, float]
    # Subtask (as a string: JSON keys) -> its admitted attempt.
    admitted: dict[str, int]
    reused: list[int]
    attempts: int
    speculative_attempts: int
    attempt_seconds: float
    # Subtask -> the attempt that best represents it (FLIP-168 priority), None without one.
    current: dict[str, int | None]
    # Target -> core/slots.py TargetView.to_json().
    slots: dict[str, dict[str, Any]]
    slot_status: str | None
    # Lost node -> why.
    lost_nodes: dict[str, str]
    target_lost_attempts: int
    target_speeds: dict[str, TargetSpeed]
    held_subtasks: int
    updated_at: float
    # Only for a stage with hybrid inputs: per producer stage, and what waiting subtasks wait for.
    hybrid_inputs: dict[str, HybridProducer]
    waiting_for_inputs: int
    input_waits: dict[str, str | None]
