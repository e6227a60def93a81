"""A 10,000-subtask stage through a few controller steps: placement work grows with changes, not waiting x targets.

Counted, never timed: calls of the predicates placement evaluates per target or per waiting subtask
(a blocked node, a slow target, an attempt that may still finish, the hold rule). The rule the counts
check is the project's: a step costs O(targets + what changed), so a stage whose slots are all taken
does not walk every waiting subtask against every target each check interval.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from statistics import median
from typing import Any

import pytest

from airflow_provider_speculative.core.blocklist import Blocklist
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.detector import MIN_PROGRESS, Baseline, compute_baseline, progress_share
from airflow_provider_speculative.core.messages import AttemptObserved, Launch, TargetsObserved, Tick
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.speed import MAX_SLOWNESS, HoldPlanner, Speeds
from airflow_provider_speculative.core.states import EXECUTING, Attempt, AttemptState
from airflow_provider_speculative.devtools.simulator import (
    POLICIES,
    NodeLoss,
    Scenario,
    Simulator,
    StageSpec,
    cluster,
    lognormal_work,
    pareto_work,
    skewed,
    slow_spells,
)

SUBTASKS = 10_000
TARGETS = 100
SLOTS = 2
SLOW = 10  # t0..t9: an earlier run found them 4x slower, so originals are held for faster targets


def _count(monkeypatch: pytest.MonkeyPatch, calls: Counter[str], owner: type, name: str) -> None:
    original = owner.__dict__[name]
    if isinstance(original, property):
        getter: Callable[[Any], Any] = original.fget  # type: ignore[assignment]

        def counted_property(self: Any) -> Any:
            calls[name] += 1
            return getter(self)

        monkeypatch.setattr(owner, name, property(counted_property))
        return

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counter: Counter[str] = Counter()
    for owner, name in ((Blocklist, "is_blocked"), (Speeds, "is_slow"), (Attempt, "possible_to_finish"),
                        (HoldPlanner, "hold_for")):
        _count(monkeypatch, counter, owner, name)
    return counter


def _observed(free: int) -> TargetsObserved:
    names = [f"t{i}" for i in range(TARGETS)]
    return TargetsObserved(free={n: free for n in names}, capacity={n: SLOTS for n in names})


def test_a_full_cluster_step_costs_targets_not_waiting_subtasks_times_targets(calls: Counter[str]) -> None:
    targets = tuple(Target(name=f"t{i}", slots=SLOTS) for i in range(TARGETS))
    sched = StageScheduler(parallelism=SUBTASKS, config=SpeculativeConfig(enabled=True, targets=targets),
                           input_bytes=dict.fromkeys(range(SUBTASKS), 1000),
                           target_history={f"t{i}": 4.0 for i in range(SLOW)})

    first = sched.handle(_observed(SLOTS), Tick(0.0))
    launched = [a for a in first if isinstance(a, Launch)]
    # Every fast slot is taken; a slow target runs one original at a time; the rest wait for faster slots.
    per_target = Counter(a.target for a in launched)
    assert per_target == {f"t{i}": SLOTS if i >= SLOW else 1 for i in range(TARGETS)}
    assert len(sched.held_back) == SUBTASKS - len(launched)
    first_round = sum(calls.values())

    calls.clear()
    running = [AttemptObserved(replace(sched.attempts[a.subtask][a.attempt], state=AttemptState.RUNNING,
                                       deploying_at=1.0)) for a in launched]
    assert sched.handle(*running, _observed(0), Tick(1.0)) == []
    observed_step = sum(calls.values())

    calls.clear()
    quiet_ticks = 5
    for now in range(2, 2 + quiet_ticks):
        assert sched.handle(_observed(0), Tick(float(now))) == []
    quiet = sum(calls.values())

    calls.clear()
    done = [AttemptObserved(replace(sched.attempts[a.subtask][a.attempt], state=AttemptState.FINISHED,
                                    end_at=30.0)) for a in launched]
    second = [a for a in sched.handle(*done, _observed(SLOTS), Tick(30.0)) if isinstance(a, Launch)]
    assert len(sched.admitted) == len(launched) and second
    refill = sum(calls.values())

    # O(subtasks + targets) to place a wave (the subtasks held back are judged once per slow target, not
    # once per fast target each); a step that saw attempts costs O(what it saw); a step that saw nothing,
    # with no slot free anywhere, costs O(targets) whatever the number of waiting subtasks.
    assert first_round <= 4 * (SUBTASKS + TARGETS), calls
    assert observed_step <= 4 * (len(running) + TARGETS)
    assert quiet <= 4 * quiet_ticks * TARGETS
    assert refill <= 4 * (len(done) + SUBTASKS + TARGETS)
    assert calls["hold_for"] <= len(second) + 2 * TARGETS


# -- the baseline view, speed view and slow watch decide exactly as the straightforward rules ----------------


def _reference_judge(attempts: list[Attempt], baseline: Baseline | None, now: float,
                     input_bytes: dict[int, int]) -> list[tuple[Attempt, str]]:
    """judge_slow as it was: every executing attempt judged again."""
    if baseline is None:
        return []
    slow = []
    for attempt in attempts:
        if attempt.state not in (AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING):
            continue
        size = input_bytes.get(attempt.subtask) or attempt.input_bytes
        threshold = baseline.threshold(size)
        elapsed = attempt.execution_time(now)
        if elapsed >= threshold:
            slow.append((attempt, f"ran {elapsed:.1f}s >= {threshold:.1f}s ({baseline.source} baseline)"))
            continue
        if elapsed < baseline.floor:
            continue
        share = progress_share(attempt, baseline.read_ratio)
        if share is None or share < MIN_PROGRESS:
            continue
        projected = elapsed / share
        copy = (baseline.startup or 0.0) + threshold / max(1.0, baseline.factor)
        if projected >= threshold and projected - elapsed > copy:
            slow.append((attempt, f"projected {projected:.1f}s from {share:.0%} read in {elapsed:.1f}s; "
                                  f"a copy needs ~{copy:.1f}s"))
    return slow


def _reference_observe(attempts: list[Attempt], input_bytes: dict[int, int], now: float,
                       history: dict[str, float], history_source: dict[str, str]) -> Speeds:
    """observe as it was: every attempt's rate each round."""
    finished: dict[str, list[float]] = {}
    running: dict[str, float] = {}
    for attempt in attempts:
        size = input_bytes.get(attempt.subtask) or attempt.input_bytes or 0
        if size <= 0 or attempt.deploying_at is None:
            continue
        if attempt.state == AttemptState.CANCELED:
            if attempt.end_at is None:
                continue
            rate = max(0.0, attempt.end_at - attempt.deploying_at - attempt.input_wait) / size
        else:
            rate = attempt.execution_time(now) / size
        if attempt.state == AttemptState.FINISHED:
            finished.setdefault(attempt.target, []).append(rate)
        elif attempt.state in EXECUTING or attempt.state == AttemptState.CANCELED:
            running[attempt.target] = max(running.get(attempt.target, 0.0), rate)
    measured = {target: median(rates) for target, rates in finished.items()}
    slowness: dict[str, float] = {}
    source: dict[str, str] = {}
    fastest = min(measured.values()) if measured else None
    if fastest:
        for target, rate in measured.items():
            slowness[target] = min(MAX_SLOWNESS, max(rate, running.get(target, 0.0)) / fastest)
            source[target] = "run"
        for target, rate in running.items():
            remembered = history.get(target, 0.0)
            if target not in measured and rate > fastest and rate / fastest > remembered:
                slowness[target] = min(MAX_SLOWNESS, rate / fastest)
                source[target] = "run (unfinished attempts)"
    for target, factor in history.items():
        if target not in slowness and factor > 0:
            slowness[target] = min(MAX_SLOWNESS, max(1.0, factor))
            source[target] = history_source.get(target, "history")
    return Speeds(slowness=slowness, source=source, fastest_per_byte=fastest)


