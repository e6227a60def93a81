"""A DAG run's stages overlapping on one shared pool, in simulated time, around the real scheduler core.

``devtools/simulator.py`` runs stages one after the other; under Airflow's scheduler independent stages
of a run overlap and share their targets' slots, and which of them gets a freed slot is
``[speculative] slot_priority``'s to decide (core/priority.py). This simulator runs one
:class:`~airflow_provider_speculative.core.scheduler.StageScheduler` per stage, each stepped as its
controller steps it (every ``check_interval``, sooner after a change of its own attempts: a change notice),
over slots that every stage claims from the same nodes. Each step is the controller's
(``control/controller.py``): what changed, the targets with the free slots this stage may claim (the
demand of the stages ahead subtracted by the same :func:`~airflow_provider_speculative.core.priority.claimable_slots`,
read from a board the stages publish to as they would to the store), a ``Tick``; the slots of ended
attempts given back, and placed again in the same step. A stage starts ``stage_gap`` seconds after its
last upstream completed (Airflow scheduling it, planning), the sources at 0 in the order given, which
is also the order in which stages due at the same instant step.

It models only time: attempts take a start-up (their client's, off the node's cores), then their work at
their node's speed, shared by the attempts working there when a node has fewer cores than slots
(processor sharing); no failures, no
speculation (a run's claim order, not its copies, is what it compares). Time advances in fixed steps of
``dt`` seconds, so its cost is O(simulated seconds / dt x (nodes + live attempts)) plus the cores' steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from airflow_provider_speculative.core.config import CRITICAL_PATH, SpeculativeConfig, Target
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph
from airflow_provider_speculative.core.graph import StageSpec as GraphStage
from airflow_provider_speculative.core.messages import (
    Action,
    AttemptObserved,
    CompleteStage,
    FailStage,
    Launch,
    Stimulus,
    TargetsObserved,
    Tick,
)
from airflow_provider_speculative.core.priority import Demand, claimable_slots, published_pending, stage_priorities
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.devtools.simulator import NOTICE_DELAY, WAKE_GAP, NodeSpec
from airflow_provider_speculative.exceptions import ConfigError


@dataclass(frozen=True)
class RunStage:
    """A stage of the run: seconds of work per subtask at speed 1, and the stages it reads."""

    name: str
    work: tuple[float, ...]
    upstreams: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunScenario:
    """Nodes (one target each), the run's stages, an attempt's start-up and a stage's start after its upstreams."""

    name: str
    nodes: tuple[NodeSpec, ...]
    stages: tuple[RunStage, ...]
    startup: float = 2.0
    stage_gap: float = 1.5


@dataclass(frozen=True)
class StageSpan:
    """When a stage started (its controller's first step) and completed, in simulated seconds."""

    name: str
    start: float
    end: float
    priority: float


@dataclass
class RunOutcome:
    """What one simulated run did, per stage."""

    scenario: str
    slot_priority: str
    stages: dict[str, StageSpan]

    @property
    def makespan(self) -> float:
        """From the run's start to its last stage's completion."""
        return max(s.end for s in self.stages.values())


@dataclass
class _Attempt:
    stage: str
    subtask: int
    number: int
    node: str
    launched_at: float
    startup: float
    work: float
    done: float = 0.0
    ready_at: float | None = None
    end_at: float | None = None
    holds: bool = True

    @property
    def state(self) -> AttemptState:
        if self.end_at is not None:
            return AttemptState.FINISHED
        return AttemptState.RUNNING if self.ready_at is not None else AttemptState.DEPLOYING

    def observed(self) -> Attempt:
        return Attempt(subtask=self.subtask, number=self.number, target=self.node, state=self.state, node=self.node,
                       created_at=self.launched_at, deploying_at=self.launched_at, launched_at=self.launched_at,
                       ready_at=self.ready_at, end_at=self.end_at,
                       exit_code=0 if self.end_at is not None else None)


@dataclass
class _Stage:
    spec: RunStage
    sched: StageScheduler
    priority: float
    start: float
    next_step: float
    last_step: float = -1e9
    changed: set[tuple[int, int]] = field(default_factory=set)
    attempts: dict[tuple[int, int], _Attempt] = field(default_factory=dict)
    end: float | None = None


