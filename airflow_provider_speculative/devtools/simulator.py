"""A discrete-event simulator around the real scheduler core: simulated time, work and failures only.

Every decision (admit, cancel, speculate, block, place, complete) comes from
:class:`~airflow_provider_speculative.core.scheduler.StageScheduler`, fed the same stimuli the controller
feeds it (``control/controller.py``): per controller step the attempts that changed
(:class:`AttemptObserved`), what the targets offer (:class:`TargetsObserved`), the run's node blocks
(:class:`NodeBlocked`) and a :class:`Tick`; after slots were given back, ``TargetsObserved`` and a
second ``Tick`` in the same step, as the controller does. The simulator models only:

- **targets** (one per node) with slots, cores (attempts beyond the cores share them: processor
  sharing), a base speed, slow spells that start and end mid-stage, and node loss;
- **hosts** shared by several nodes (optional): a node on a host runs at most at its own speed (its
  cgroup quota) and at most at its fair share of the host's free cores, given what the other nodes
  there run (max-min fair sharing of the cores the host's other processes leave);
- **attempts**: a start-up cost (launch to a ready session, scaled by the node's speed), then the
  subtask's work; a cancelled attempt's process ends ``cancel_delay`` later;
- **stages one after the other** (no exchange overlap: a stage starts when the previous one
  completed); target speeds measured by a stage carry over to the next as the store's speed records
  do (``core.speed.run_slowness``), and so do node blocks (the run's blocklist);
- **controller steps** every ``check_interval``, and sooner after a change (an attempt became ready
  or ended), no sooner than ``notice_delay`` after it and ``wake_gap`` after the previous step.

Alternative *detector rules* (Spark, LATE, Mantri) are models of those systems' published rules, plugged
in by :class:`RuleScheduler`, a subclass that replaces ``_detect_slow`` (the core has no hook for
another rule) and gives copies the rule's node avoidance and order of preference; placement, admission
and cancelling stay the core's. The provider's own policy, Flink's
and "no speculation" use :class:`StageScheduler` itself with core options (:data:`POLICIES`).

Cost: events go through one heap; each controller step costs what the core costs for one tick
(O(targets + executing attempts + changed attempts): core/speed.py's SpeedView and core/detector.py's
BaselineView and SlowWatch are told what changed) plus O(targets + changed or ended attempts) here.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any, ClassVar, Protocol

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.messages import (
    Action,
    Admit,
    AttemptObserved,
    BlockNode,
    Cancel,
    CompleteStage,
    Discard,
    FailStage,
    Invalidate,
    Launch,
    NodeBlocked,
    RecoverPartition,
    Stimulus,
    TargetsObserved,
    Tick,
)
from airflow_provider_speculative.core.placing import Placement
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.speed import CHECK_WAIT_FACTOR, check_slowness, check_wanted, run_slowness
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.exceptions import ConfigError

# The controller looks for change notices every NOTICE_POLL s and steps at most every WAKE_FLOOR s
# after one (control/controller.py); the simulator's defaults are the same.
NOTICE_DELAY = 0.1
WAKE_GAP = 0.05
BYTES_PER_WORK_SECOND = 10_000_000

# -- the simulated world -------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """One node and its target: slots, cores (None: one per slot), base speed (1.0 = nominal) and host."""

    name: str
    slots: int = 1
    cores: float | None = None
    speed: float = 1.0
    # The host whose cores this node shares with the other nodes on it (None: cores of its own).
    host: str | None = None


@dataclass(frozen=True)
class HostSpec:
    """A machine several nodes run on: its cores, of which ``background`` are busy with other processes."""

    name: str
    cores: float
    background: float = 0.0


@dataclass(frozen=True)
class SlowSpell:
    """Node ``node`` runs at ``factor`` of its speed from ``start`` to ``end`` (seconds from the run's start)."""

    node: str
    factor: float
    start: float = 0.0
    end: float = math.inf


@dataclass(frozen=True)
class NodeLoss:
    """Node ``node`` is lost at ``at`` (its attempts die, its target offers no slot from then on)."""

    node: str
    at: float


@dataclass(frozen=True)
class StageSpec:
    """A stage: seconds of work per subtask at speed 1, and input bytes per subtask (default: from work)."""

    name: str
    work: tuple[float, ...]
    input_bytes: tuple[int, ...] | None = None

    def bytes_of(self, subtask: int) -> int:
        """Input bytes of ``subtask`` (proportional to its work unless given)."""
        if self.input_bytes is not None:
            return self.input_bytes[subtask]
        return max(1, int(self.work[subtask] * BYTES_PER_WORK_SECOND))


@dataclass(frozen=True)
class Scenario:
    """Nodes, stages (run one after the other), start-up cost, slow spells and node losses."""

    name: str
    nodes: tuple[NodeSpec, ...]
    stages: tuple[StageSpec, ...]
    startup: float = 1.0
    cancel_delay: float = 0.2
    spells: tuple[SlowSpell, ...] = ()
    losses: tuple[NodeLoss, ...] = ()
    # Time one speed-check query on every target at once before the first stage (Spark Connect pools).
    speed_check: float | None = None
    # Seconds between a stage's completion and the next stage's start (commit, planning: off the targets).
    stage_gap: float = 0.0
    # Hosts named by NodeSpec.host; a node whose host is not listed has cores of its own.
    hosts: tuple[HostSpec, ...] = ()

    def healthy(self) -> Scenario:
        """The same trace without slow spells, node losses or slow base speeds: the no-slow-node ideal."""
        nodes = tuple(replace(n, speed=1.0) for n in self.nodes)
        return replace(self, nodes=nodes, spells=(), losses=(), name=self.name + " (healthy)")


# -- policies ---------------------------------------------------------------------------------------


class DetectorRule(Protocol):
    """A slow-attempt rule other than the core's: which unfinished subtasks deserve a copy now, and why."""

    @property
    def name(self) -> str:
        """The rule's name."""
        ...

    def judge(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]
              ) -> dict[int, str]:
        """Subtask -> reason for the subtasks that should get a speculative copy now."""
        ...

    def avoid(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]) -> set[str]:
        """Targets a speculative copy must not be placed on."""
        ...