class _Recording(StageScheduler):
    """Keeps, per handle call, the actions and what they were decided from (speeds, baseline, slow subtasks)."""

    log: list[tuple[Any, ...]]

    def handle(self, *stimuli: Any) -> list[Any]:
        actions = super().handle(*stimuli)
        if not hasattr(self, "log"):
            self.log = []
        self.log.append((list(actions), self.speeds, self.baseline, self.slow_subtasks, dict(self.slow_reasons)))
        return actions


class _Reference(_Recording):
    """Every attempt observed, judged and counted again each step, as before the views."""

    def _compute_baseline(self) -> Baseline | None:
        finished = [self.attempts[s][n] for s, n in self.admitted.items()
                    if n in self.attempts[s] and self.attempts[s][n].deploying_at is not None]
        return compute_baseline(self.parallelism, finished, ratio=self.config.baseline_ratio,
                                multiplier=self.config.baseline_multiplier,
                                lower_bound=self.config.baseline_lower_bound, input_bytes=self.input_bytes,
                                normalize_by_input_bytes=self.config.normalize_by_input_bytes)

    def _judge(self, now: float) -> list[tuple[Attempt, str]]:
        candidates = [a for subtask, per in self.attempts.items()
                      if subtask not in self.admitted and subtask not in self.reused for a in per.values()]
        return _reference_judge(candidates, self.baseline, now, self.input_bytes)

    def _observe_speeds(self, now: float) -> Speeds:
        return _reference_observe(self.all_attempts(), self.input_bytes, now, self.target_history,
                                  self.history_source)

    def _hold_inputs(self) -> tuple[list[Attempt], set[str]]:
        return self.live_attempts(), {a.target for a in self.all_attempts()}


