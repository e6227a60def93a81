"""The stage scheduler: typed stimuli in, instructions out, through one entry point.

It is dask's ``WorkerState.handle_stimulus`` idea applied to FLIP-168: the controller polls
attempts and feeds what it saw, as stimuli, to :meth:`StageScheduler.handle`, then carries out
the returned actions. The scheduler is the only writer of its state (observations are copied,
never kept or mutated), it never does I/O, and every rule here is unit-tested with a fake clock.
Stimuli are named for what happened (past tense), actions for what to do (imperative).
Which waiting attempt gets which free slot is the placement policy's (core/placing.py), asked once per Tick.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

from airflow_provider_speculative.core.blocklist import Blocklist
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.detector import Baseline, BaselineView, SlowWatch
from airflow_provider_speculative.core.failover import InputReaders
from airflow_provider_speculative.core.faults import NO_FAULTS, FaultInjection
from airflow_provider_speculative.core.hybrid import (
    HybridEdge,
    consumer_slots,
    launchable,
    restarts_on_withdrawal,
    waiting_for,
)
from airflow_provider_speculative.core.messages import (
    Action,
    AdmissionLost,
    Admit,
    AttemptObserved,
    BlockNode,
    Cancel,
    ClaimLost,
    CompleteStage,
    Discard,
    FailStage,
    InputFailed,
    InputRestored,
    InputsAdmitted,
    InputWithdrawn,
    Invalidate,
    LaunchFailed,
    NodeBlocked,
    RecoverPartition,
    RecoveryFailed,
    Restored,
    SlotLost,
    Stimulus,
    TargetsObserved,
    Tick,
)

# Placement (core/placing.py) makes the launches; callers import every action from here.
from airflow_provider_speculative.core.messages import Launch as Launch
from airflow_provider_speculative.core.placing import HoldInputs, Placement, Queue
from airflow_provider_speculative.core.speed import Speeds, SpeedView, median_size
from airflow_provider_speculative.core.states import LIVE, TERMINAL, Attempt, AttemptState, current_attempt

# A failure storm reports this many causes in full, the rest as counts (the journal stays small).
MAX_CAUSES = 20


@dataclass
class _Batch:
    """What one :meth:`StageScheduler.handle` call collects: actions, and observations awaiting their Tick."""

    actions: list[Action] = field(default_factory=list)
    observed: list[Attempt] = field(default_factory=list)


@dataclass
class _Bookkeeping:
    """What only the scheduler reads and writes between steps: work left for the next Tick, and change marks."""

    # Applied at the next Tick: withdrawn hybrid inputs, finished attempts restored unadmitted, and lost
    # inputs to backtrack again after a restart.
    withdrawn: list[InputWithdrawn] = field(default_factory=list)
    unadmitted_finished: list[Attempt] = field(default_factory=list)
    pending_backtrack: list[Attempt] = field(default_factory=list)
    # Failed attempts of the stage run that were their own fault, so stage_failures() is O(1).
    failed_count: int = 0
    # Subtasks whose attempts changed since the last placement: placement and the views look only at these,
    # so a quiet tick costs O(changes), not O(subtasks).
    dirty: set[int] = field(default_factory=set)
    check_stragglers: bool = True
    # Admissions change the baseline: it is computed again only when this version moved.
    admit_version: int = 0
    baseline_version: int = -1
    # A TargetsObserved reported a target or node not lost before: every live attempt is checked once.
    new_loss: bool = False
    # Subtask -> the siblings its admission in this Tick cancelled, with their states before: an admission's
    # outcome is fed back before the next Tick, and a lost one gives the other controller's winner its state back.
    cancelled_by_admission: dict[int, dict[int, AttemptState]] = field(default_factory=dict)
    # Set by the scheduler this belongs to: a second one given it (dataclasses.replace) refuses it.
    owned: bool = field(default=False, repr=False, compare=False)


@dataclass
class _Caches:
    """What the baseline, the slow judgement, the speed observation and the target look-up keep between steps.

    Each view is told the subtasks whose attempts changed (the dirty marks placement gets), so a step costs
    O(changes), not O(attempts). Dropping them all changes no decision, only its cost.
    """

    baseline_view: BaselineView | None = None
    baseline_pending: set[int] = field(default_factory=set)
    slow_watch: SlowWatch | None = None
    watch_pending: set[int] = field(default_factory=set)
    speed_view: SpeedView | None = None
    speed_pending: set[int] = field(default_factory=set)
    median_of: tuple[Mapping[int, int], float | None] | None = None
    # The speeds the speed view last answered (a round whose speeds are these may read its execution times).
    viewed: Speeds | None = None
    positions: dict[str, int] = field(default_factory=dict)
    positions_of: tuple[Target, ...] | None = None


@dataclass
class StageScheduler:
    """State machine for one stage run: attempts, admissions, blocklist, speculation and failures.

    Its fields come in four groups. Inputs, fixed for the stage run (``parallelism`` to ``history_source``),
    are the constructor's keywords. State is what the controller, the status pages and the tests read
    (``attempts`` to ``speeds``); it has defaults, so a restarted controller feeds ``Restored`` instead.
    ``_book`` (:class:`_Bookkeeping`) and ``_queue`` (core/placing.py: Queue) are state only the scheduler
    and its placement touch, and ``_caches`` (:class:`_Caches`) keeps incremental views, never decisions.
    Placement (core/placing.py) is the ``placement_type`` policy object, called once per step.
    """

    # -- inputs, fixed for the stage run -------------------------------------------------------------
    parallelism: int
    config: SpeculativeConfig
    input_bytes: dict[int, int] = field(default_factory=dict)
    # Why this stage may not be speculated (e.g. a sink without SupportsConcurrentExecutionAttempts).
    speculation_blocker: str | None = None
    # Subtasks whose valid committed result is reused; they never get an attempt.
    reused: frozenset[int] = frozenset()
    # (producer stage, producer subtask) -> consumer subtasks of this stage that read its partition.
    input_readers: Mapping[tuple[str, int], frozenset[int]] | InputReaders = field(default_factory=dict)
    # Producer stage -> (parallelism, deterministic), for the failover region.
    upstreams: dict[str, tuple[int, bool]] = field(default_factory=dict)
    # Hybrid inputs (FLIP-235) by input name; empty for a stage whose exchanges are all blocking.
    hybrid: dict[str, HybridEdge] = field(default_factory=dict)
    # The fault hook's answer for this stage (core/faults.py): none in production.
    faults: FaultInjection = NO_FAULTS
    # How the stage is named in a FailStage reason (pipeline and stage, set by the controller).
    label: str = "this stage"
    # Slowness of targets in earlier stage runs on this store (core/speed.py), for the first wave.
    target_history: dict[str, float] = field(default_factory=dict)
    # Targets this stage run may send one probe original to although history calls them slow (the
    # controller claimed the DAG run's one probe of each in the store: store/speeds.py claim_probe).
    probe_targets: frozenset[str] = frozenset()
    # Where a target_history value came from when it is not an earlier run ("speed check").
    history_source: dict[str, str] = field(default_factory=dict)

    # -- state, read from outside ----------------------------------------------------------------------
    attempts: dict[int, dict[int, Attempt]] = field(default_factory=dict)
    admitted: dict[int, int] = field(default_factory=dict)
    blocklist: Blocklist = field(default_factory=Blocklist)
    baseline: Baseline | None = None
    slow_subtasks: frozenset[int] = frozenset()
    # Subtask -> why it was last judged slow (which rule, what it measured): shown with its copy.
    slow_reasons: dict[int, str] = field(default_factory=dict)
    peak_slow: int = 0
    failed: FailStage | None = None
    completed: bool = False
    # Subtask -> lost input partitions it waits for before it may run again.
    waiting: dict[int, set[tuple[str, int]]] = field(default_factory=dict)
    recovering: set[tuple[str, int]] = field(default_factory=set)
    # Hybrid inputs: producer stage -> its admitted subtasks (subtask -> attempt), whether it committed,
    # and how many of its subtasks still wait for a slot (FLIP-235's resource fallback).
    input_admitted: dict[str, dict[int, int]] = field(default_factory=dict)
    input_committed: dict[str, bool] = field(default_factory=dict)
    producers_waiting: dict[str, int] = field(default_factory=dict)
    # Subtasks that want an attempt but whose hybrid inputs are not admitted yet.
    input_blocked: set[int] = field(default_factory=set)
    # FLIP-159: the last TargetsObserved (None: never observed, fixed per-stage slots).
    free_slots: dict[str, int] | None = None
    capacity: dict[str, int] = field(default_factory=dict)
    lost_targets: dict[str, str] = field(default_factory=dict)
    lost_nodes: dict[str, str] = field(default_factory=dict)
    # Slots of each target other stage runs held at the last TargetsObserved (only targets with some).
    others: dict[str, int] = field(default_factory=dict)
    # Free slots of each target this stage left to higher-priority stage runs at the last TargetsObserved.
    yielded: dict[str, int] = field(default_factory=dict)
    # Attempts that failed or were cancelled because their target or node was lost: not their fault.
    target_lost: set[tuple[int, int]] = field(default_factory=set)
    waiting_for_slot_since: float | None = None
    # Subtask -> (since, why) while its original is held back for a faster target's slot (not a slot held);
    # only queued subtasks have an entry.
    held_back: dict[int, tuple[float, str]] = field(default_factory=dict)
    speeds: Speeds | None = None

    # -- state only the scheduler and its placement touch, caches, and the placement policy -----------
    _book: _Bookkeeping = field(default_factory=_Bookkeeping)
    # The subtasks waiting for an original attempt.
    _queue: Queue = field(default_factory=Queue, repr=False)
    _caches: _Caches = field(default_factory=_Caches, init=False, repr=False, compare=False)
    _placement: Placement = field(init=False, repr=False, compare=False)
    # A subclass may bring its own placement policy (the simulator's rules do).
    placement_type: ClassVar[type[Placement]] = Placement

    def __post_init__(self) -> None:
        # dataclasses.replace passes every init field on, so the copy would share _book and _queue (and the
        # state dicts) with this one: two writers of one state. Nothing needs a copy, so it is refused; a
        # copy.deepcopy copies everything, the groups included.
        if self._book.owned:
            raise TypeError(f"{type(self).__name__}: its bookkeeping belongs to another scheduler "
                            "(dataclasses.replace would share it); build a new one and feed it Restored")
        self._book.owned = True
        for subtask in range(self.parallelism):
            self.attempts.setdefault(subtask, {})
        self._book.dirty = set(range(self.parallelism))
        self._placement = self.placement_type(self)

    def __copy__(self) -> StageScheduler:
        raise TypeError(f"{type(self).__name__}: a shallow copy would share its state and bookkeeping with this "
                        "scheduler; use copy.deepcopy, or build a new one and feed it Restored")

    # -- read-only views -------------------------------------------------------------------

    @property
    def targets(self) -> tuple[Target, ...]:
        """The targets attempts may be placed on."""
        return self.config.targets

    @property
    def speculation_enabled(self) -> bool:
        """True if slow subtasks get speculative attempts in this stage."""
        return self.config.enabled and self.speculation_blocker is None

    @property
    def speculation_status(self) -> str:
        """One line saying whether speculation is on and, if off, why."""
        if not self.config.enabled:
            return "off: disabled by configuration ([speculative] enabled = false)"
        if self.speculation_blocker:
            return f"off: {self.speculation_blocker}"
        return "on"

    def live_attempts(self) -> list[Attempt]:
        """Attempts not yet FINISHED, FAILED or CANCELED (those can still change)."""
        return [a for per in self.attempts.values() for a in per.values() if a.state not in TERMINAL]

    def all_attempts(self) -> list[Attempt]:
        """Every attempt of every subtask."""
        return [a for per in self.attempts.values() for a in per.values()]

    def current(self, subtask: int) -> Attempt | None:
        """The FLIP-168 current attempt of ``subtask``."""
        return current_attempt(list(self.attempts[subtask].values()))

    def failures(self, subtask: int) -> int:
        """Failed attempts of ``subtask`` so far, not counting lost inputs or lost targets (not its fault)."""
        return sum(a.state == AttemptState.FAILED and a.lost_partition is None
                   and (a.subtask, a.number) not in self.target_lost for a in self.attempts[subtask].values())

    def stage_failures(self) -> int:
        """Failed attempts of the whole stage run, except on a lost target or node (kept as a count: O(1))."""
        return self._book.failed_count

    def effective_speculative_executions(self) -> int:
        """numEffectiveSpeculativeExecutions: admitted attempts that were speculative copies."""
        return sum(self.attempts[s][n].speculative for s, n in self.admitted.items() if n in self.attempts[s])

    def input_wait(self, subtask: int) -> str | None:
        """What ``subtask`` waits for on its hybrid inputs, in words ("producer partitions 3/8 admitted")."""
        if not self.hybrid or subtask not in self.input_blocked:
            return None
        return waiting_for(self.hybrid, subtask, self.input_admitted, self.input_committed)

    @property
    def originals_waiting(self) -> int:
        """Subtasks that waited for a slot for an original attempt after the last Tick (O(1))."""
        return len(self._queue.wanting)

    @property
    def wants_slots(self) -> bool:
        """Whether the next Tick may launch: originals waiting or not decided yet, or copies possible (O(1)).

        With speculation on, any tick before every subtask is done may find a slow subtask and want a copy.
        """
        return bool(self._queue.wanting or self._book.dirty or self.slow_subtasks) or (
            self.speculation_enabled and len(self.admitted) + len(self.reused) < self.parallelism)

    def done_subtasks(self) -> set[int]:
        """Subtasks with an admitted or reused result."""
        return set(self.admitted) | set(self.reused)

    def revised(self, action: Action) -> Action | None:
        """``action``, returned by an earlier call, as it is to be carried out now; None if it must not be.

        A stimulus handled after it may overtake it: a lost admission makes another controller's attempt the
        subtask's result. A Cancel or Discard of that attempt queued behind the lost Admit would stop or delete
        the result the stage commits (the scheduler never cancels or discards an admitted attempt), and a
        CompleteStage decided with the lost admission names the winner instead.
        """
        if isinstance(action, Cancel | Discard) and self.admitted.get(action.subtask) == action.attempt:
            return None
        if (isinstance(action, CompleteStage) and action.admitted != self.admitted
                and action.admitted.keys() == self.admitted.keys()):
            return CompleteStage(admitted=dict(self.admitted))
        return action

    # -- the entry point ----------------------------------------------------------------------

    def handle(self, *stimuli: Stimulus) -> list[Action]:
        """Apply stimuli in order and return the instructions they lead to.

        Observations are applied at the next :class:`Tick` of the same call (which must come), so the
        first finisher among several seen in one poll is chosen by end time, not by list order.
        Each stimulus type has one handler (:meth:`_on`, dispatched on the type).
        """
        batch = _Batch()
        for stimulus in stimuli:
            self._on(stimulus, batch)
        if batch.observed:
            raise ValueError("StageScheduler.handle: AttemptObserved needs a Tick after it in the same call")
        return batch.actions

    @functools.singledispatchmethod
    def _on(self, stimulus: object, batch: _Batch) -> None:
        raise TypeError(f"StageScheduler.handle: unknown stimulus {stimulus!r}")

    @_on.register
    def _on_observed(self, stimulus: AttemptObserved, batch: _Batch) -> None:
        batch.observed.append(replace(stimulus.attempt, progress=dict(stimulus.attempt.progress)))

    @_on.register
    def _on_tick(self, stimulus: Tick, batch: _Batch) -> None:
        batch.actions += self._step(stimulus.now, batch.observed)
        batch.observed = []

    @_on.register
    def _on_restored(self, stimulus: Restored, batch: _Batch) -> None:
        self._restore(stimulus)

    @_on.register
    def _on_node_blocked(self, stimulus: NodeBlocked, batch: _Batch) -> None:
        self.blocklist.block(stimulus.node, stimulus.until)

    @_on.register
    def _on_claim_lost(self, stimulus: ClaimLost, batch: _Batch) -> None:
        adopted = replace(stimulus.observed)
        self.attempts.setdefault(adopted.subtask, {})[adopted.number] = adopted
        self._book.dirty.add(adopted.subtask)
        self._book.check_stragglers = True

    @_on.register
    def _on_launch_failed(self, stimulus: LaunchFailed, batch: _Batch) -> None:
        known = self.attempts.get(stimulus.subtask, {}).get(stimulus.attempt)
        if known is None:
            raise ValueError(f"LaunchFailed for unknown attempt {stimulus.subtask}/{stimulus.attempt}")
        # Applied with the next Tick, like any observation: the failure rules run there.
        batch.observed.append(replace(known, state=AttemptState.FAILED, end_at=stimulus.at,
                                      cause=f"launch failed: {stimulus.cause}"))

    @_on.register
    def _on_admission_lost(self, stimulus: AdmissionLost, batch: _Batch) -> None:
        batch.actions += self._admission_lost(stimulus)

    @_on.register
    def _on_input_restored(self, stimulus: InputRestored, batch: _Batch) -> None:
        batch.actions += self._input_restored(stimulus.stage, stimulus.subtask)

    @_on.register
    def _on_recovery_failed(self, stimulus: RecoveryFailed, batch: _Batch) -> None:
        batch.actions += self._recovery_failed(stimulus.stage, stimulus.subtask, stimulus.reason)

    @_on.register
    def _on_targets_observed(self, stimulus: TargetsObserved, batch: _Batch) -> None:
        batch.actions += self._targets_observed(stimulus)

    @_on.register
    def _on_slot_lost(self, stimulus: SlotLost, batch: _Batch) -> None:
        self._slot_lost(stimulus)

    @_on.register
    def _on_inputs_admitted(self, stimulus: InputsAdmitted, batch: _Batch) -> None:
        self._inputs_admitted(stimulus)

    @_on.register
    def _on_input_withdrawn(self, stimulus: InputWithdrawn, batch: _Batch) -> None:
        # Applied at the Tick, after the observations of the same call: the readers' latest
        # heartbeats (what they read) decide who restarts.
        known = self.input_admitted.get(stimulus.stage, {})
        if known.get(stimulus.subtask) == stimulus.attempt:
            del known[stimulus.subtask]
        self._book.withdrawn.append(stimulus)

    @_on.register
    def _on_input_failed(self, stimulus: InputFailed, batch: _Batch) -> None:
        if not (self.failed or self.completed):
            batch.actions += self._fail(stimulus.reason)

    # -- stimuli ----------------------------------------------------------------------------

    def _restore(self, restored: Restored) -> None:
        """Rebuild state from the store after a controller restart (no actions are produced)."""
        attempts = [replace(a) for a in restored.attempts]
        admitted, blocked = restored.admitted, restored.blocked
        for attempt in attempts:
            self.attempts.setdefault(attempt.subtask, {})[attempt.number] = attempt
            self._book.failed_count += attempt.state == AttemptState.FAILED
        self._book.dirty.update(self.attempts)
        self._book.check_stragglers = True
        self._book.admit_version += 1
        self.admitted.update(admitted)
        for node, until in blocked.items():
            self.blocklist.block(node, until)
        # The controller may have died between an attempt finishing and its admission.
        self._book.unadmitted_finished = [a for a in attempts if a.state == AttemptState.FINISHED
                                     and a.subtask not in self.admitted and a.subtask not in self.reused]
        # ... or while a lost input was being re-produced: backtrack again (recovery adopts its attempt).
        for subtask, per in self.attempts.items():
            if subtask in self.admitted or subtask in self.reused or not per:
                continue
            last = per[max(per)]
            if last.state == AttemptState.FAILED and last.lost_partition and not any(
                    a.possible_to_finish for a in per.values()):
                self._book.pending_backtrack.append(last)

    def _targets_observed(self, seen: TargetsObserved) -> list[Action]:
        """Record what the targets offer; a new loss is acted on at the Tick, after this call's observations."""
        self.free_slots = dict(seen.free)
        self.capacity = dict(seen.capacity)
        self.others = {name: n for name, n in seen.others.items() if n > 0}
        self.yielded = {name: n for name, n in seen.yielded.items() if n > 0}
        self._mark_shared(self.others)
        if any(t not in self.lost_targets for t in seen.lost_targets) or any(
                n not in self.lost_nodes for n in seen.lost_nodes):
            self._book.new_loss = True
        self.lost_targets, self.lost_nodes = dict(seen.lost_targets), dict(seen.lost_nodes)
        return []

    def _cancel_lost(self, attempts: Iterable[Attempt]) -> list[Action]:
        """Cancel live attempts whose target or node is lost: rerun elsewhere, not counted as failures."""
        actions: list[Action] = []
        for attempt in attempts:
            if not attempt.live or attempt.state == AttemptState.CANCELING:
                continue
            why = self._lost_cause(attempt, self.lost_targets, self.lost_nodes)
            if why:
                self.target_lost.add((attempt.subtask, attempt.number))
                self._book.dirty.add(attempt.subtask)
                actions += self._cancel_live([attempt], why)
        return actions

    @staticmethod
    def _lost_cause(attempt: Attempt, targets: Mapping[str, str], nodes: Mapping[str, str]) -> str | None:
        if attempt.target in targets:
            return f"target {attempt.target} lost: {targets[attempt.target]}"
        if attempt.node and attempt.node in nodes:
            return f"node {attempt.node} of target {attempt.target} lost: {nodes[attempt.node]}"
        return None

    def _slot_lost(self, lost: SlotLost) -> None:
        """The slot went to another holder between observation and claim: forget the attempt, retry later."""
        known = self.attempts.get(lost.subtask, {}).get(lost.attempt)
        if known is None or known.state != AttemptState.CREATED:
            raise ValueError(f"SlotLost for attempt {lost.subtask}/{lost.attempt} that is not a fresh launch")
        del self.attempts[lost.subtask][lost.attempt]
        if self.free_slots is not None:
            self.free_slots[lost.target] = 0
        self._queue.wanting.add(lost.subtask)
        self._book.dirty.add(lost.subtask)

    def _inputs_admitted(self, report: InputsAdmitted) -> None:
        """Producer partitions became available: consumers waiting on them are placed again."""
        self.input_admitted.setdefault(report.stage, {}).update(report.admitted)
        self.input_committed[report.stage] = report.committed
        self.producers_waiting[report.stage] = report.waiting
        edges = [e for e in self.hybrid.values() if e.upstream == report.stage]
        if report.committed or any(e.distribution == "all_to_all" for e in edges):
            woken = set(self.input_blocked)
        else:
            woken = {p for p in report.admitted if p in self.input_blocked}
        self.input_blocked -= woken
        self._book.dirty |= woken

    def _apply_withdrawn(self) -> list[Action]:
        """FLIP-1 with consumers in flight: restart exactly the live attempts that read a withdrawn partition."""
        actions: list[Action] = []
        pending, self._book.withdrawn = self._book.withdrawn, []
        for lost in pending:
            live = {(a.subtask, a.number): a.progress.get("reads") for a in self.live_attempts()
                    if a.state != AttemptState.CANCELING and self.admitted.get(a.subtask) != a.number}
            for subtask, number in restarts_on_withdrawal(live, lost.stage, lost.subtask, lost.attempt):
                attempt = self.attempts[subtask][number]
                attempt.state = AttemptState.CANCELING
                self._book.dirty.add(subtask)
                actions.append(Cancel(subtask, number, f"it read {lost.stage}[{lost.subtask}] attempt {lost.attempt}, "
                                                       f"which was withdrawn: {lost.reason}"))
            if not self.upstreams.get(lost.stage, (0, True))[1]:
                # A non-deterministic producer's new attempt may differ: finished readers rerun too.
                for reader in sorted(self.input_readers.get((lost.stage, lost.subtask), frozenset())):
                    if reader in self.admitted:
                        number = self.admitted.pop(reader)
                        self._book.admit_version += 1
                        self._book.dirty.add(reader)
                        actions.append(Invalidate(reader, number, f"input {lost.stage}[{lost.subtask}] was withdrawn "
                                                                  "and its stage is not deterministic"))
        return actions

    def _admission_lost(self, lost: AdmissionLost) -> list[Action]:
        """Another controller admitted ``lost.winner`` first: it is the result, ours is discarded.

        A Cancel of the winner that our admission led to is dropped (:meth:`revised`) and never carried out, so
        the winner keeps the state last observed; its end is observed like any live attempt's.
        """
        self.admitted[lost.subtask] = lost.winner
        winner = self.attempts.get(lost.subtask, {}).get(lost.winner)
        before = self._book.cancelled_by_admission.get(lost.subtask, {}).get(lost.winner)
        if winner is not None and before is not None and winner.state == AttemptState.CANCELING:
            winner.state = before
        self._book.admit_version += 1
        self._book.dirty.add(lost.subtask)
        self._book.check_stragglers = True
        return [Discard(lost.subtask, lost.attempt, f"attempt {lost.winner} was admitted by another controller")]

    def _input_restored(self, stage: str, subtask: int) -> list[Action]:
        """A lost upstream partition was re-produced and re-committed: waiting subtasks may run again.

        Subtasks that already finished from the old partition keep their result if the producer is
        deterministic; otherwise they are invalidated and rerun (FLIP-1).
        """
        key = (stage, subtask)
        self.recovering.discard(key)
        self._book.dirty.update(self.waiting)
        for waits in self.waiting.values():
            waits.discard(key)
        self.waiting = {s: w for s, w in self.waiting.items() if w}
        actions: list[Action] = []
        if not self.upstreams.get(stage, (0, True))[1]:
            for reader in sorted(self.input_readers.get(key, frozenset())):
                if reader in self.admitted:
                    number = self.admitted.pop(reader)
                    self._book.admit_version += 1
                    self._book.dirty.add(reader)
                    self.attempts[reader][number].state = AttemptState.CANCELED
                    self.attempts[reader][number].cause = f"input {stage}[{subtask}] re-produced (non-deterministic)"
                    actions.append(Invalidate(reader, number, f"input {stage}[{subtask}] was re-produced and "
                                                              f"{stage!r} is not deterministic"))
        return actions

    def _recovery_failed(self, stage: str, subtask: int, reason: str) -> list[Action]:
        """Re-producing a lost partition failed beyond its limit: the stage fails."""
        if self.failed or self.completed:
            return []
        return self._fail(f"could not re-produce lost partition {stage}[{subtask}]: {reason}")

    def _step(self, now: float, updates: list[Attempt]) -> list[Action]:
        """Apply attempt observations, then decide: admit, cancel, block, speculate, restart, finish."""
        if self.failed or self.completed:
            return []
        self._book.cancelled_by_admission.clear()
        actions: list[Action] = []
        if self._book.unadmitted_finished:
            pending, self._book.unadmitted_finished = self._book.unadmitted_finished, []
            for attempt in sorted(pending, key=lambda a: (a.end_at or now, a.number)):
                actions += self._on_finished(attempt)
        while self._book.pending_backtrack:
            actions += self._backtrack(self._book.pending_backtrack.pop(0))
        actions += self._apply(updates or [], now)
        if self._book.withdrawn:
            actions += self._apply_withdrawn()
        if self.failed:
            return actions
        if self._book.new_loss:
            # O(live attempts) once per new loss; otherwise only the attempts observed now are checked.
            self._book.new_loss = False
            actions += self._cancel_lost(self.live_attempts())
        elif self.lost_targets or self.lost_nodes:
            actions += self._cancel_lost([self.attempts[u.subtask][u.number] for u in updates])
        self.blocklist.expire(now)
        if self._book.check_stragglers:
            self._book.check_stragglers = False
            actions += self._cancel_stragglers()
        actions += self._detect_slow(now)
        actions += self._place(now)
        if (len(self.admitted) + len(self.reused) >= self.parallelism and len(self.done_subtasks()) == self.parallelism
                and not any(a.live for a in self.all_attempts())):
            self.completed = True
            actions.append(CompleteStage(admitted=dict(self.admitted)))
        return actions

    # -- rules ------------------------------------------------------------------------------

    def _apply(self, updates: list[Attempt], now: float) -> list[Action]:
        actions: list[Action] = []
        newly_finished: list[Attempt] = []
        newly_failed: list[Attempt] = []
        for update in updates:
            known = self.attempts.setdefault(update.subtask, {}).get(update.number)
            previous = known.state if known else None
            if known is not None and known.state == AttemptState.CANCELING and update.state in (
                AttemptState.FAILED, AttemptState.CANCELED):
                # A cancelled attempt dying is the expected end, not a failure.
                update.state = AttemptState.CANCELED
            if known is not None:
                update.speculative = known.speculative
                update.shared = known.shared or update.shared
                update.created_at = known.created_at if update.created_at is None else update.created_at
            if known is not None and known.state == AttemptState.CANCELING and update.state in LIVE:
                update.state = AttemptState.CANCELING  # a cancel is never undone by a stale observation
            self.attempts[update.subtask][update.number] = update
            self._book.dirty.add(update.subtask)
            if update.state == AttemptState.FINISHED and previous != AttemptState.FINISHED:
                newly_finished.append(update)
            elif update.state == AttemptState.FAILED and previous != AttemptState.FAILED:
                why = self._lost_cause(update, self.lost_targets, self.lost_nodes)
                if why or (update.subtask, update.number) in self.target_lost:
                    # Its target or node is gone: the loss is not the attempt's fault (FLIP-159).
                    self.target_lost.add((update.subtask, update.number))
                    update.cause = f"{why or 'target lost'}; attempt: {update.cause or 'no cause reported'}"
                else:
                    self._book.failed_count += 1
                newly_failed.append(update)
        # First finisher wins: when several finished between two polls, the earliest end wins.
        for attempt in sorted(newly_finished, key=lambda a: (a.end_at or now, a.number)):
            actions += self._on_finished(attempt)
        for attempt in newly_failed:
            actions += self._on_failed(attempt, now)
        return actions

    def _on_finished(self, attempt: Attempt) -> list[Action]:
        subtask = attempt.subtask
        if subtask in self.admitted or subtask in self.reused:
            if self.admitted.get(subtask) == attempt.number:
                # Admitted by another controller (AdmissionLost) before its end was seen: the baseline takes it now.
                self._book.admit_version += 1
                return []
            return [Discard(subtask, attempt.number, f"attempt {self.admitted.get(subtask)} was admitted first")]
        self.admitted[subtask] = attempt.number
        self._book.admit_version += 1
        siblings = self.attempts[subtask]
        before = {n: a.state for n, a in siblings.items()}
        cancels = self._cancel_live(siblings.values(), f"attempt {attempt.number} finished first",
                                    keep=attempt.number)
        if cancels:
            # These cancels assume the Admit wins the marker; AdmissionLost may yet name one of them the winner.
            self._book.cancelled_by_admission[subtask] = {c.attempt: before[c.attempt] for c in cancels}
        return [Admit(subtask, attempt.number), *cancels]

    def _cancel_live(self, attempts: Iterable[Attempt], reason: str, keep: int | None = None) -> list[Cancel]:
        """Cancel every live attempt of ``attempts`` except ``keep``, those already cancelling and admitted ones.

        An admitted attempt is live in this view only when another controller admitted it before its end was
        observed here (AdmissionLost): it is the result, never a loser.
        """
        actions: list[Cancel] = []
        for other in attempts:
            if (other.number != keep and other.live and other.state != AttemptState.CANCELING
                    and self.admitted.get(other.subtask) != other.number):
                other.state = AttemptState.CANCELING
                actions.append(Cancel(other.subtask, other.number, reason))
        return actions

    def _cancel_stragglers(self) -> list[Action]:
        # Losers are normally cancelled when the winner is seen; after a controller restart between
        # admission and cancel, this catches siblings of admitted subtasks that still run.
        actions: list[Action] = []
        for subtask, winner in self.admitted.items():
            cancelled = self._cancel_live(self.attempts.get(subtask, {}).values(), f"attempt {winner} was admitted",
                                          keep=winner)
            if cancelled:
                self._book.dirty.add(subtask)  # their state changed: what the speed view and the slow watch keep
            actions += cancelled
        return actions

    def _on_failed(self, attempt: Attempt, now: float) -> list[Action]:
        subtask = attempt.subtask
        if self.failed:
            return []  # one FailStage per stage run, however many attempts fail after it
        if self.stage_failures() > self.config.max_failures_per_stage:
            return self._fail(f"{self.stage_failures()} failed attempts in this stage run "
                              f"(max_failures_per_stage = {self.config.max_failures_per_stage})")
        actions: list[Action] = []
        lost_node = attempt.lost_node
        if lost_node and self.config.block_slow_node_duration > 0 and self.blocklist.block(
                lost_node, now + self.config.block_slow_node_duration):
            # FLIP-224: a node that lost the attempt's executors gets no new attempts for a while.
            actions.append(BlockNode(lost_node, self.blocklist.until[lost_node],
                                     f"subtask {subtask} attempt {attempt.number} lost its executors"))
        if attempt.lost_partition is not None and attempt.lost_partition[0] in self.upstreams and (
                self.input_committed.get(attempt.lost_partition[0], True)):
            # A hybrid producer that has not committed is still its own controller's to repair.
            actions += self._backtrack(attempt)
        if subtask in self.admitted or subtask in self.reused:
            return actions
        if actions or self.waiting.get(subtask) or any(a.possible_to_finish for a in self.attempts[subtask].values()):
            # FLIP-168: a sibling may still finish (or FLIP-1: the input is being re-produced),
            # so this failure restarts nothing now.
            return actions
        if self.failures(subtask) > self.config.max_failures_per_subtask:
            return self._fail(f"subtask {subtask} failed {self.failures(subtask)} times "
                              f"(max_failures_per_subtask = {self.config.max_failures_per_subtask})")
        return []  # _place launches the replacement attempt when a slot is free

    def _backtrack(self, attempt: Attempt) -> list[Action]:
        # FLIP-1: rerun the producer subtask(s) of the lost partition; readers wait until it is back.
        assert attempt.lost_partition is not None
        stage, lost = attempt.lost_partition
        parallelism = self.upstreams[stage][0]
        producers = range(parallelism) if self.config.failover_strategy == "all" else [lost]
        actions: list[Action] = []
        for producer in producers:
            key = (stage, producer)
            readers = set(self.input_readers.get(key, frozenset())) | {attempt.subtask}
            for reader in readers - set(self.admitted) - set(self.reused):
                self.waiting.setdefault(reader, set()).add(key)
                self._book.dirty.add(reader)  # a queued reader must leave the queue
            if key not in self.recovering:
                self.recovering.add(key)
                lost_attempt = (attempt.failure or {}).get("attempt") if producer == lost else None
                actions.append(RecoverPartition(stage, producer, (
                    f"subtask {attempt.subtask} attempt {attempt.number} found {stage}[{lost}] missing or corrupt"
                    + (" (failover_strategy = all)" if producer != lost else "")), lost_attempt))
        return actions

    def _fail(self, reason: str) -> list[Action]:
        failed = sorted((a for a in self.all_attempts() if a.state == AttemptState.FAILED),
                        key=lambda a: (a.subtask, a.number))
        counts = Counter(_cause_class(a.cause) for a in failed)
        self.failed = FailStage(reason=reason, causes=tuple(self.failure_causes(failed[:MAX_CAUSES])),
                                failed_attempts=len(failed), counts_by_cause=tuple(counts.most_common()),
                                failed_keys=tuple((a.subtask, a.number) for a in failed[:MAX_CAUSES]))
        return [self.failed, *self._cancel_live(self.all_attempts(), "stage failed")]

    def failure_causes(self, attempts: Iterable[Attempt] | None = None) -> list[str]:
        """One line per failed attempt (all, or ``attempts``): subtask, attempt, target, node, exit code, cause."""
        if attempts is None:
            attempts = sorted((a for a in self.all_attempts() if a.state == AttemptState.FAILED),
                              key=lambda a: (a.subtask, a.number))
        return [f"subtask {a.subtask} attempt {a.number} on {a.target} (node {a.node or '?'}): "
                f"exit code {a.exit_code}, {a.cause or 'no cause reported'}" for a in attempts]

    def _detect_slow(self, now: float) -> list[Action]:
        self._caches.watch_pending |= self._book.dirty
        self._caches.baseline_pending |= self._book.dirty
        if not self.speculation_enabled:
            self.slow_subtasks = frozenset()
            return []
        if self._book.baseline_version != self._book.admit_version:
            # Admitted attempts never change, so the baseline only moves when admissions do: no re-sort per tick.
            self._book.baseline_version = self._book.admit_version
            self.baseline = self._compute_baseline()
        forced = self.faults.force_speculation
        if self.baseline is None and not forced:
            self.slow_subtasks = frozenset()  # nothing can be slow before the baseline exists
            return []
        judged = self._judge(now)
        slow = [a for a, _ in judged]
        for attempt, why in judged:
            # Why the latest copy of each subtask was asked for (status, UI and journal show it).
            self.slow_reasons[attempt.subtask] = why
        self.slow_subtasks = frozenset(a.subtask for a in slow) | frozenset(
            s for s in forced if s in self.attempts and s not in self.admitted and s not in self.reused
            and any(a.possible_to_finish for a in self.attempts[s].values()))
        self.peak_slow = max(self.peak_slow, len(self.slow_subtasks))
        actions: list[Action] = []
        until = now + self.config.block_slow_node_duration
        for attempt in slow:
            node = attempt.node or self._target(attempt.target).node_label
            if self.config.block_slow_node_duration > 0 and self.blocklist.block(node, until):
                actions.append(BlockNode(node, until, f"subtask {attempt.subtask} attempt {attempt.number} is slow "
                                                      f"({attempt.execution_time(now):.1f}s)"))
        return actions

    def _compute_baseline(self) -> Baseline | None:
        """``compute_baseline`` of the admitted attempts that started, from the baseline view brought up to date."""
        view = self._caches.baseline_view
        if view is None or view.input_bytes is not self.input_bytes:
            view = self._caches.baseline_view = BaselineView(self.input_bytes)
            self._caches.baseline_pending = set(self.attempts) | set(self.admitted)
        for subtask in self._caches.baseline_pending:
            number = self.admitted.get(subtask)
            attempt = self.attempts.get(subtask, {}).get(number) if number is not None else None
            # Another controller's admission may precede the end observed here: its time counts from that end.
            if attempt is not None and (attempt.state != AttemptState.FINISHED or attempt.deploying_at is None):
                attempt = None
            view.update(subtask, attempt)
        self._caches.baseline_pending = set()
        return view.baseline(self.parallelism, ratio=self.config.baseline_ratio,
                             multiplier=self.config.baseline_multiplier, lower_bound=self.config.baseline_lower_bound,
                             normalize_by_input_bytes=self.config.normalize_by_input_bytes)

    def _judge(self, now: float) -> list[tuple[Attempt, str]]:
        """``judge_slow`` of the attempts of subtasks not admitted nor reused, in subtask and attempt order."""
        watch = self._caches.slow_watch
        if watch is None or watch.input_bytes is not self.input_bytes:
            watch = self._caches.slow_watch = SlowWatch(self.input_bytes)
            self._caches.watch_pending = set(self.attempts)
        for subtask in self._caches.watch_pending:
            candidate = subtask not in self.admitted and subtask not in self.reused
            watch.update(subtask, self.attempts.get(subtask, {}).values() if candidate else ())
        self._caches.watch_pending = set()
        # The last placement round's speeds: a target it calls slow explains its attempts' time (core/detector.py).
        return watch.judge(self.baseline, now, self.speeds.slow_targets if self.speeds is not None else frozenset())

    def _speed_view(self) -> SpeedView:
        """The speed view, brought up to date with the subtasks that changed since it was last used."""
        view = self._caches.speed_view
        if view is None or view.input_bytes is not self.input_bytes:
            view = self._caches.speed_view = SpeedView(self.input_bytes)
            self._caches.speed_pending = set(self.attempts)
        for subtask in self._caches.speed_pending:
            view.update(subtask, self.attempts.get(subtask, {}).values())
        self._caches.speed_pending = set()
        return view

    def _observe_speeds(self, now: float) -> Speeds:
        """``observe`` of every attempt, from the speed view brought up to date with the subtasks that changed."""
        self._caches.viewed = self._speed_view().speeds(now, self.target_history, self.history_source)
        return self._caches.viewed

    def _hold_inputs(self, speeds: Speeds, now: float) -> HoldInputs:
        """The live attempts on a target, whether any attempt went to it, and the longest execution time there."""
        view = self._caches.speed_view
        assert view is not None  # _observe_speeds ran earlier in the same round
        # The view's execution times are this round's only if the round's speeds came from it.
        longest = functools.partial(view.longest, now=now) if self._caches.viewed is speeds else None
        return view.live_on, view.went_to, longest

    def _mark_shared(self, others: Mapping[str, int]) -> None:
        """Mark the live attempts on targets other stage runs use now: O(live attempts there)."""
        if not others:
            return
        view = self._speed_view()
        for name in others:
            for attempt in view.live_on(name):
                if not attempt.shared:
                    attempt.shared = True
                    self._caches.speed_pending.add(attempt.subtask)

    def _add_attempt(self, attempt: Attempt) -> None:
        """Record an attempt placement launched; the speed view counts it as live from then on."""
        attempt.shared = attempt.shared or attempt.target in self.others
        per = self.attempts[attempt.subtask]
        per[attempt.number] = attempt
        self._caches.speed_pending.add(attempt.subtask)
        if self._caches.speed_view is not None:  # a later hold in this round counts the new attempt as live
            self._caches.speed_view.update(attempt.subtask, per.values())

    def _slot_count(self, name: str) -> int | None:
        """``_slot_counts().get(name)``, without building the whole mapping."""
        position = self._position(name)
        if position is None or (self.free_slots is not None and name in self.lost_targets):
            return None
        target = self.targets[position]
        return self.capacity.get(name, target.slots) if self.free_slots is not None else target.slots

    def _median_size(self) -> float | None:
        """The median input size of the subtasks, computed once per ``input_bytes`` (which is never modified)."""
        cached = self._caches.median_of
        if cached is None or cached[0] is not self.input_bytes:
            cached = self._caches.median_of = (self.input_bytes, median_size(self.input_bytes))
        return cached[1]

    def _target(self, name: str) -> Target:
        position = self._position(name)
        return self.targets[position] if position is not None else Target(name=name)

    def _position(self, name: str) -> int | None:
        """The target's place in the configuration (ties in placement go to the earlier one); None if unknown."""
        if self._caches.positions_of is not self.targets:
            # Target names are unique (config.py checks), so a name stands for its position.
            self._caches.positions = {t.name: i for i, t in reversed(list(enumerate(self.targets)))}
            self._caches.positions_of = self.targets
        return self._caches.positions.get(name)

    def _place(self, now: float) -> list[Action]:
        fresh: list[tuple[int, str]] = []
        self._caches.speed_pending |= self._book.dirty
        queue = self._queue
        # The wanting subtasks are the queued ones and those a SlotLost marked, which it marks dirty too: so the
        # dirty ones are all that is decided again, and what stays wanting is the rest, in O(changes).
        candidates, self._book.dirty = self._book.dirty, set()
        if self.hybrid:
            # Hybrid inputs can be withdrawn without a dirty mark: decide every waiting subtask again.
            candidates |= queue.queued.keys()
        for subtask in candidates.intersection(queue.queued):
            del queue.queued[subtask]
            queue.unheld.discard(subtask)
        queue.wanting -= candidates
        for subtask in sorted(candidates):
            if subtask in self.admitted or subtask in self.reused or self.waiting.get(subtask):
                continue
            if not any(a.possible_to_finish for a in self.attempts[subtask].values()):
                if self.hybrid and not launchable(self.hybrid, subtask, self.input_admitted,
                                                  self.config.hybrid_min_admitted_share, self.input_committed):
                    self.input_blocked.add(subtask)  # woken by InputsAdmitted, not polled every tick
                    continue
                self.input_blocked.discard(subtask)
                reason = "initial attempt"
                if self.attempts[subtask]:
                    last = self.attempts[subtask][max(self.attempts[subtask])]
                    reason = ("rerun after lost input" if last.lost_partition
                              else "rerun after its target or node was lost"
                              if (subtask, last.number) in self.target_lost else "restart after failure")
                fresh.append((subtask, reason))
        if fresh:
            for subtask, reason in fresh:
                queue.queued[subtask] = reason
                queue.wanting.add(subtask)
                if subtask not in self.held_back:
                    queue.unheld.add(subtask)
            queue.order = sorted(queue.queued)
        for subtask in candidates.intersection(self.held_back):
            if subtask not in queue.queued:
                # It left the queue unlaunched (waits for a lost input, or is done): no longer held.
                del self.held_back[subtask]
        speculative: list[tuple[int, str]] = []
        for subtask in sorted(self.slow_subtasks):
            live = [a for a in self.attempts[subtask].values() if a.possible_to_finish]
            if live and len(live) < self.config.max_concurrent_executions:
                why = self.slow_reasons.get(subtask)
                speculative.append((subtask, "speculative copy of a slow attempt" + (f": {why}" if why else "")))
        self._update_slot_wait(bool(queue.queued or speculative), now)
        if not (queue.queued or speculative):
            return []
        if self._slot_wait_expired(now):
            since = self.waiting_for_slot_since if self.waiting_for_slot_since is not None else now
            why = "; ".join(f"{name}: {reason}" for name, reason in sorted(self.lost_targets.items()))
            return self._fail(f"{self.label}: no live slot on targets {', '.join(t.name for t in self.targets)} "
                              f"for {now - since:.0f}s (slot_wait_timeout = {self.config.slot_wait_timeout:g}s)"
                              + (f"; {why}" if why else ""))
        load = {t.name: 0 for t in self.targets}
        if self.free_slots is None:
            for attempt in self.all_attempts():
                if attempt.live and attempt.target in load:
                    load[attempt.target] += 1
        budget: int | None = None
        if self.hybrid:
            # FLIP-235's fallback: while producers of a hybrid input still wait for a slot, keep that many free.
            # With slots shared through the store the producers draw from the same free count.
            free_total = (sum(max(0, n) for n in self.free_slots.values()) if self.free_slots is not None
                          else sum(max(0, t.slots - load[t.name]) for t in self.targets))
            budget = consumer_slots(free_total, sum(self.producers_waiting.values()))
        speeds = self.speeds = self._observe_speeds(now)
        return self._placement.place(speculative, load, budget, speeds, now)

    def _update_slot_wait(self, wanted: bool, now: float) -> None:
        """Start the wait clock when attempts are wanted and no target has a live slot at all."""
        no_live_slot = self.free_slots is not None and not any(self.capacity.get(t.name, 0) > 0 for t in self.targets)
        if wanted and no_live_slot:
            if self.waiting_for_slot_since is None:
                self.waiting_for_slot_since = now
        else:
            self.waiting_for_slot_since = None

    def _slot_wait_expired(self, now: float) -> bool:
        since = self.waiting_for_slot_since
        return since is not None and now - since >= self.config.slot_wait_timeout

    def slot_status(self, now: float) -> str | None:
        """While the stage waits for slots: which, and for how long; else None."""
        names = ", ".join(t.name for t in self.targets)
        if self.waiting_for_slot_since is not None:
            return (f"waiting for a live slot on targets {names} for {now - self.waiting_for_slot_since:.0f}s "
                    f"(fails after slot_wait_timeout = {self.config.slot_wait_timeout:g}s)")
        if self._queue.wanting and self.free_slots is not None and not any(self.free_slots.values()):
            if self.yielded:
                left = sum(self.yielded.values())
                return (f"waiting for a free slot on targets {names} ({left} free slot{'s' if left != 1 else ''} "
                        "left to stages of the run ahead on the critical path, the rest held by running attempts)")
            return f"waiting for a free slot on targets {names} (held by running attempts)"
        return None

    def _slot_counts(self) -> dict[str, int]:
        """Each target's slots: what it offers now (reactive, shared through the store) or its configured slots."""
        if self.free_slots is not None:
            return {t.name: self.capacity.get(t.name, t.slots) for t in self.targets if t.name not in self.lost_targets}
        return {t.name: t.slots for t in self.targets}



def _cause_class(cause: str | None) -> str:
    """A cause without the details that differ per attempt (paths, numbers), for counting by cause."""
    text = (cause or "no cause reported").split(":")[0]
    return re.sub(r"\d+", "N", text)[:120]