@dataclass(frozen=True)
class Policy:
    """A named policy: ``[speculative]`` option values for the core, and optionally another detector rule."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    rule: DetectorRule | None = None
    source: str = ""

    def config(self, targets: tuple[Target, ...], overrides: Mapping[str, Any] | None = None) -> SpeculativeConfig:
        """The core configuration: defaults, this policy's options, then ``overrides``, on ``targets``."""
        base = SpeculativeConfig().with_overrides(dict(self.options), f"policy {self.name}")
        if overrides:
            base = base.with_overrides(dict(overrides), "--set")
        return replace(base, targets=targets)


def _running(sched: StageScheduler) -> list[Attempt]:
    """Executing attempts of subtasks that have no admitted result yet."""
    return [a for a in sched.live_attempts()
            if a.state in (AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING)
            and a.subtask not in sched.admitted]


def _live_count(sched: StageScheduler, subtask: int) -> int:
    return sum(1 for a in sched.attempts[subtask].values() if a.possible_to_finish and a.live)


@dataclass(frozen=True)
class SparkRule:
    """Spark's TaskSetManager.checkSpeculatableTasks (model): median of successful task times x multiplier.

    Once ``quantile`` of the tasks succeeded, a task running longer than max(multiplier x median,
    minTaskRuntime) with one copy running is speculated; with ``efficiency`` (Spark >= 3.4, SPARK-32170)
    only if its data rate is under ``process_multiplier`` x the successful tasks' average or it ran
    ``long_run_factor`` x the threshold. Defaults are Spark 4's (SPARK-47720: multiplier 3, quantile 0.9).
    """

    name: str = "spark"
    quantile: float = 0.9
    multiplier: float = 3.0
    min_runtime: float = 0.1
    efficiency: bool = True
    process_multiplier: float = 0.75
    long_run_factor: float = 2.0

    def judge(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]
              ) -> dict[int, str]:
        """Tasks over the threshold (and inefficient) with a single running copy."""
        done = [sched.attempts[s][n] for s, n in sched.admitted.items()]
        if len(done) < max(1, math.floor(self.quantile * sched.parallelism)):
            return {}
        times = [a.execution_time(a.end_at or now) for a in done]
        threshold = max(self.multiplier * median(times), self.min_runtime)
        rates = [(sched.input_bytes.get(a.subtask) or 1) / max(t, 1e-9) for a, t in zip(done, times, strict=True)]
        average = sum(rates) / len(rates)
        out: dict[int, str] = {}
        for attempt in _running(sched):
            elapsed = attempt.execution_time(now)
            if elapsed <= threshold or _live_count(sched, attempt.subtask) > 1:
                continue
            if self.efficiency and elapsed <= self.long_run_factor * threshold:
                share = progress(attempt) or 0.0
                rate = share * (sched.input_bytes.get(attempt.subtask) or 1) / max(elapsed, 1e-9)
                if rate >= self.process_multiplier * average:
                    continue
            out[attempt.subtask] = f"spark: ran {elapsed:.1f}s > {threshold:.1f}s"
        return out

    def avoid(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]) -> set[str]:
        """Spark places a copy on any other executor."""
        return set()


@dataclass(frozen=True)
class LateRule:
    """LATE (Zaharia et al., OSDI'08), model: copy the task with the longest estimated time left.

    Progress rate = progress score / elapsed, time left = (1 - score) / rate. Candidates are tasks whose
    rate is below the ``slow_task`` percentile (SlowTaskThreshold, 25th); at most ``cap`` x available slots
    copies run at once (SpeculativeCap, 10 %); copies never go to nodes below the ``slow_node`` percentile of
    work done per slot (SlowNodeThreshold, 25th); the task with the most time left gets a free slot first.
    """

    name: str = "late"
    slow_task: float = 0.25
    slow_node: float = 0.25
    cap: float = 0.10

    def judge(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]
              ) -> dict[int, str]:
        """The slowest-rate tasks with the most time left, within the speculative cap, most time left first."""
        # Available slots: a lost node's do not count (TargetsObserved gives it no capacity).
        slots = (sum(sched.capacity.get(t.name, t.slots) for t in sched.targets) if sched.free_slots is not None
                 else sum(t.slots for t in sched.targets))
        live_copies = sum(1 for a in sched.live_attempts() if a.speculative)
        budget = max(1, math.floor(self.cap * slots)) - live_copies
        if budget <= 0:
            return {}
        scored = []
        for attempt in _running(sched):
            share = progress(attempt)
            elapsed = attempt.execution_time(now)
            if share is None or share <= 0.0 or elapsed <= 0.0:
                continue
            rate = share / elapsed
            scored.append((attempt, rate, (1.0 - share) / rate))
        if len(scored) < 2:
            return {}
        cutoff = _percentile([r for _, r, _ in scored], self.slow_task)
        slow = [(a, left) for a, r, left in scored if r < cutoff and _live_count(sched, a.subtask) == 1]
        slow.sort(key=lambda x: -x[1])
        return {a.subtask: f"late: {left:.1f}s left, rate in the slowest {self.slow_task:.0%}"
                for a, left in slow[:budget]}

    def avoid(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]) -> set[str]:
        """Nodes below the SlowNodeThreshold percentile of work done per slot."""
        done: dict[str, float] = {t.name: 0.0 for t in sched.targets}
        for attempt in sched.all_attempts():
            if attempt.state == AttemptState.FINISHED:
                done[attempt.target] = done.get(attempt.target, 0.0) + 1.0
            elif attempt.live:
                done[attempt.target] = done.get(attempt.target, 0.0) + (progress(attempt) or 0.0)
        slots = {t.name: t.slots for t in sched.targets}
        per_slot = {name: value / max(1, slots.get(name, 1)) for name, value in done.items()}
        if not any(per_slot.values()):
            return set()
        cutoff = _percentile(list(per_slot.values()), self.slow_node)
        return {name for name, value in per_slot.items() if value < cutoff}