class _Sim(Simulator):
    """A simulator whose stages run on ``kind`` (the scheduler under test or the reference)."""

    kind: type[StageScheduler] = _Recording

    def _new_scheduler(self, stage: StageSpec) -> StageScheduler:
        built = super()._new_scheduler(stage)
        sched = self.kind(parallelism=built.parallelism, config=built.config, input_bytes=built.input_bytes,
                          label=built.label, target_history=built.target_history,
                          history_source=built.history_source)
        self.logs.append(sched)
        return sched

    @property
    def logs(self) -> list[StageScheduler]:
        if "_logs" not in self.__dict__:
            self.__dict__["_logs"] = []
        return self.__dict__["_logs"]  # type: ignore[no-any-return]


def _scenarios(seed: int) -> list[Scenario]:
    rng = random.Random(seed)
    nodes = cluster(12, slots=2)
    work = skewed(lognormal_work(60, rng, 10.0, 0.3), rng, share=0.1, factor=2.0)
    slow = Scenario("slow", nodes, (StageSpec("s", work),), startup=0.5, spells=slow_spells(nodes, 0.25, 0.25, rng))
    spell = Scenario("spell and loss", nodes, (StageSpec("s", work),), startup=0.5,
                     spells=slow_spells(nodes, 0.2, 0.125, rng, 5.0, 25.0),
                     losses=(NodeLoss(nodes[rng.randrange(12)].name, 8.0),))
    speeds = [1.0, 1.0, 1.0, 0.5, 0.5, 0.25] * 2
    rng.shuffle(speeds)
    hetero = tuple(replace(n, speed=s) for n, s in zip(nodes, speeds, strict=True))
    stages = (StageSpec("first", work), StageSpec("second", lognormal_work(30, rng, 10.0, 0.3)))
    two = Scenario("heterogeneous, two stages", hetero, stages, startup=0.5, speed_check=0.15)
    heavy = Scenario("heavy tail", nodes, (StageSpec("s", pareto_work(60, rng, 10.0)),), startup=0.5)
    return [slow, spell, two, heavy]


def _run(kind: type[StageScheduler], scenario: Scenario, policy: str, progress: bool) -> list[list[Any]]:
    sim = _Sim(scenario, POLICIES[policy], report_progress=progress)
    sim.kind = kind
    sim.run()
    return [s.log for s in sim.logs]  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_incremental_views_decide_exactly_as_the_full_rescans(seed: int) -> None:
    # Same actions in the same order, from the same speeds, baselines and slow subtasks, step by step.
    runs = 0
    for scenario in _scenarios(seed):
        for policy in ("provider", "flink", "none"):
            for progress in (False, True):
                incremental = _run(_Recording, scenario, policy, progress)
                reference = _run(_Reference, scenario, policy, progress)
                assert incremental == reference, (scenario.name, policy, progress)
                assert sum(len(log) for log in incremental) > 20
                runs += 1
    assert runs == 24
