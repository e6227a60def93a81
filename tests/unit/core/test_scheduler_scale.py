"""A 10,000-subtask stage through a few controller steps: placement work grows with changes, not waiting x targets.

Counted, never timed: calls of the predicates placement evaluates per target or per waiting subtask
(a blocked node, a slow target, an attempt that may still finish, the hold rule). The rule the counts
check is the project's: a step costs O(targets + what changed), so a stage whose slots are all taken
does not walk every waiting subtask against every target each check interval.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from airflow_provider_speculative.core.blocklist import Blocklist
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.messages import AttemptObserved, Launch, TargetsObserved, Tick
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.speed import HoldPlanner, Speeds
from airflow_provider_speculative.core.states import Attempt, AttemptState

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