@dataclass(frozen=True)
class MantriRule:
    """Mantri (Ananthanarayanan et al., OSDI'10), model: duplicate when the expected saving beats the cost.

    With ``t_new`` = median start-up + median work of finished attempts and ``t_rem`` the running
    attempt's remaining time from its progress, a subtask with ``c`` live copies gets another when
    ``t_rem > t_new * (c + 1) / c`` (Mantri's point-estimate form of P(t_rem > ...) > delta); at most
    ``max_copies`` copies (set max_concurrent_executions accordingly). Kill-and-restart is not modelled.
    """

    name: str = "mantri"

    def judge(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]
              ) -> dict[int, str]:
        """Subtasks whose remaining time exceeds what one more copy costs."""
        done = [sched.attempts[s][n] for s, n in sched.admitted.items()]
        if not done:
            return {}
        startups = [a.startup_seconds for a in done if a.startup_seconds is not None]
        works = [(a.end_at or now) - (a.ready_at if a.ready_at is not None else (a.deploying_at or now))
                 for a in done]
        t_new = (median(startups) if startups else 0.0) + median(works)
        out: dict[int, str] = {}
        best: dict[int, float] = {}
        for attempt in _running(sched):
            share = progress(attempt)
            if share is None or share <= 0.0 or attempt.ready_at is None:
                continue
            worked = now - attempt.ready_at
            remaining = worked * (1.0 - share) / share
            best[attempt.subtask] = min(best.get(attempt.subtask, math.inf), remaining)
        for subtask, remaining in best.items():
            copies = _live_count(sched, subtask)
            if copies and remaining > t_new * (copies + 1) / copies:
                out[subtask] = f"mantri: {remaining:.1f}s left > {t_new * (copies + 1) / copies:.1f}s"
        return out

    def avoid(self, sched: StageScheduler, now: float, progress: Callable[[Attempt], float | None]) -> set[str]:
        """Mantri places copies anywhere free."""
        return set()


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered))))]


class RulePlacement(Placement):
    """The core placement, with the copies a :class:`RuleScheduler`'s rule wants in its order and off its nodes."""

    def pick_target(self, load: dict[str, int], now: float, avoid: set[str], allow_blocked: bool,
                    speeds: Any = None) -> Target | None:
        """The core's pick, off the rule's slow nodes for a copy."""
        if not allow_blocked:  # a speculative copy: the rule's slow nodes are avoided too
            avoid = avoid | getattr(self.state, "_avoid", set())
        return super().pick_target(load, now, avoid, allow_blocked, speeds)

    def walk(self, speculative: list[tuple[int, str]], load: dict[str, int], budget: int | None,
             speeds: Any, now: float) -> list[Action]:
        """The core's walk, with the copies in the rule's order."""
        # Copies take free slots in the rule's order (LATE: most time left first), not in subtask order.
        rank = {subtask: i for i, subtask in enumerate(getattr(self.state, "_judged", ()))}
        ordered = sorted(speculative, key=lambda wanted: rank.get(wanted[0], len(rank)))
        return super().walk(ordered, load, budget, speeds, now)


class RuleScheduler(StageScheduler):
    """The core scheduler with another slow-attempt rule (``_detect_slow``) and its copies' placement."""

    rule: DetectorRule
    progress: Callable[[Attempt], float | None]
    _avoid: set[str]
    # The subtasks the rule judged this step, in its order of preference.
    _judged: list[int]
    placement_type: ClassVar[type[Placement]] = RulePlacement

    def _detect_slow(self, now: float) -> list[Action]:
        if not self.speculation_enabled:
            self.slow_subtasks = frozenset()
            return []
        judged = self.rule.judge(self, now, self.progress)
        self.slow_reasons.update(judged)
        self._judged = list(judged)
        self.slow_subtasks = frozenset(judged)
        self.peak_slow = max(self.peak_slow, len(self.slow_subtasks))
        self._avoid = self.rule.avoid(self, now, self.progress) if judged else set()
        return []


# Spark, LATE and Mantri leave nodes unblocked and copies at their own limits, and place the queued originals
# before any copy (none of them plans the last wave: plan_last_wave off, core/placing.py tail_copies); Flink is
# FLIP-168's defaults (fixed 60 s lower bound, no per-byte normalisation); the core's early baseline, progress
# projection and last-wave planning have no Flink option, so the Flink row keeps them.
POLICIES: dict[str, Policy] = {
    "provider": Policy("provider", {"enabled": True}, source="core/config.py defaults, enabled"),
    "flink": Policy("flink", {"enabled": True, "baseline_lower_bound": 60, "normalize_by_input_bytes": False},
                    source="FLIP-168 defaults: R 0.75, M 1.5, B 60 s, block 60 s, 2 executions"),
    "spark": Policy("spark", {"enabled": True, "block_slow_node_duration": 0, "plan_last_wave": False}, SparkRule(),
                    source="Spark 4 docs / SPARK-47720: multiplier 3, quantile 0.9, minTaskRuntime 100 ms"),
    "late": Policy("late", {"enabled": True, "block_slow_node_duration": 0, "plan_last_wave": False}, LateRule(),
                   source="LATE, OSDI'08: SlowTaskThreshold 25 %, SlowNodeThreshold 25 %, SpeculativeCap 10 %"),
    "mantri": Policy("mantri", {"enabled": True, "block_slow_node_duration": 0, "max_concurrent_executions": 3,
                                "plan_last_wave": False},
                     MantriRule(), source="Mantri, OSDI'10: t_rem > t_new (c+1)/c, up to 3 copies"),
    "none": Policy("none", {"enabled": False}, source="speculation off"),
}


# -- the simulation -------------------------------------------------------------------------------