class RunSimulator:
    """Steps every started stage's scheduler over shared nodes; see the module docstring."""

    def __init__(self, scenario: RunScenario, slot_priority: str = CRITICAL_PATH, *, check_interval: float = 1.0,
                 notice_delay: float = NOTICE_DELAY, wake_gap: float = WAKE_GAP, dt: float = 0.01) -> None:
        names = [s.name for s in scenario.stages]
        unknown = sorted({u for s in scenario.stages for u in s.upstreams} - set(names))
        if unknown or len(set(names)) != len(names):
            raise ConfigError(f"scenario {scenario.name}: unknown upstreams {unknown} or stage names repeated")
        self.scenario = scenario
        self.targets = tuple(Target(name=n.name, slots=n.slots) for n in scenario.nodes)
        self.config = SpeculativeConfig().with_overrides(
            {"slot_priority": slot_priority, "check_interval": check_interval}, "simulation")
        self.config = replace(self.config, targets=self.targets)
        self.notice_delay, self.wake_gap, self.dt = notice_delay, wake_gap, dt
        graph = PipelineGraph(scenario.name, {
            s.name: GraphStage(s.name, f"{s.name}.py", len(s.work), {u: ExchangeSpec(u) for u in s.upstreams})
            for s in scenario.stages})
        self.priorities = stage_priorities(graph, sum(n.slots for n in scenario.nodes))
        self.held = {n.name: 0 for n in scenario.nodes}
        self.board: dict[str, Demand] = {}
        self.stages: dict[str, _Stage] = {}
        self.now = 0.0

    def run(self, max_time: float = 3600.0) -> RunOutcome:
        """Simulate until every stage completed; raise if one failed or the run exceeds ``max_time``."""
        pending = list(self.scenario.stages)
        while pending or any(s.end is None for s in self.stages.values()):
            if self.now > max_time:
                raise RuntimeError(f"simulation {self.scenario.name}: not done within {max_time:.0f} s")
            self._advance()
            for spec in list(pending):
                ready = [self.stages[u].end for u in spec.upstreams if u in self.stages]
                if len(ready) == len(spec.upstreams) and all(e is not None for e in ready):
                    start = max([e for e in ready if e is not None], default=-self.scenario.stage_gap)
                    if start + self.scenario.stage_gap <= self.now + 1e-9:
                        pending.remove(spec)
                        self._open(spec)
            for stage in self.stages.values():
                if stage.end is None and stage.next_step <= self.now + 1e-9:
                    self._step(stage)
            self.now += self.dt
        return RunOutcome(self.scenario.name, self.config.slot_priority,
                          {name: StageSpan(name, s.start, s.end if s.end is not None else self.now, s.priority)
                           for name, s in self.stages.items()})

    # -- the world ---------------------------------------------------------------------------

    def _advance(self) -> None:
        """Progress every running attempt by ``dt`` at its node's speed shared by the attempts running there."""
        running: dict[str, list[_Attempt]] = {n.name: [] for n in self.scenario.nodes}
        for stage in self.stages.values():
            for attempt in stage.attempts.values():
                if attempt.end_at is None:
                    running[attempt.node].append(attempt)
        for node in self.scenario.nodes:
            live = running[node.name]
            if not live:
                continue
            working = [a for a in live if a.ready_at is not None]
            cores = node.cores if node.cores is not None else float(node.slots)
            rate = node.speed * min(1.0, cores / max(1, len(working)))
            for attempt in live:
                if attempt.ready_at is None:
                    # A Connect attempt's start-up is its client's (a process and a session): not the node's cores.
                    attempt.done += self.dt
                    if attempt.done >= attempt.startup:
                        attempt.ready_at, attempt.done = self.now, 0.0
                        self._changed(attempt)
                    continue
                attempt.done += rate * self.dt
                if attempt.done >= attempt.work:
                    attempt.end_at = self.now
                    self._changed(attempt)

    def _changed(self, attempt: _Attempt) -> None:
        """A change notice: the attempt's controller steps soon (not sooner than the wake gap after its last step)."""
        stage = self.stages[attempt.stage]
        stage.changed.add((attempt.subtask, attempt.number))
        stage.next_step = min(stage.next_step, max(self.now + self.notice_delay, stage.last_step + self.wake_gap))

    # -- the controllers ---------------------------------------------------------------------

    def _open(self, spec: RunStage) -> None:
        sched = StageScheduler(parallelism=len(spec.work), config=self.config,
                               label=f"simulation {self.scenario.name}, stage {spec.name}")
        stage = _Stage(spec, sched, float(self.priorities[spec.name]), start=self.now, next_step=self.now)
        self.stages[spec.name] = stage
        self._publish(stage, len(spec.work))

    def _publish(self, stage: _Stage, waiting: int) -> None:
        if self.config.slot_priority == CRITICAL_PATH:
            self.board[stage.spec.name] = Demand(stage.spec.name, stage.priority,
                                                 published_pending(waiting, sum(t.slots for t in self.targets)),
                                                 tuple(t.name for t in self.targets), self.now)

    def _targets(self, stage: _Stage) -> TargetsObserved:
        free = {t.name: max(0, t.slots - self.held[t.name]) for t in self.targets}
        own: dict[str, int] = {}
        for attempt in stage.attempts.values():
            if attempt.holds:
                own[attempt.node] = own.get(attempt.node, 0) + 1
        yielded: dict[str, int] = {}
        if self.config.slot_priority == CRITICAL_PATH and stage.sched.wants_slots and any(free.values()):
            free, yielded = claimable_slots(free, stage.priority, self.board.values(), stage.spec.name, self.now)
        return TargetsObserved(free=free, capacity={t.name: t.slots for t in self.targets}, yielded=yielded,
                               others={t.name: self.held[t.name] - own.get(t.name, 0) for t in self.targets})

    def _step(self, stage: _Stage) -> None:
        stage.last_step = self.now
        stage.next_step = self.now + self.config.check_interval
        stimuli: list[Stimulus] = [AttemptObserved(stage.attempts[k].observed()) for k in sorted(stage.changed)]
        stage.changed = set()
        self._carry_out(stage, stage.sched.handle(*stimuli, self._targets(stage), Tick(self.now)))
        if self._release(stage) and stage.end is None:
            self._carry_out(stage, stage.sched.handle(self._targets(stage), Tick(self.now)))
            self._release(stage)
        self._publish(stage, 0 if stage.end is not None else stage.sched.originals_waiting)

    def _carry_out(self, stage: _Stage, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Launch):
                self.held[action.target] += 1
                stage.attempts[(action.subtask, action.attempt)] = _Attempt(
                    stage.spec.name, action.subtask, action.attempt, action.target, self.now, self.scenario.startup,
                    stage.spec.work[action.subtask])
            elif isinstance(action, CompleteStage):
                stage.end = self.now
            elif isinstance(action, FailStage):
                raise RuntimeError(f"simulation {self.scenario.name}: stage {stage.spec.name} failed: {action.reason}")

    def _release(self, stage: _Stage) -> int:
        released = 0
        for attempt in stage.attempts.values():
            if attempt.holds and attempt.end_at is not None:
                known = stage.sched.attempts.get(attempt.subtask, {}).get(attempt.number)
                if known is not None and not known.live:
                    attempt.holds = False
                    self.held[attempt.node] -= 1
                    released += 1
        return released


