"""Shorthands for feeding a StageScheduler through its one entry point, ``handle``."""

from __future__ import annotations

from collections.abc import Iterable

from airflow_provider_speculative.core.messages import Action, AttemptObserved, Restored, Tick
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import Attempt


def step(sched: StageScheduler, now: float, updates: Iterable[Attempt] = ()) -> list[Action]:
    """Observations, then a tick: what one controller check does."""
    return sched.handle(*[AttemptObserved(u) for u in updates], Tick(now))


def restore(sched: StageScheduler, attempts: Iterable[Attempt], admitted: dict[int, int],
            blocked: dict[str, float]) -> list[Action]:
    """What a restarted controller read from the store."""
    return sched.handle(Restored(tuple(attempts), admitted, blocked))