@dataclass
class _Run:
    """One simulated attempt's process (what a backend would be running)."""

    subtask: int
    number: int
    node: str
    speculative: bool
    launched_at: float
    startup: float
    work: float
    state: AttemptState = AttemptState.DEPLOYING
    done: float = 0.0
    rate: float = 0.0
    since: float = 0.0
    version: int = 0
    ready_at: float | None = None
    end_at: float | None = None
    cause: str | None = None
    holds_slot: bool = True
    reap_at: float | None = None

    def progressed(self, now: float) -> float:
        """Units done (start-up plus work) at ``now``."""
        return self.done + self.rate * (now - self.since)


@dataclass
class _Node:
    """A node's state: its spell factor, running processes and whether it is lost."""

    spec: NodeSpec
    factor: float = 1.0
    running: dict[tuple[int, int], _Run] = field(default_factory=dict)
    lost: bool = False
    held: int = 0


@dataclass
class StageResult:
    """What one simulated stage run did."""

    name: str
    start: float
    end: float
    attempt_seconds: float
    wasted_seconds: float
    copies: int
    copies_won: int
    attempts: int
    failed: str | None = None

    @property
    def makespan(self) -> float:
        """Seconds from the stage's start to its completion."""
        return self.end - self.start


@dataclass
class RunResult:
    """What a simulated pipeline run did: per stage, and in all."""

    scenario: str
    policy: str
    stages: list[StageResult]
    steps: int = 0
    speed_check_wait: float = 0.0

    @property
    def makespan(self) -> float:
        """From the run's start (with the speed check) to the last stage's completion."""
        return self.stages[-1].end if self.stages else 0.0

    @property
    def attempt_seconds(self) -> float:
        """Seconds every attempt ran, from launch to its end."""
        return sum(s.attempt_seconds for s in self.stages)

    @property
    def wasted_seconds(self) -> float:
        """Attempt-seconds of attempts that were not admitted (losing copies, beaten originals, lost ones)."""
        return sum(s.wasted_seconds for s in self.stages)

    @property
    def copies(self) -> int:
        """Speculative attempts launched."""
        return sum(s.copies for s in self.stages)

    @property
    def copies_won(self) -> int:
        """Speculative attempts admitted."""
        return sum(s.copies_won for s in self.stages)

    @property
    def failed(self) -> str | None:
        """Why a stage failed, if one did."""
        return next((s.failed for s in self.stages if s.failed), None)


