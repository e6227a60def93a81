"""The scheduler's messages: stimuli (what happened, past tense) and actions (what to do, imperative).

Plain frozen dataclasses, shared by the core (core/scheduler.py handles stimuli and returns actions)
and the controller (control/controller.py observes the world as stimuli and carries out actions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_provider_speculative.core.states import Attempt

# -- stimuli: what happened ---------------------------------------------------------------------


@dataclass(frozen=True)
class Restored:
    """The controller restarted and read these attempts, admissions and node blocks from the store."""

    attempts: tuple[Attempt, ...]
    admitted: dict[int, int]
    blocked: dict[str, float]


@dataclass(frozen=True)
class AttemptObserved:
    """A poll saw this attempt (the scheduler keeps a copy; the caller's object is never changed)."""

    attempt: Attempt


@dataclass(frozen=True)
class NodeBlocked:
    """Another stage of the run blocked ``node`` until ``until`` (read from the run's blocklist)."""

    node: str
    until: float


@dataclass(frozen=True)
class ClaimLost:
    """Launching failed to claim the number: another controller owns it; ``observed`` is its attempt."""

    observed: Attempt


@dataclass(frozen=True)
class LaunchFailed:
    """Starting attempt ``attempt`` of ``subtask`` failed at ``at`` (the backend raised ``cause``)."""

    subtask: int
    attempt: int
    cause: str
    at: float


@dataclass(frozen=True)
class AdmissionLost:
    """Admitting ``attempt`` lost the exclusive marker to ``winner`` (a concurrent controller)."""

    subtask: int
    attempt: int
    winner: int


@dataclass(frozen=True)
class InputRestored:
    """A lost upstream partition ``stage[subtask]`` was re-produced and re-committed."""

    stage: str
    subtask: int


@dataclass(frozen=True)
class RecoveryFailed:
    """Re-producing ``stage[subtask]`` failed beyond its limit."""

    stage: str
    subtask: int
    reason: str


@dataclass(frozen=True)
class TargetsObserved:
    """What the targets offer now (FLIP-159): free slots per target after every holder's claim, and losses.

    ``free``: slots this stage may claim now per target (a target absent or at 0 gets no launch).
    ``capacity``: each target's live capacity; when every target's is 0 the stage waits for a live slot.
    ``others``: slots of each target held by other stage runs; an attempt running there meanwhile is shared.
    ``lost_targets`` / ``lost_nodes``: target or node -> why it is gone (a server stopped answering, a
    worker left the master's alive list); live attempts there are cancelled and rerun elsewhere, and
    their failures do not count against the failure limits.
    """

    free: Mapping[str, int]
    capacity: Mapping[str, int]
    lost_targets: Mapping[str, str] = field(default_factory=dict)
    lost_nodes: Mapping[str, str] = field(default_factory=dict)
    # Slots of each target other stage runs hold now: this stage's attempts there share it (Attempt.shared).
    others: Mapping[str, int] = field(default_factory=dict)
    # Free slots of each target left to higher-priority stage runs of the DAG run (core/priority.py): not in
    # ``free``; only shown while the stage waits.
    yielded: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SlotLost:
    """Claiming a slot of ``target`` for a Launch lost the race to another holder: the attempt never started."""

    subtask: int
    attempt: int
    target: str


@dataclass(frozen=True)
class InputsAdmitted:
    """Hybrid input: producer ``stage`` admitted these subtasks (subtask -> attempt) since the last report.

    ``committed``: the producer stage committed (every partition is final); ``waiting``: producer
    subtasks with neither a live nor an admitted attempt (they would want a slot).
    """

    stage: str
    admitted: dict[int, int]
    committed: bool = False
    waiting: int = 0


@dataclass(frozen=True)
class InputWithdrawn:
    """Hybrid input: producer ``stage`` withdrew the admitted ``attempt`` of ``subtask`` (lost or invalidated)."""

    stage: str
    subtask: int
    attempt: int
    reason: str


@dataclass(frozen=True)
class InputFailed:
    """Hybrid input: the producer stage failed, was replanned or never planned; ``reason`` names it all."""

    stage: str
    reason: str


@dataclass(frozen=True)
class Tick:
    """Time passed: apply the observations handled so far and decide (admit, speculate, place...)."""

    now: float


Stimulus = (Restored | AttemptObserved | NodeBlocked | ClaimLost | LaunchFailed | AdmissionLost | InputRestored
            | RecoveryFailed | TargetsObserved | SlotLost | InputsAdmitted | InputWithdrawn | InputFailed | Tick)

# -- actions: what to do ------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """Start attempt ``attempt`` of ``subtask`` on ``target``."""

    subtask: int
    attempt: int
    target: str
    speculative: bool
    reason: str


@dataclass(frozen=True)
class Cancel:
    """Stop a live attempt (its driver must really stop) and discard its output."""

    subtask: int
    attempt: int
    reason: str


@dataclass(frozen=True)
class Admit:
    """Make this finished attempt the subtask's result; it is the only one that will be committed."""

    subtask: int
    attempt: int


@dataclass(frozen=True)
class Discard:
    """A finished attempt that lost the race: remove its output."""

    subtask: int
    attempt: int
    reason: str


@dataclass(frozen=True)
class BlockNode:
    """Stop placing new attempts on ``node`` until ``until`` (running attempts continue)."""

    node: str
    until: float
    reason: str


@dataclass(frozen=True)
class RecoverPartition:
    """FLIP-1 backtracking: re-produce ``subtask`` of upstream ``stage`` as a new attempt and re-commit it."""

    stage: str
    subtask: int
    reason: str
    lost_attempt: int | None = None


@dataclass(frozen=True)
class Invalidate:
    """Withdraw an admitted attempt (its input was re-produced by a non-deterministic stage): rerun it."""

    subtask: int
    attempt: int
    reason: str


@dataclass(frozen=True)
class FailStage:
    """The stage cannot finish: ``reason``, failure counts by cause and the first causes in full (bounded)."""

    reason: str
    causes: tuple[str, ...]
    failed_attempts: int = 0
    counts_by_cause: tuple[tuple[str, int], ...] = ()
    # (subtask, attempt) of each cause in ``causes``: where their logs are.
    failed_keys: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class CompleteStage:
    """Every subtask has an admitted attempt and no loser is still running: report the stage done."""

    admitted: dict[int, int]


Action = Launch | Cancel | Admit | Discard | BlockNode | RecoverPartition | Invalidate | FailStage | CompleteStage
