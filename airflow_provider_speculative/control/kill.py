"""Stopping a stage run's attempts: cancel the live ones, reap them, give their slots back.

A running :class:`~airflow_provider_speculative.control.controller.StageController` stops attempts through
:class:`AttemptStopper` with the state it holds. :func:`kill_stage` does the same from the store alone, for
code that has only a plan (planning a replanned or force-rerun stage, the trigger's ``on_kill``): it reads
the attempts and stops the live ones without building a scheduler, reading speed records or claiming probes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_speculative.backends.base import Backend
from airflow_provider_speculative.backends.registry import attempt_observer, plan_backends
from airflow_provider_speculative.control.slotledger import SlotLedger
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.sinks.base import Sink, StagingScope
from airflow_provider_speculative.store.journal import Journal
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import discard_attempt_output

Key = tuple[int, int]

# A kill keeps reaping this long past the backends' kill grace before it reports what is left.
REAP_MARGIN = 10.0
REAP_POLL = 0.2


@dataclass
class StoredAttempts:
    """A stage run's attempts as the store shows them."""

    attempts: list[Attempt]
    admitted: dict[int, int]
    # Cancelled attempts whose work is not gone yet: still live, or with a session on their target to stop.
    reaping: set[Key]


def read_attempts(layout: StageLayout, parallelism: int, observer: Backend, backend_of: Callable[[str], Backend],
                  now: float) -> StoredAttempts:
    """Every claimed attempt of a stage run polled once, the admissions, and the cancelled attempts still to reap.

    A cancelled attempt that is still live is reported CANCELING.
    """
    attempts: list[Attempt] = []
    admitted: dict[int, int] = {}
    reaping: set[Key] = set()
    for subtask in range(parallelism):
        numbers, marked = layout.subtask_listing(subtask)
        for number in numbers:
            if layout.exists(layout.claim(subtask, number)):
                attempt = observer.poll(subtask, number, now)
                attempts.append(attempt)
                cancelled = layout.read_json(layout.cancel(subtask, number)) is not None
                if cancelled and attempt.live:
                    attempt.state = AttemptState.CANCELING
                    reaping.add((subtask, number))
                elif cancelled and backend_of(attempt.target).cleanup_pending(subtask, number):
                    # The client is gone but its target still has work to stop (a Connect session).
                    reaping.add((subtask, number))
        # Absent from the listing is as good as a read that missed it; its record (a recovery may replace it) is
        # read fresh when there.
        marker = layout.read_json(layout.admitted(subtask)) if marked else None
        if marker is not None:
            admitted[subtask] = marker["attempt"]
    return StoredAttempts(attempts, admitted, reaping)