class Simulator:
    """Runs one scenario under one policy: a heap of events around the real :class:`StageScheduler`."""

    def __init__(self, scenario: Scenario, policy: Policy, *, overrides: Mapping[str, Any] | None = None,
                 check_interval: float | None = None, notice_delay: float = NOTICE_DELAY,
                 wake_gap: float = WAKE_GAP, report_progress: bool = False,
                 history: Mapping[str, float] | None = None, config: SpeculativeConfig | None = None) -> None:
        self.scenario = scenario
        self.policy = policy
        targets = tuple(Target(name=n.name, slots=n.slots) for n in scenario.nodes)
        # ``config``: a whole configuration (a recorded run's), used instead of the policy's options.
        self.config = (policy.config(targets, overrides) if config is None
                       else replace(config.with_overrides(dict(overrides or {}), "--set"), targets=targets))
        if check_interval is not None:
            self.config = replace(self.config, check_interval=check_interval)
        self.notice_delay = notice_delay
        self.wake_gap = wake_gap
        # The controller feeds an observation only when more than progress changed (control/controller.py
        # _differs); True also feeds every running attempt's progress each step (what LATE-style rules read).
        self.report_progress = report_progress
        self.nodes = {n.name: _Node(n) for n in scenario.nodes}
        self._hosts = {h.name: h for h in scenario.hosts}
        unknown = sorted({n.host for n in scenario.nodes if n.host is not None} - set(self._hosts))
        if unknown:
            raise ConfigError(f"scenario {scenario.name}: nodes name unknown host(s) {', '.join(unknown)}")
        self._on_host: dict[str, list[_Node]] = {h: [] for h in self._hosts}
        for each in self.nodes.values():
            if each.spec.host is not None:
                self._on_host[each.spec.host].append(each)
        # What TargetsObserved says of each node, kept up to date: the nodes whose held slots changed since
        # the last observation are all that is looked at again.
        self._free = {n.name: n.slots for n in scenario.nodes}
        self._capacity = dict(self._free)
        self._lost: dict[str, str] = {}
        self._touched: set[str] = set()
        self.history: dict[str, float] = dict(history or {})
        self.history_source: dict[str, str] = {}
        self.blocks: dict[str, float] = {}
        self.now = 0.0
        self.steps = 0
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._runs: dict[tuple[int, int], _Run] = {}
        self._changed: set[tuple[int, int]] = set()
        # Runs of this stage that ended while holding their slot (what _release looks at).
        self._ended: set[tuple[int, int]] = set()
        self._next_step = math.inf
        self._last_step = -math.inf
        self.sched: StageScheduler | None = None
        self.stage: StageSpec | None = None

    # -- events ------------------------------------------------------------------------------

    def _push(self, at: float, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, data))

    @staticmethod
    def _alone(node: _Node, processes: int | None = None) -> float:
        """Progress per second of one of ``processes`` attempts (default: those running) on ``node``'s own cores."""
        cores = node.spec.cores if node.spec.cores is not None else float(node.spec.slots)
        share = min(1.0, cores / max(1, len(node.running) if processes is None else processes))
        return node.spec.speed * node.factor * share

    def _speed(self, node: _Node, processes: Mapping[str, int] | None = None) -> float:
        """Progress per second of one attempt on ``node`` now: its own rate, cut to its share of a shared host.

        ``processes`` (node name -> processes running) replaces what runs on the host's nodes (the speed check).
        """
        count = (processes or {}).get(node.spec.name, len(node.running))
        alone = self._alone(node, count)
        host = self._hosts.get(node.spec.host or "")
        if host is None or count == 0:
            return alone
        # Max-min fair share of the host's free cores: a node never gets more than it can use (its demand,
        # capped by its quota), and what one leaves unused goes to the others in equal parts.
        demands = {}
        for other in self._on_host[host.name]:
            n = (processes or {}).get(other.spec.name, len(other.running))
            if n:
                demands[other.spec.name] = n * self._alone(other, n)
        free = max(0.0, host.cores - host.background)
        left = dict(demands)
        while left:
            share = free / len(left)
            capped = {name: d for name, d in left.items() if d <= share}
            if not capped:
                break
            for name, d in capped.items():
                free -= d
                del left[name]
        given = demands[node.spec.name] if node.spec.name not in left else free / len(left)
        return alone * min(1.0, given / demands[node.spec.name]) if demands[node.spec.name] > 0 else 0.0

    def _rerate(self, node: _Node) -> None:
        """Re-time the processes of ``node`` and of the nodes sharing its host (a speed or process count changed)."""
        host = self._hosts.get(node.spec.host or "")
        for each in self._on_host[host.name] if host is not None else (node,):
            self._retime(each)

    def _retime(self, node: _Node) -> None:
        """Re-time every process on ``node`` from its speed now."""
        rate = self._speed(node)
        for run in node.running.values():
            run.done = run.progressed(self.now)
            run.since = self.now
            run.rate = rate
            run.version += 1
            target = run.startup if run.ready_at is None else run.startup + run.work
            left = max(0.0, target - run.done)
            self._push(self.now + (left / rate if rate > 0 else math.inf), "milestone",
                       ((run.subtask, run.number), run.version))

    def _notice(self) -> None:
        """A change the controller hears of: step soon (not sooner than the wake gap after the last step)."""
        self._next_step = min(self._next_step, max(self.now + self.notice_delay, self._last_step + self.wake_gap))

    def _milestone(self, key: tuple[int, int], version: int) -> None:
        run = self._runs.get(key)
        if run is None or run.version != version or key not in self.nodes[run.node].running:
            return
        node = self.nodes[run.node]
        run.done = run.progressed(self.now)
        run.since = self.now
        if run.ready_at is None:
            run.ready_at = self.now
            run.state = AttemptState.RUNNING
            run.version += 1
            left = run.work / run.rate if run.rate > 0 else math.inf
            self._push(self.now + left, "milestone", (key, run.version))
        else:
            run.state = AttemptState.FINISHED
            run.end_at = self.now
            self._ended.add(key)
            del node.running[key]
            self._rerate(node)
        self._changed.add(key)
        self._notice()

    def _spell(self, name: str, factor: float) -> None:
        node = self.nodes[name]
        node.factor *= factor
        self._rerate(node)

    def _lose(self, name: str) -> None:
        node = self.nodes[name]
        node.lost = True
        self._capacity[name] = 0
        self._lost = {n: "node lost" for n, spec in self.nodes.items() if spec.lost}
        self._touched.add(name)
        for key, run in list(node.running.items()):
            run.done = run.progressed(self.now)
            run.state, run.end_at, run.cause = AttemptState.FAILED, self.now, f"node {name} lost"
            self._ended.add(key)
            del node.running[key]
            self._changed.add(key)
        self._rerate(node)  # the nodes sharing its host get its cores
        self._notice()

    def _reaped(self, key: tuple[int, int]) -> None:
        run = self._runs[key]
        run.state, run.end_at = AttemptState.CANCELED, self.now
        self._ended.add(key)
        self._changed.add(key)
        self._notice()

    # -- the controller's side ------------------------------------------------------------

    def _progress(self, attempt: Attempt) -> float | None:
        """Share of its work a live attempt has done (what a heartbeat's bytes_read would say), None if unknown."""
        run = self._runs.get((attempt.subtask, attempt.number))
        if run is None or run.ready_at is None:
            return None
        if run.state == AttemptState.FINISHED:
            return 1.0
        running = (run.subtask, run.number) in self.nodes[run.node].running
        done = (run.progressed(self.now) if running else run.done) - run.startup
        return max(0.0, min(1.0, done / run.work)) if run.work > 0 else 1.0

    def _observed(self, run: _Run) -> Attempt:
        """The attempt as a backend's poll would report it."""
        assert self.stage is not None
        size = self.stage.bytes_of(run.subtask)
        attempt = Attempt(subtask=run.subtask, number=run.number, target=run.node, state=run.state,
                          speculative=run.speculative, node=run.node, created_at=run.launched_at,
                          deploying_at=run.launched_at, end_at=run.end_at, cause=run.cause, input_bytes=size,
                          launched_at=run.launched_at, ready_at=run.ready_at,
                          exit_code=0 if run.state == AttemptState.FINISHED else None)
        share = self._progress(attempt)
        if share is not None:
            attempt.progress = {"bytes_read": int(share * size), "input_bytes": size}
        return attempt

    def _targets(self) -> TargetsObserved:
        for name in self._touched:
            node = self.nodes[name]
            self._free[name] = 0 if node.lost else max(0, node.spec.slots - node.held)
        self._touched.clear()
        return TargetsObserved(free=dict(self._free), capacity=dict(self._capacity), lost_targets=dict(self._lost))

    def _release(self) -> int:
        """Give back the slots of attempts the scheduler knows are over (the slot ledger's release_over)."""
        assert self.sched is not None
        released = 0
        # Only ended processes can give a slot back: O(ended, not yet released), not O(every attempt).
        for key in list(self._ended):
            run = self._runs[key]
            if not run.holds_slot:
                self._ended.discard(key)
                continue
            known = self.sched.attempts.get(run.subtask, {}).get(run.number)
            if known is not None and not known.live:
                run.holds_slot = False
                self.nodes[run.node].held -= 1
                self._touched.add(run.node)
                released += 1
                self._ended.discard(key)
        return released

    def step(self) -> list[Action]:
        """One controller step: feed what changed, the targets and a Tick; carry out the actions."""
        assert self.sched is not None
        self.steps += 1
        self._last_step = self.now
        self._next_step = self.now + self.config.check_interval
        stimuli: list[Stimulus] = [NodeBlocked(node, until) for node, until in sorted(self.blocks.items())]
        keys = set(self._changed)
        self._changed = set()
        if self.report_progress:
            keys |= {(a.subtask, a.number) for a in self.sched.live_attempts()}
        stimuli += [AttemptObserved(self._observed(self._runs[k])) for k in sorted(keys) if k in self._runs]
        stimuli.append(self._targets())
        actions = self.carry_out(self.sched.handle(*stimuli, Tick(self.now)))
        if self._release() and not (self.sched.completed or self.sched.failed):
            actions += self.carry_out(self.sched.handle(self._targets(), Tick(self.now)))
            self._release()
        return actions

    def carry_out(self, actions: Iterable[Action]) -> list[Action]:
        """What a backend would do for each action: launch, cancel, block; record the rest."""
        done = []
        for action in actions:
            done.append(action)
            self._carry_out(action)
        return done

    @functools.singledispatchmethod
    def _carry_out(self, action: object) -> None:
        """Do what one action says in simulated time.

        Each action type has one handler (registered below, dispatched on the type), as in the controller
        (control/controller.py), which refuses a type it does not know the same way.
        """
        raise TypeError(f"Simulator: no handler for action type {type(action).__name__}: {action!r}")

    @_carry_out.register
    def _launch(self, action: Launch) -> None:
        assert self.stage is not None
        node = self.nodes[action.target]
        key = (action.subtask, action.attempt)
        run = _Run(subtask=action.subtask, number=action.attempt, node=action.target,
                   speculative=action.speculative, launched_at=self.now, startup=self.scenario.startup,
                   work=self.stage.work[action.subtask], since=self.now)
        self._runs[key] = run
        node.held += 1
        self._touched.add(action.target)
        self._changed.add(key)
        if node.lost:
            run.state, run.end_at, run.cause = AttemptState.FAILED, self.now, "launch failed: node lost"
            self._ended.add(key)
            return
        node.running[key] = run
        self._rerate(node)

    @_carry_out.register
    def _stop(self, action: Cancel) -> None:
        victim = self._runs.get((action.subtask, action.attempt))
        if victim is not None and victim.end_at is None:
            self._cancel(victim)

    @_carry_out.register
    def _block_node(self, action: BlockNode) -> None:
        self.blocks[action.node] = max(action.until, self.blocks.get(action.node, action.until))

    @_carry_out.register
    def _record(self, action: Admit | Discard | RecoverPartition | Invalidate | FailStage | CompleteStage) -> None:
        """Nothing to simulate: the scheduler keeps admissions and the stage's end; attempts here write no output."""

    def _cancel(self, run: _Run) -> None:
        """Stop a process; it ends (its slot is given back) ``cancel_delay`` later."""
        key = (run.subtask, run.number)
        node = self.nodes[run.node]
        run.done = run.progressed(self.now)
        run.state = AttemptState.CANCELING
        if key in node.running:
            del node.running[key]
            self._rerate(node)
        run.reap_at = self.now + self.scenario.cancel_delay
        self._push(run.reap_at, "reaped", key)

    def _new_scheduler(self, stage: StageSpec) -> StageScheduler:
        sizes = {i: stage.bytes_of(i) for i in range(len(stage.work))}
        kwargs: dict[str, Any] = dict(parallelism=len(stage.work), config=self.config, input_bytes=sizes,
                                      label=f"simulation {self.scenario.name}, stage {stage.name}",
                                      target_history=dict(self.history), history_source=dict(self.history_source))
        if self.policy.rule is None:
            return StageScheduler(**kwargs)
        sched = RuleScheduler(**kwargs)
        sched.rule = self.policy.rule
        sched.progress = self._progress
        return sched

    def _speed_check(self) -> float:
        """Time one check query on every target at once (control/speedcheck.py); the core judges the ratios."""
        work = self.scenario.speed_check
        names = [n for n in self.nodes if not self.nodes[n].lost]
        if work is None or not check_wanted(names, self.history, {}, [], self.config.speed_check_age):
            return 0.0
        # Every target runs the check query at once: on a shared host the checks share its cores.
        checking = {n: len(self.nodes[n].running) + 1 for n in names}
        durations = {n: work / max(1e-9, self._speed(self.nodes[n], checking)) for n in names}
        fastest = min(durations.values())
        waited = min(max(durations.values()), CHECK_WAIT_FACTOR * fastest)
        seen: dict[str, float | None] = {n: d if d <= waited else None for n, d in durations.items()}
        slowness = check_slowness(seen, waited)
        self.history.update(slowness)
        self.history_source.update({n: "speed check" for n in slowness})
        return waited

    def run(self, max_time: float = 10 * 86400.0) -> RunResult:
        """Run every stage one after the other; return per-stage makespans, attempt-seconds and copies."""
        for spell in self.scenario.spells:
            self._push(spell.start, "spell", (spell.node, spell.factor))
            if spell.end < math.inf:
                self._push(spell.end, "spell", (spell.node, 1.0 / spell.factor))
        for loss in self.scenario.losses:
            self._push(loss.at, "loss", loss.node)
        self._drain(0.0)
        waited = self._speed_check()
        self.now = waited
        results = []
        for index, stage in enumerate(self.scenario.stages):
            if index:
                self._drain(self.now + self.scenario.stage_gap)
            results.append(self._run_stage(stage, max_time))
            if results[-1].failed:
                break
        return RunResult(self.scenario.name, self.policy.name, results, self.steps, waited)

    def _drain(self, until: float) -> None:
        """Process every event up to ``until``."""
        while self._heap and self._heap[0][0] <= until:
            at, _, kind, data = heapq.heappop(self._heap)
            self.now = max(self.now, at)
            if kind == "milestone":
                self._milestone(*data)
            elif kind == "spell":
                self._spell(*data)
            elif kind == "loss":
                self._lose(data)
            elif kind == "reaped":
                self._reaped(data)
        self.now = max(self.now, until)

    def _run_stage(self, stage: StageSpec, max_time: float) -> StageResult:
        self.stage = stage
        self.sched = sched = self._new_scheduler(stage)
        self._runs = {}
        self._changed = set()
        self._ended = set()
        start = self.now
        self._next_step = self.now
        while not (sched.completed or sched.failed):
            if self._heap and self._heap[0][0] < self._next_step:
                self._drain(self._heap[0][0])
                continue
            if self._next_step - start > max_time:
                raise RuntimeError(f"simulation {self.scenario.name}/{self.policy.name}: stage {stage.name} "
                                   f"did not end within {max_time:.0f} simulated seconds")
            self._drain(self._next_step)
            self.step()
        end = self.now
        # Cancelled losers still dying hold their slots a moment longer: the next stage starts after them.
        self._drain(max([end] + [r.reap_at for r in self._runs.values() if r.reap_at is not None]))
        for run in self._runs.values():
            if run.holds_slot:
                run.holds_slot = False
                self.nodes[run.node].held -= 1
                self._touched.add(run.node)
        admitted = {(s, n) for s, n in sched.admitted.items()}
        seconds = {k: (r.end_at if r.end_at is not None else end) - r.launched_at for k, r in self._runs.items()}
        measured = run_slowness(sched.all_attempts(), sched.input_bytes)
        self.history.update(measured)
        for name in measured:
            self.history_source.pop(name, None)
        return StageResult(
            name=stage.name, start=start, end=end, attempt_seconds=sum(seconds.values()),
            wasted_seconds=sum(v for k, v in seconds.items() if k not in admitted),
            copies=sum(1 for r in self._runs.values() if r.speculative),
            copies_won=sum(1 for k in admitted if self._runs[k].speculative),
            attempts=len(self._runs), failed=sched.failed.reason if sched.failed else None)


