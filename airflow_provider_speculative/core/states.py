"""Attempt states, the FLIP-168 state priority and the attempt record the core reasons about."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class AttemptState(StrEnum):
    """Life cycle of one attempt (one Spark submission of one subtask)."""

    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


class TaskState(StrEnum):
    """The stage task's own state in ``task.json`` (store/task_state.py), which hybrid consumers go by."""

    PLANNING = "planning"
    # Waiting for producers: their commits (in the triggerer) or a reschedule until they committed.
    WAITING = "waiting"
    DEFERRED = "deferred"
    SKIPPED = "skipped"
    FAILED = "failed"
    # Stopped from outside (marked success or failed, cleared, its DAG run deleted): the trigger cannot
    # tell which, and either way this try will not commit.
    KILLED = "killed"
    COMMITTED = "committed"


class HeartbeatPhase(StrEnum):
    """What a running attempt says it is doing, in its ``heartbeat.json`` (runtime/heartbeat.py)."""

    RUNNING = "RUNNING"
    # Blocked inside ``ctx.read`` until a hybrid producer's partition is admitted.
    WAITING_FOR_INPUT = "WAITING_FOR_INPUT"
    # Held by fault injection before its manifest (tests only).
    BARRIER = "BARRIER"
    FINISHED = "FINISHED"
    FAILED = "FAILED"


# Phases of an attempt process that is alive and working: its supervisor keeps waiting for it.
LIVE_PHASES = frozenset({HeartbeatPhase.RUNNING, HeartbeatPhase.BARRIER, HeartbeatPhase.WAITING_FOR_INPUT})


# Task states after which this try of the producer will not commit: hybrid consumers fail, not wait.
NO_COMMIT_TASK_STATES = frozenset({TaskState.FAILED, TaskState.KILLED})


# FLIP-168: a state ranks higher the more likely it is to end in FINISHED.
STATE_PRIORITY: tuple[AttemptState, ...] = (
    AttemptState.FINISHED,
    AttemptState.RUNNING,
    AttemptState.INITIALIZING,
    AttemptState.DEPLOYING,
    AttemptState.SCHEDULED,
    AttemptState.CREATED,
    AttemptState.CANCELING,
    AttemptState.FAILED,
    AttemptState.CANCELED,
)
_RANK = {state: rank for rank, state in enumerate(STATE_PRIORITY)}

POSSIBLE_TO_FINISH = frozenset(
    {
        AttemptState.CREATED,
        AttemptState.SCHEDULED,
        AttemptState.DEPLOYING,
        AttemptState.INITIALIZING,
        AttemptState.RUNNING,
        AttemptState.FINISHED,
    }
)
LIVE = frozenset(
    {
        AttemptState.CREATED,
        AttemptState.SCHEDULED,
        AttemptState.DEPLOYING,
        AttemptState.INITIALIZING,
        AttemptState.RUNNING,
        AttemptState.CANCELING,
    }
)
TERMINAL = frozenset({AttemptState.FINISHED, AttemptState.FAILED, AttemptState.CANCELED})
# Airflow's DagRun states after which nothing of the run writes any more (Airflow's own names).
FINISHED_RUN_STATES = frozenset({"success", "failed"})
# Execution time counts from DEPLOYING; states before it have no execution time yet.
EXECUTING = frozenset({AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING})


def state_rank(state: AttemptState) -> int:
    """Return the FLIP-168 rank of a state (0 is the highest priority)."""
    return _RANK[state]