class AttemptStopper:
    """Cancels and reaps one stage run's attempts; removes what a stopped attempt leaves (output, sink staging)."""

    def __init__(self, plan: StagePlan, layout: StageLayout, journal: Callable[..., Any],
                 backend_of: Callable[[str], Backend], extra_env: dict[str, str]) -> None:
        self.plan = plan
        self.layout = layout
        self.journal = journal
        self.backend_of = backend_of
        # A sink's secrets (its DSN) for removing staging: in memory only.
        self.extra_env = extra_env
        # Rebuilt only when an attempt's sink staging must go: the sink's module may not import everywhere.
        self.sink_json: dict[str, Any] | None = (plan.get("output") or {}).get("sink")

    def reap(self, reaping: set[Key], target_of: Callable[[int, int], str], admitted: Mapping[int, int],
             now: float) -> None:
        """Drop from ``reaping`` the attempts whose work is gone; remove their output unless admitted."""
        for subtask, number in sorted(reaping):
            if self.backend_of(target_of(subtask, number)).reap(subtask, number, now):
                reaping.discard((subtask, number))
                if admitted.get(subtask) != number:
                    discard_attempt_output(self.layout, subtask, number)
                    self.cleanup_sink_staging(subtask, number)

    def cleanup_sink_staging(self, subtask: int, attempt: int) -> None:
        """Drop what a discarded or cancelled attempt staged in the sink (e.g. its Postgres staging table)."""
        if not self.sink_json:
            return
        scope = StagingScope(self.plan["dag_id"], self.plan["run_id"], self.layout.stage, ((subtask, attempt),),
                             env=self.extra_env)
        try:
            removed = Sink.from_json(self.sink_json).cleanup_staging(scope)
        except Exception as exc:  # the sink may be unreachable; finalize or gc removes it later
            self.journal(Event.SINK_STAGING_CLEANUP_FAILED, subtask=subtask, attempt=attempt,
                         error=f"{type(exc).__name__}: {exc}")
            return
        if removed:
            self.journal(Event.SINK_STAGING_REMOVED, subtask=subtask, attempt=attempt, objects=removed)

    def kill(self, attempts: Iterable[Attempt], reaping: set[Key], *, target_of: Callable[[int, int], str],
             admitted: Mapping[int, int], slots: SlotLedger, reason: str, kill_grace: float,
             clock: Callable[[], float]) -> None:
        """Cancel every live attempt and wait (bounded) until their work is gone; give back the gone ones' slots."""
        for attempt in attempts:
            backend = self.backend_of(attempt.target)
            if backend.poll(attempt.subtask, attempt.number).live:
                backend.cancel(attempt.subtask, attempt.number, reason)
                reaping.add((attempt.subtask, attempt.number))
        deadline = clock() + kill_grace + REAP_MARGIN
        while reaping and clock() < deadline:
            self.reap(reaping, target_of, admitted, clock())
            time.sleep(REAP_POLL)
        held = slots.held
        slots.release_gone([k for k in held if k not in reaping],
                           live=lambda key: self.backend_of(held[key][0]).poll(*key).live)
        self.journal(Event.KILLED_ALL, reason=reason, left=sorted(reaping))


def kill_stage(plan: StagePlan, reason: str, *, extra_env: dict[str, str] | None = None,
               target_env: dict[str, dict[str, str]] | None = None, backends: dict[str, Backend] | None = None,
               observer: Backend | None = None, clock: Callable[[], float] = time.time) -> list[Key]:
    """Stop every live attempt of a stage run from the store alone; the attempts still not gone, as (subtask, attempt).

    Cancel markers are written and process groups and Connect sessions stopped by the targets' backends,
    as a running controller's ``kill_all`` does; the journal gets ``restored`` (what was read) and
    ``killed_all``. ``target_env`` and ``extra_env`` are the secrets a backend or sink needs to reach its
    target (a Connect token, a sink's DSN), kept in memory only.
    """
    layout = StageLayout.of_plan(plan)
    config = SpeculativeConfig.from_json(plan["config"])
    journal = Journal.of_stage(layout, clock)
    targets = {name: dict(env) for name, env in (target_env or {}).items()}
    backends = backends if backends is not None else plan_backends(plan, layout, targets)
    observer = observer if observer is not None else attempt_observer(layout)

    def backend_of(target: str) -> Backend:
        return backends.get(target) or observer

    stored = read_attempts(layout, plan["parallelism"], observer, backend_of, clock())
    slots = SlotLedger(layout, config, journal)
    slots.restore()
    if stored.attempts:
        journal(Event.RESTORED, attempts=len(stored.attempts), admitted=stored.admitted)
    target_by_key = {(a.subtask, a.number): a.target for a in stored.attempts}
    stopper = AttemptStopper(plan, layout, journal, backend_of, dict(extra_env or {}))
    reaping = set(stored.reaping)
    stopper.kill(stored.attempts, reaping, target_of=lambda s, n: target_by_key.get((s, n), "?"),
                 admitted=stored.admitted, slots=slots, reason=reason,
                 kill_grace=max(b.kill_grace for b in [observer, *backends.values()]), clock=clock)
    return sorted(reaping)