def simulate(scenario: Scenario, policy: Policy | str, **kwargs: Any) -> RunResult:
    """Run ``scenario`` under ``policy`` (a :class:`Policy` or a name of :data:`POLICIES`)."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ConfigError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        policy = POLICIES[policy]
    return Simulator(scenario, policy, **kwargs).run()


# -- traces -------------------------------------------------------------------------------------


def lognormal_work(n: int, rng: random.Random, mean: float = 30.0, sigma: float = 0.3) -> tuple[float, ...]:
    """``n`` task works, lognormal with median ``mean`` and shape ``sigma``."""
    return tuple(mean * rng.lognormvariate(0.0, sigma) for _ in range(n))


def pareto_work(n: int, rng: random.Random, mean: float = 30.0, alpha: float = 1.9,
                tail: float = 0.1) -> tuple[float, ...]:
    """Lognormal work where a ``tail`` share of tasks is multiplied by a Pareto(``alpha``) factor (heavy tail).

    The shape follows the heavy-tailed task durations of Mantri's Bing traces (OSDI'10, Fig. 2) and
    Dolly's Facebook/Bing traces (NSDI'13): most tasks near the median, a few several times longer.
    """
    return tuple(w * (rng.paretovariate(alpha) if rng.random() < tail else 1.0)
                 for w in lognormal_work(n, rng, mean, 0.2))


def skewed(work: Sequence[float], rng: random.Random, share: float = 0.05, factor: float = 4.0) -> tuple[float, ...]:
    """Data skew by subtask: a ``share`` of subtasks read ``factor`` times as much (work and bytes)."""
    return tuple(w * (factor if rng.random() < share else 1.0) for w in work)


def cluster(n: int, slots: int = 2, cores: float | None = None, prefix: str = "n") -> tuple[NodeSpec, ...]:
    """``n`` identical nodes of ``slots`` slots each."""
    width = len(str(n - 1))
    return tuple(NodeSpec(name=f"{prefix}{i:0{width}d}", slots=slots, cores=cores) for i in range(n))


def slow_spells(nodes: Sequence[NodeSpec], share: float, factor: float, rng: random.Random,
                start: float = 0.0, end: float = math.inf) -> tuple[SlowSpell, ...]:
    """A ``share`` of ``nodes`` (chosen with ``rng``) at ``factor`` speed from ``start`` to ``end``."""
    count = max(1, round(share * len(nodes))) if share > 0 else 0
    return tuple(SlowSpell(n.name, factor, start, end) for n in rng.sample(list(nodes), count))


# -- what-if replay of a finished run ---------------------------------------------------------------


@dataclass(frozen=True)
class RecordedStage:
    """What a finished stage run recorded: its plan, attempts and the figures the journal shows."""

    name: str
    plan: Mapping[str, Any]
    attempts: tuple[Attempt, ...]
    admitted: Mapping[int, int]
    makespan: float
    attempt_seconds: float
    copies: int
    copies_won: int


def check_overrides(overrides: Mapping[str, str]) -> dict[str, Any]:
    """Parse ``--set`` values as ``[speculative]`` options; unknown names fail naming the known ones."""
    from airflow_provider_speculative.core.config import OPTION_BY_NAME, parse_option, unknown_options

    unknown = unknown_options(overrides)
    if unknown:
        raise ConfigError(f"whatif --set: unknown option(s) {', '.join(unknown)}; known options: "
                          f"{', '.join(OPTION_BY_NAME)}")
    return {name: parse_option(name, value, "whatif --set") for name, value in overrides.items()}


def read_stage(root: Any, dag_id: str, run_id: str, plan: Mapping[str, Any]) -> RecordedStage:
    """One finished stage run from the store: its attempts (as the read model polls them) and journal figures."""
    from airflow_provider_speculative.control.readmodel import observer
    from airflow_provider_speculative.store.layout import StageLayout, stage_key

    # Read by name on the layout's store: a POSIX directory or a store without paths.
    layout = StageLayout.at(root, dag_id, run_id, stage_key(plan))
    poll = observer(layout, "heartbeat")
    events = layout.store.read_journal(layout.name(layout.journal))
    now = max([float(e.get("at") or 0) for e in events] + [0.0])
    attempts = []
    admitted: dict[int, int] = {}
    for subtask in range(int(plan["parallelism"])):
        for number in layout.attempt_numbers(subtask):
            if layout.exists(layout.claim(subtask, number)):
                attempts.append(poll.poll(subtask, number, now))
        marker = layout.read_json(layout.admitted(subtask))
        if marker:
            admitted[subtask] = int(marker["attempt"])
    launches = [e for e in events if e.get("event") == Event.LAUNCH]
    complete = [float(e["at"]) for e in events if e.get("event") == Event.STAGE_COMPLETE]
    first = min((float(e["at"]) for e in launches), default=None)
    makespan = (max(complete) - first) if complete and first is not None else 0.0
    speculative = {(int(e["subtask"]), int(e["attempt"])) for e in launches if e.get("speculative")}
    seconds = sum(max(0.0, (a.end_at or now) - a.deploying_at) for a in attempts if a.deploying_at is not None)
    won = sum(1 for s, n in admitted.items() if (s, n) in speculative)
    return RecordedStage(stage_key(plan), plan, tuple(attempts), admitted, makespan, seconds,
                         len(speculative), won)


def read_run(root: Any, dag_id: str, run_id: str) -> list[RecordedStage]:
    """Every stage of a finished DAG run, producers first (``control/readmodel.py``'s order)."""
    from airflow_provider_speculative.control.readmodel import pipeline_order, run_plans
    from airflow_provider_speculative.exceptions import NotFoundError
    from airflow_provider_speculative.store.layout import shown_root, store_at

    plans = pipeline_order(list(run_plans(root, dag_id, run_id).values()))
    if not plans:
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} run {run_id!r} "
                            f"under {shown_root(store_at(root))}")
    return [read_stage(root, dag_id, run_id, plan) for plan in plans]