@dataclass
class Attempt:
    """What the core knows about one attempt; timestamps are seconds on the controller clock."""

    subtask: int
    number: int
    target: str
    state: AttemptState = AttemptState.CREATED
    speculative: bool = False
    node: str | None = None
    created_at: float | None = None
    deploying_at: float | None = None
    end_at: float | None = None
    exit_code: int | None = None
    cause: str | None = None
    input_bytes: int | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    # For a failure caused by an input partition: {"kind": "partition", "stage": producer, "subtask": p}.
    failure: dict[str, Any] | None = None
    # The Spark application the attempt's work ran in (its own driver, or the Connect server's).
    app_id: str | None = None
    # Launch requested, and the attempt's Spark session ready: startup_seconds is the difference.
    launched_at: float | None = None
    ready_at: float | None = None
    # Hybrid inputs: seconds spent waiting for producer partitions (finished waits), and the start of
    # the wait going on now. Waiting is not work: execution time leaves it out (no speculative copy
    # of an attempt that only waits for its producers, and no inflated baseline).
    input_wait: float = 0.0
    waiting_since: float | None = None
    # Attempts of other stages or DAG runs held slots of the target while this one ran: its time tells how
    # busy the target was, not how fast it is, so speed-aware placement does not time it (core/speed.py).
    shared: bool = False

    @property
    def startup_seconds(self) -> float | None:
        """Seconds from launch to a ready Spark session (JVM start for spark-submit, ~2 s on Connect)."""
        if self.launched_at is None or self.ready_at is None:
            return None
        return max(0.0, self.ready_at - self.launched_at)

    @property
    def lost_partition(self) -> tuple[str, int] | None:
        """The (producer stage, producer subtask) whose partition this attempt found missing or corrupt."""
        f = self.failure or {}
        if f.get("kind") == "partition" and f.get("stage") is not None and f.get("subtask") is not None:
            return (str(f["stage"]), int(f["subtask"]))
        return None

    @property
    def lost_node(self) -> str | None:
        """The node whose executors were all lost while this attempt ran (runtime watchdog), if that failed it."""
        f = self.failure or {}
        if f.get("kind") == "node_lost":
            return str(f.get("node") or self.node or "") or None
        return None

    @property
    def live(self) -> bool:
        """True while the attempt holds a slot on its target."""
        return self.state in LIVE

    @property
    def possible_to_finish(self) -> bool:
        """True if the attempt is finished or may still finish (FLIP-168 definition)."""
        return self.state in POSSIBLE_TO_FINISH

    def execution_time(self, now: float) -> float:
        """Seconds since DEPLOYING, up to the end or now, less time waiting for hybrid input; 0 before DEPLOYING."""
        if self.deploying_at is None:
            return 0.0
        if self.state == AttemptState.FINISHED and self.end_at is not None:
            end = self.end_at
        elif self.state in EXECUTING:
            end = now
        else:
            return 0.0
        waited = self.input_wait + (max(0.0, end - self.waiting_since) if self.waiting_since is not None else 0.0)
        return max(0.0, end - self.deploying_at - waited)


def current_attempt(attempts: list[Attempt]) -> Attempt | None:
    """Pick the attempt that best represents a subtask: highest state priority, earliest created."""
    if not attempts:
        return None
    return min(attempts, key=lambda a: (state_rank(a.state), a.number))


# -- liveness from the store's timestamps alone (the UI's reader) ------------------------------------

# Six missed supervisor refreshes (5 s) or fifteen missed heartbeats (2 s): long enough for a loaded
# machine's GC pause or a slow shared file system, short enough for a user watching the page.
HEARTBEAT_STALE_AFTER = 30.0


def last_sign_of_life(status: dict[str, Any], heartbeat: dict[str, Any]) -> float | None:
    """The newest time the attempt was seen alive: heartbeat ``at``, supervisor ``alive_at`` or its start."""
    seen = [float(v) for v in (heartbeat.get("at"), status.get("alive_at"), status.get("deploying_at")) if v]
    return max(seen) if seen else None


def heartbeat_alive(status: dict[str, Any], heartbeat: dict[str, Any], now: float,
                    stale_after: float = HEARTBEAT_STALE_AFTER) -> bool:
    """Whether an attempt that has not ended is alive, judged by the age of its last sign of life only."""
    seen = last_sign_of_life(status, heartbeat)
    return seen is not None and now - seen < stale_after