def simulate_run(scenario: RunScenario, slot_priority: str = CRITICAL_PATH, **kwargs: float) -> RunOutcome:
    """Run ``scenario`` with ``slot_priority`` (``critical_path`` or ``fifo``)."""
    return RunSimulator(scenario, slot_priority, **kwargs).run()


def tpch_q3(scans_first: Sequence[str] = ("scan_customer", "scan_orders", "scan_lineitem"), *,
            startup: float = 2.0, stage_gap: float = 1.5) -> RunScenario:
    """TPC-H Q3's stages as dags/tpch_q3.py declares them, on two 1-core nodes with 2 slots each.

    Work per subtask is a model (scan_lineitem the largest, as in the benchmark's run), not a measurement;
    ``scans_first`` is the order in which the three scans start and step.
    """
    scans = {"scan_customer": RunStage("scan_customer", (0.5,) * 2),
             "scan_orders": RunStage("scan_orders", (0.8,) * 4),
             "scan_lineitem": RunStage("scan_lineitem", (1.5,) * 8)}
    stages = (*(scans[name] for name in scans_first),
              RunStage("join_orders", (1.0,) * 2, ("scan_customer", "scan_orders")),
              RunStage("join_lineitem", (1.0,) * 4, ("join_orders", "scan_lineitem")),
              RunStage("top", (0.3,), ("join_lineitem",)))
    nodes = (NodeSpec("connect-a", slots=2, cores=1.0), NodeSpec("connect-b", slots=2, cores=1.0))
    return RunScenario("tpch_q3", nodes, stages, startup=startup, stage_gap=stage_gap)