def scenario_from_run(stages: Sequence[RecordedStage], name: str = "replay") -> tuple[Scenario, SpeculativeConfig]:
    """A scenario that replays recorded stages, and the run's own configuration (from the first plan).

    Each target's speed is what the run measured of it (``core.speed.run_slowness`` over every stage's
    finished and cancelled attempts); a subtask's work is its admitted attempt's time from a ready session
    to its end, times its target's speed; the start-up cost is the median measured one.
    """
    config = SpeculativeConfig.from_json(dict(stages[0].plan.get("config") or {}))
    everything = [a for s in stages for a in s.attempts]
    sizes = {}
    slowness: dict[str, float] = {}
    for stage in stages:
        sizes = {i: int(s.get("input_bytes") or 0) for i, s in enumerate(stage.plan.get("subtasks") or [])}
        for target, factor in run_slowness(stage.attempts, {k: v for k, v in sizes.items() if v}).items():
            slowness[target] = max(slowness.get(target, 1.0), factor)
    startups = [a.startup_seconds for a in everything if a.startup_seconds is not None]
    startup = median(startups) if startups else 0.0
    names = [t.name for t in config.targets] + sorted({a.target for a in everything} - {t.name for t in config.targets})
    slots = {t.name: t.slots for t in config.targets}
    nodes = tuple(NodeSpec(name=n, slots=slots.get(n, 1), speed=1.0 / slowness.get(n, 1.0)) for n in names)
    specs = []
    for stage in stages:
        by_key = {(a.subtask, a.number): a for a in stage.attempts}
        work = []
        fallback = [_work_of(a) for a in stage.attempts if a.state == AttemptState.FINISHED]
        for subtask in range(int(stage.plan["parallelism"])):
            kept = by_key.get((subtask, stage.admitted.get(subtask, -1)))
            seconds = _work_of(kept) if kept is not None else (median(fallback) if fallback else 1.0)
            speed = 1.0 / slowness.get(kept.target, 1.0) if kept is not None else 1.0
            work.append(max(0.0, seconds * speed))
        size = [int(s.get("input_bytes") or 0) for s in stage.plan.get("subtasks") or []]
        specs.append(StageSpec(stage.name, tuple(work),
                               tuple(max(1, b) for b in size) if len(size) == len(work) and all(size) else None))
    return Scenario(name, nodes, tuple(specs), startup=startup), config


def _work_of(attempt: Attempt) -> float:
    """Seconds an attempt worked: from its ready session (or DEPLOYING) to its end."""
    start = attempt.ready_at if attempt.ready_at is not None else attempt.deploying_at
    if start is None or attempt.end_at is None:
        return 0.0
    return max(0.0, attempt.end_at - start)


def whatif(root: Any, dag_id: str, run_id: str, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Replay a finished run with its own settings and with ``overrides``; what happened next to both predictions."""
    parsed = check_overrides(overrides or {})
    stages = read_run(root, dag_id, run_id)
    scenario, config = scenario_from_run(stages, f"{dag_id}/{run_id}")
    recorded = Policy("recorded", source="the run's own plan.json configuration")
    predicted = Simulator(scenario, recorded, config=config).run()
    other = Simulator(scenario, recorded, config=config, overrides=parsed).run()

    def figures(result: RunResult) -> dict[str, Any]:
        return {"makespan": round(sum(s.makespan for s in result.stages), 3),
                "attempt_seconds": round(result.attempt_seconds, 3), "copies": result.copies,
                "copies_won": result.copies_won, "failed": result.failed,
                "stages": {s.name: round(s.makespan, 3) for s in result.stages}}

    real = {"makespan": round(sum(s.makespan for s in stages), 3),
            "attempt_seconds": round(sum(s.attempt_seconds for s in stages), 3),
            "copies": sum(s.copies for s in stages), "copies_won": sum(s.copies_won for s in stages),
            "failed": None, "stages": {s.name: round(s.makespan, 3) for s in stages}}
    return {"dag_id": dag_id, "run_id": run_id, "overrides": {k: str(v) for k, v in (overrides or {}).items()},
            "recorded": real, "replayed": figures(predicted), "whatif": figures(other),
            "model": {"startup": round(scenario.startup, 3),
                      "target_speeds": {n.name: round(n.speed, 3) for n in scenario.nodes}}}
