"""StageController: the I/O around the core scheduler (poll, act, journal). No Airflow import.

The trigger calls :meth:`StageController.step` every check interval. All state lives in the store,
so a controller opened from the same plan (triggerer restart, HA double-run) reconnects to the
running attempts instead of launching them again. Constructing one reads nothing: :meth:`StageController.open`
does the store and network I/O, and :func:`~airflow_provider_speculative.control.kill.kill_stage` stops a
stage's attempts without a controller.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from airflow_provider_speculative.backends.base import Backend, LaunchSpec
from airflow_provider_speculative.backends.registry import (
    CONNECT_KIND,
    attempt_observer,
    plan_backends,
    prestart_fork_server,
)
from airflow_provider_speculative.control.attemptlog import attempt_lines
from airflow_provider_speculative.control.hybrid import HybridInputWatcher
from airflow_provider_speculative.control.kill import AttemptStopper, read_attempts
from airflow_provider_speculative.control.liveness import TargetWatcher
from airflow_provider_speculative.control.recovery import PartitionRecovery, attempt_command
from airflow_provider_speculative.control.slotledger import SlotLedger
from airflow_provider_speculative.control.speedcheck import CHECK_TIMEOUT, check_needed, check_speeds
from airflow_provider_speculative.control.summary import stage_summary
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.contract import REMOTE_ENV, attempt_env
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.failover import input_readers
from airflow_provider_speculative.core.faults import Faults
from airflow_provider_speculative.core.faults import current as current_faults
from airflow_provider_speculative.core.hybrid import hybrid_edges
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
    InputRestored,
    InputWithdrawn,
    Invalidate,
    Launch,
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
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.core.priority import CRITICAL_PATH, claimable_slots, published_pending
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.slots import TargetView
from airflow_provider_speculative.core.speed import probe_candidates, run_slowness
from airflow_provider_speculative.core.states import TERMINAL, Attempt, AttemptState
from airflow_provider_speculative.core.summary import StageSummary
from airflow_provider_speculative.core.trigger_events import ControllerEvent, TriggerStatus
from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.demand import DemandBoard
from airflow_provider_speculative.store.journal import Journal
from airflow_provider_speculative.store.layout import StageLayout, stage_key
from airflow_provider_speculative.store.results import discard_attempt_output
from airflow_provider_speculative.store.speeds import (
    SPEED_CHECK,
    SpeedRecord,
    claim_probe,
    claim_speed_check,
    read_records,
    record_speeds,
    speed_check_claimed_at,
)

# Every live attempt's files are re-read at least this often, notices or not (lost notices, launch
# timeouts); its process is probed (a signal 0 on this host) at least this often.
FULL_POLL_PERIOD = 300.0
PROBE_PERIOD = 5.0
SUMMARY_REFRESH = 10.0
# A change notice (an attempt started, became ready or ended) wakes the controller before its
# check_interval, so a freed slot is refilled and a decided stage is seen within a fraction of a second.
# Early steps stay within this share of one core: the next one waits at least the last step's CPU
# time divided by WAKE_DUTY (and at least WAKE_FLOOR), so a 10,000-attempt stage is not stepped in a loop.
WAKE_DUTY = 0.1
WAKE_FLOOR = 0.05
# How often a waiting controller looks for a notice on POSIX (one directory read); each store says its own
# (StoreBackend.notice_poll_seconds: 1 s on S3, where a look is a listing request).
NOTICE_POLL = 0.1
# Rounds of outcomes fed back to the scheduler within one call of StageController._run: far more than
# any chain of lost slots, claims and admissions needs, so reaching it means the two feed each other forever.
MAX_ROUNDS = 10_000


def wait_for_next_step(controllers: list[StageController]) -> None:
    """Block until a step is due: the soonest check_interval of ``controllers``, or sooner on a change notice."""
    if not controllers:
        return
    interval = min(c.config.check_interval for c in controllers)
    poll = min(c.notice_poll for c in controllers)
    started = time.monotonic()
    time.sleep(min(c.wake_after() for c in controllers))
    while (left := interval - (time.monotonic() - started)) > 0 and not any(c.changed() for c in controllers):
        time.sleep(min(poll, left))


class StageController:
    """Drive one stage run: restore from the store, then poll attempts, feed the core, carry out its actions."""

    def __init__(self, plan: StagePlan, clock: Callable[[], float] = time.time,
                 extra_env: dict[str, str] | None = None,
                 target_env: dict[str, dict[str, str]] | None = None,
                 backends: dict[str, Backend] | None = None, observer: Backend | None = None,
                 watcher: TargetWatcher | None = None,
                 speed_check: Callable[[str], float] | None = None, faults: Faults | None = None) -> None:
        """Hold the plan and what it implies in memory; reads no store and no network (:meth:`open` does).

        ``faults``: the fault-injection hook (core/faults.py); by default this process's, which injects nothing
        unless a test set ``SPECULATIVE_FAULT_INJECTION``.
        """
        self.plan = plan
        # Secrets for the attempts (a sink's DSN, a Connect server's URL with its token): passed at
        # launch, never written to the store.
        self.extra_env = dict(extra_env or {})
        self.target_env = {name: dict(env) for name, env in (target_env or {}).items()}
        self.clock = clock
        # A server's answer time for the check query (tests pass a fake; default: a real RPC), used by open().
        self.speed_check = speed_check
        self.layout = StageLayout.of_plan(plan)
        self.config = SpeculativeConfig.from_json(plan["config"])
        self.faults = (faults if faults is not None else current_faults()).of_stage(self.layout.dag_id,
                                                                                     self.layout.stage)
        self.journal = Journal.of_stage(self.layout, clock)
        # One backend per target (its kind was resolved from the target's connection at plan time);
        # the observer reads any attempt the same way (targets of an older plan, unknown ones).
        self.backends: dict[str, Backend] = (backends if backends is not None
                                             else plan_backends(plan, self.layout, self.target_env))
        self.observer = observer if observer is not None else attempt_observer(self.layout)
        # The targets' history and probes are set by open() from the store, before the first stimulus.
        self.scheduler = StageScheduler(
            parallelism=plan["parallelism"], config=self.config,
            input_bytes={i: s["input_bytes"] for i, s in enumerate(plan["subtasks"]) if s.get("input_bytes")},
            speculation_blocker=plan.get("speculation_blocker"),
            input_readers=input_readers(plan),
            upstreams={name: (info["parallelism"], info["deterministic"])
                       for name, info in (plan.get("upstream_info") or {}).items()},
            label=f"pipeline {plan['dag_id']}, stage {plan['stage']}",
            hybrid=hybrid_edges(plan), faults=self.faults)
        # FLIP-159: slots belong to the target and are claimed in the store by every stage using it.
        self.slots = SlotLedger(self.layout, self.config, self.journal)
        self.watcher = watcher if watcher is not None else TargetWatcher(
            self.config, plan.get("targets") or {}, self.target_env, self.slots.stores)
        self.views: dict[str, TargetView] = {}
        # slot_priority = critical_path: this stage run's demand, and that of the stages of its run ahead of it.
        self.demand = (DemandBoard(self.layout, plan, tuple(t.name for t in self.config.targets))
                       if self.config.slot_priority == CRITICAL_PATH else None)
        self._lost_seen: set[str] = set()
        # Hybrid inputs (FLIP-235): the producers' admissions, read from their store as they happen (open()).
        self.hybrid: HybridInputWatcher | None = None
        self.stopper = AttemptStopper(plan, self.layout, self.journal, self._backend, self.extra_env)
        self.reaping: set[tuple[int, int]] = set()
        self._launch_failures: list[LaunchFailed] = []
        self._full_cursor = self._probe_cursor = 0
        self._rotated_at: float | None = None
        self._step_cpu = 0.0
        self._prestarted = False
        self._live: list[tuple[int, int]] | None = None
        self._live_stale = True
        self._summary: StageSummary | None = None
        self._summary_at = float("-inf")
        self.recoveries: dict[tuple[str, int], PartitionRecovery] = {}
        self.result: CompleteStage | FailStage | None = None
        # Change notices, read by name on the store's backend; removed only a grace period after this
        # controller read them, so another controller of the stage (a triggerer hand-over) reads them too.
        self.notices = changes.NoticeReader(self.layout.store, self.layout.name(self.layout.dir), clock,
                                            grace=max(changes.GRACE_SECONDS, 2 * self.config.check_interval))

    @classmethod
    def open(cls, plan: StagePlan, *, clock: Callable[[], float] = time.time,
             extra_env: dict[str, str] | None = None, target_env: dict[str, dict[str, str]] | None = None,
             backends: dict[str, Backend] | None = None, observer: Backend | None = None,
             watcher: TargetWatcher | None = None,
             speed_check: Callable[[str], float] | None = None, faults: Faults | None = None) -> StageController:
        """A controller ready to step: speed records read (checked if needed), probes claimed, state restored."""
        controller = cls(plan, clock, extra_env, target_env, backends, observer, watcher, speed_check, faults)
        controller._open()
        return controller

    def _open(self) -> None:
        """The I/O a controller needs before its first step, in this order: speeds, probes, hybrid inputs, restore."""
        plan = self.plan
        run_key = f"{plan['dag_id']}/{plan['run_id']}"
        records = self._check_speeds(run_key, self.speed_check)
        history = {t: r.slowness for t, r in records.items()}
        measured = frozenset(t for t, r in records.items() if r.of_run(run_key))
        # One probe original per DAG run for a target only an earlier run found slow (store/speeds.py).
        probes = frozenset(t for t in probe_candidates(history, measured)
                           if claim_probe(self.layout.store, t, run_key, self.clock()))
        self.scheduler.target_history = history
        self.scheduler.probe_targets = probes
        self.scheduler.history_source = {t: "speed check" for t, r in records.items() if r.checked_in(run_key)}
        if self.scheduler.hybrid:
            self.hybrid = HybridInputWatcher(plan, self.scheduler.hybrid, self.config.hybrid_input_timeout,
                                             self.clock())
        self._restore()

    # -- speed check ------------------------------------------------------------------------

    def _check_speeds(self, run_key: str, check: Callable[[str], float] | None) -> dict[str, SpeedRecord]:
        """The targets' speed records, after checking the Connect targets if history cannot tell (speedcheck.py).

        One stage of a DAG run checks (a claim in the store); a concurrent one waits for its records only
        while that check can still run (a later stage, or one after a check that found nothing, does not).
        """
        names = [t.name for t in self.config.targets]
        kinds = {name: spec.get("kind") for name, spec in (self.plan.get("targets") or {}).items()}
        urls = {name: url for name in names if kinds.get(name) == CONNECT_KIND
                and (url := self.target_env.get(name, {}).get(REMOTE_ENV))}
        now = self.clock()
        records = read_records(self.layout.store, names, now)
        if not check_needed(urls, records, run_key, now, self.config.speed_check_age):
            return records
        # A stage whose run checks is about to launch: the fork server imports while the check waits for the
        # servers, not after it (in a fresh process both take about a second).
        self._prestart()
        if claim_speed_check(self.layout.store, urls, run_key, now):
            started = self.clock()
            result = check_speeds(urls, check)
            slowness = result.slowness
            self.journal(Event.SPEED_CHECK, started=started, waited=round(result.waited, 3),
                         seconds={k: None if v is None else round(v, 3) for k, v in result.durations.items()},
                         slowness={k: round(v, 2) for k, v in slowness.items()}, failed=result.failed)
            record_speeds(self.layout.store, slowness, self.clock(), f"{run_key}/{SPEED_CHECK}")
            return read_records(self.layout.store, names, self.clock())
        claimed = speed_check_claimed_at(self.layout.store, urls, run_key)
        left = 0.0 if claimed is None else claimed + CHECK_TIMEOUT + 1.0 - self.clock()
        deadline = time.monotonic() + min(max(0.0, left), CHECK_TIMEOUT + 1.0)
        while not all(t in records and records[t].of_run(run_key) for t in urls) and time.monotonic() < deadline:
            time.sleep(0.05)
            records = read_records(self.layout.store, names, self.clock())
        return records

    # -- restore ----------------------------------------------------------------------------

    def _restore(self) -> None:
        stored = read_attempts(self.layout, self.plan["parallelism"], self.observer, self._backend, self.clock())
        self.reaping |= stored.reaping
        self.scheduler.handle(Restored(tuple(stored.attempts), stored.admitted, self._shared_blocks()))
        self.slots.restore()
        if self.demand is not None:
            # Before the first step: a stage of lower priority starting meanwhile sees this one waiting.
            attempts = self.scheduler.attempts
            waiting = sum(1 for subtask in range(self.plan["parallelism"])
                          if subtask not in self.scheduler.admitted and subtask not in self.scheduler.reused
                          and not any(a.possible_to_finish for a in attempts.get(subtask, {}).values()))
            self._publish_demand(waiting, self.clock())
        if stored.attempts:
            self.journal(Event.RESTORED, attempts=len(stored.attempts), admitted=stored.admitted)

    def _shared_blocks(self) -> dict[str, float]:
        blocked = (self.layout.read_json(self.layout.blocklist) or {}).get("until", {})
        return {node: float(until) for node, until in blocked.items()}

    # -- loop -------------------------------------------------------------------------------

    def step(self) -> list[Action]:
        """One check: poll non-terminal attempts, run the core, carry out its actions."""
        started = time.thread_time()
        try:
            return self._step()
        finally:
            self._step_cpu = time.thread_time() - started

    def wake_after(self) -> float:
        """Seconds after a step before a change notice may wake the next one (the tick's CPU budget)."""
        return min(self.config.check_interval, max(WAKE_FLOOR, self._step_cpu / WAKE_DUTY))

    def changed(self) -> bool:
        """True if an attempt left a notice this controller has not read: worth stepping before check_interval."""
        return self.notices.changed()

    @property
    def notice_poll(self) -> float:
        """Seconds between two looks for a notice while waiting: the store's (0.1 s on POSIX, 1 s on S3)."""
        return self.layout.store.notice_poll_seconds

    def _prestart(self) -> None:
        """Start this host's fork server in the background, once, if this controller's targets launch through it."""
        if not self._prestarted:
            self._prestarted = True
            if any(b.fork_server for b in self.backends.values()):
                prestart_fork_server()

    def _step(self) -> list[Action]:
        if self.result is None:
            # Only a controller that will launch starts the fork server (not one that only stops attempts):
            # it imports while this first step places the first attempts.
            self._prestart()
        if self.result is not None:
            # Decided, but a cancelled loser may still be dying: keep reaping it, or `done` never turns true.
            self._reap(self.clock())
            self._release_slots()
            self._publish_demand(0, self.clock())
            return []
        now = self.clock()
        # Blocks other stages of the run added, then what changed, then decide.
        stimuli: list[Any] = [NodeBlocked(node, until) for node, until in self._shared_blocks().items()]
        notices = self.notices.take()
        targets = self._observe_targets(now)
        if set(targets.lost_nodes) - self._lost_seen:
            # Executors' hosts are in heartbeats without change notices: re-read every live attempt once
            # per new lost node, so the scheduler knows which of them ran there.
            notices = notices | {(a.subtask, a.number) for a in self.scheduler.live_attempts()}
        self._lost_seen = set(targets.lost_nodes)
        failed_launches = {(f.subtask, f.attempt) for f in self._launch_failures}
        known = self.scheduler.attempts
        # A rotating re-read usually finds nothing new: only what differs is fed and counts as a change.
        observed = [a for a in self._observe(now, notices, failed_launches)
                    if _differs(known.get(a.subtask, {}).get(a.number), a)]
        stimuli += [AttemptObserved(a) for a in observed]
        if self.hybrid is not None:
            inputs = self.hybrid.poll(now)
            stimuli += inputs
            stimuli += self._reader_heartbeats(inputs, {(a.subtask, a.number) for a in observed}, now)
        stimuli += self._launch_failures
        stimuli.append(targets)
        changed = bool(observed or self._launch_failures)
        self._launch_failures = []
        self.notices.acknowledge()
        actions = self._run([*stimuli, Tick(now)], now)
        actions += self._run(self._step_recoveries(), now)
        self._reap(now)
        released = self._release_slots()
        if released and self.result is None:
            # The slots attempts gave back in this step are placed in it: else every wave of a stage with
            # more subtasks than slots waits for the next change notice or check_interval (up to 1 s).
            # This step's views less what it gave back, not a second listing per target: a slot another
            # stage took since is a SlotLost, as it is after any observation.
            self.views = {name: replace(view, held=max(0, view.held - released.get(name, 0)))
                          for name, view in self.views.items()}
            actions += self._run([self._targets_observed(now), Tick(now)], now)
            self._release_slots()
        self._live_stale = self._live_stale or bool(actions) or changed
        self._publish_demand(0 if self.result is not None else self.scheduler.originals_waiting, now)
        self._persist_blocks()
        if changed or actions or now - self._summary_at >= SUMMARY_REFRESH:
            # summary.json is O(subtasks): rewritten when something changed, else every SUMMARY_REFRESH.
            self._summary = None
            self._write_summary(now)
        return actions

    @property
    def held(self) -> dict[tuple[int, int], tuple[str, int, str]]:
        """(subtask, attempt) -> (target, slot index, token) of the slots this stage run holds."""
        return self.slots.held

    def _observe_targets(self, now: float) -> TargetsObserved:
        """What the targets offer now; reclaims slots of gone holders when this stage waits for one."""
        self.views = self.watcher.observe(now)
        self.slots.reclaim(self.views, bool(self.scheduler.slot_status(now)), now)
        return self._targets_observed(now)

    def _targets_observed(self, now: float) -> TargetsObserved:
        """The scheduler's stimulus from ``self.views``: free slots, those left to stages ahead, losses."""
        lost_targets = {name: v.reason or "not live" for name, v in self.views.items() if not v.live}
        own: dict[str, int] = {}
        for target, _, _ in self.slots.held.values():
            own[target] = own.get(target, 0) + 1
        free, yielded = self._claimable({name: v.free for name, v in self.views.items()}, now)
        return TargetsObserved(free=free, yielded=yielded,
                               capacity={name: v.capacity for name, v in self.views.items()},
                               lost_targets=lost_targets, lost_nodes=dict(self.watcher.lost_nodes),
                               others={name: max(0, v.held - own.get(name, 0)) for name, v in self.views.items()})

    def _claimable(self, free: dict[str, int], now: float) -> tuple[dict[str, int], dict[str, int]]:
        """The free slots this stage run may claim, and those it leaves to stages ahead of it (core/priority.py).

        The demand of the stages ahead is read only when it can change something: this stage may launch and
        one of its targets has a free slot.
        """
        if self.demand is None or not self.demand.ahead or not self.scheduler.wants_slots or not any(free.values()):
            return free, {}
        return claimable_slots(free, self.demand.priority, self.demand.read(now), self.demand.stage, now)

    def _publish_demand(self, waiting: int, now: float) -> None:
        """Publish the originals this stage run waits to launch (bounded by its targets' capacity)."""
        if self.demand is not None:
            capacity = (sum(v.capacity for v in self.views.values()) if self.views
                        else sum(t.slots for t in self.config.targets))
            self.demand.publish(published_pending(waiting, capacity), now)

    def _release_slots(self) -> dict[str, int]:
        return self.slots.release_over(self.scheduler.attempts, self.reaping, decided=self.result is not None)

    def _observe(self, now: float, notices: set[tuple[int, int]], skip: set[tuple[int, int]]) -> list[Attempt]:
        """Poll the live attempts that can have changed: O(changes), not O(live attempts), per tick.

        Polled in full: attempts with a change notice, attempts whose cheap probe says their process is
        gone, and a rotating share of the rest so that every live attempt is re-read within
        ``FULL_POLL_PERIOD`` whatever notices were lost (a launch lost between claim and start is found
        so too). Probed (a signal 0, no file read): a rotating share so that each live attempt is probed
        within ``PROBE_PERIOD``.
        """
        if self._live is None or self._live_stale:
            # Rebuilt only after a tick that changed something: a quiet tick never walks every attempt.
            self._live = [(a.subtask, a.number) for a in self.scheduler.live_attempts()]
            self._live_stale = False
        live = self._live
        if not live:
            return []
        n = len(live)
        # The rotations' shares follow the time since the last one, not the number of ticks: early
        # wake-ups on change notices must not multiply the polls of a large stage.
        interval = max(self.config.check_interval, 0.001)
        if self._rotated_at is not None:
            interval = min(interval, max(now - self._rotated_at, 0.001))
        self._rotated_at = now
        full_share = min(n, max(1, math.ceil(n * interval / FULL_POLL_PERIOD)))
        probe_share = min(n, max(1, math.ceil(n * interval / PROBE_PERIOD)))
        # Two independent rotations over the live attempts: full polls and probes.
        full_keys = {live[(self._full_cursor + i) % n] for i in range(full_share)}
        probe_keys = {live[(self._probe_cursor + i) % n] for i in range(probe_share)}
        self._full_cursor = (self._full_cursor + full_share) % n
        self._probe_cursor = (self._probe_cursor + probe_share) % n
        attempts = self.scheduler.attempts
        observed = []
        for key in sorted(notices | full_keys | probe_keys):
            attempt = attempts.get(key[0], {}).get(key[1])
            if attempt is None or attempt.state in TERMINAL or key in skip:
                continue
            backend = self._backend(attempt.target)
            full = key in notices or key in full_keys or attempt.state == AttemptState.CREATED
            if not full and not backend.probe(key[0], key[1], now):
                full = True
            if full:
                observed.append(backend.poll(key[0], key[1], now))
        return observed

    def _reader_heartbeats(self, inputs: list[Any], seen: set[tuple[int, int]], now: float) -> list[AttemptObserved]:
        """Fresh polls of the live attempts that may have read a withdrawn partition (what they read decides)."""
        out: list[AttemptObserved] = []
        for stimulus in inputs:
            if not isinstance(stimulus, InputWithdrawn):
                continue
            for reader in sorted(self.scheduler.input_readers.get((stimulus.stage, stimulus.subtask), frozenset())):
                for attempt in list(self.scheduler.attempts.get(reader, {}).values()):
                    key = (attempt.subtask, attempt.number)
                    if attempt.state not in TERMINAL and key not in seen:
                        seen.add(key)
                        out.append(AttemptObserved(self._backend(attempt.target).poll(*key, now)))
        return out

    def _backend(self, target: str) -> Backend:
        return self.backends.get(target) or self.observer

    def _run(self, stimuli: Sequence[Stimulus], now: float) -> list[Action]:
        """Feed ``stimuli`` to the scheduler and carry out its actions, feeding back what their outcomes were.

        Each round is one ``handle`` call. An action whose outcome is a stimulus (a lost slot, claim or
        admission) starts the next round with it at once, and the actions that round returns are carried
        out before the rest of the batch: the scheduler hears every outcome before any later action is
        carried out, and ``handle`` is never called while an action is being carried out. A queued action is
        carried out as the scheduler revises it (``StageScheduler.revised``): an outcome may have overtaken it,
        as a lost admission does a cancel of the other controller's winner. Returns every action carried out,
        in order.
        """
        if not stimuli:
            return []
        done: list[Action] = []
        pending = deque(self.scheduler.handle(*stimuli))
        rounds = 1
        while pending:
            action = self.scheduler.revised(pending.popleft())
            if action is None:
                continue
            done.append(action)
            followups = self._carry_out(action, now)
            if not followups:
                continue
            rounds += 1
            if rounds > MAX_ROUNDS:
                raise RuntimeError(f"StageController ({self.scheduler.label}): internal error, outcomes still fed "
                                   f"back after {MAX_ROUNDS} rounds of one step (last: {followups!r})")
            pending.extendleft(reversed(self.scheduler.handle(*followups)))
        return done

    def _persist_blocks(self) -> None:
        # Blocks are extended while a slow attempt keeps running; a restarted controller and the
        # next stage of the run must see the latest deadline, not the first one.
        if not self.scheduler.blocklist.until:
            return  # nothing of ours to merge: the shared list would be written back unchanged, so not read
        shared = self._shared_blocks()
        merged = dict(shared)
        for node, until in self.scheduler.blocklist.until.items():
            merged[node] = max(until, merged.get(node, until))
        if merged != shared:
            self.layout.replace_json(self.layout.blocklist, {"until": merged})

    @property
    def done(self) -> bool:
        """True once the stage completed or failed and no cancelled attempt is still alive."""
        return self.result is not None and not self.reaping and not self.recoveries

    @property
    def succeeded(self) -> bool:
        """True once the stage completed as a success (every subtask admitted, CompleteStage decided)."""
        return isinstance(self.result, CompleteStage)

    def _step_recoveries(self) -> list[Stimulus]:
        """Advance the partition re-productions; return what the finished ones tell the scheduler."""
        outcomes: list[Stimulus] = []
        for key, recovery in list(self.recoveries.items()):
            if self.result is not None:
                del self.recoveries[key]
                continue
            outcome, reason = recovery.step()
            if outcome == "done":
                del self.recoveries[key]
                self._use_recovered(key[0], key[1], recovery.committed_part())
                outcomes.append(InputRestored(*key))
            elif outcome == "failed":
                del self.recoveries[key]
                outcomes.append(RecoveryFailed(key[0], key[1], reason or "unknown"))
        return outcomes

    def _use_recovered(self, stage: str, producer: int, part: dict[str, Any]) -> None:
        """A re-produced partition is committed: new attempts resolve their files from the new commit.

        The plan names producers and ranges, not files, so nothing in it changes.
        """
        self.journal(Event.INPUT_RESTORED, stage=stage, subtask=producer, attempt=part["attempt"])

    def _target_of(self, subtask: int, attempt: int) -> str:
        known = self.scheduler.attempts.get(subtask, {}).get(attempt)
        return known.target if known is not None else "?"

    @functools.singledispatchmethod
    def _carry_out(self, action: object, now: float) -> list[Stimulus]:
        """Do what one action says; return the stimuli its outcome produced (e.g. a lost admission).

        Each action type has one handler (registered below, dispatched on the type), as each stimulus
        type has one in the scheduler.
        """
        raise TypeError(f"StageController: no handler for action type {type(action).__name__}: {action!r}")

    @_carry_out.register
    def _cancel(self, action: Cancel, now: float) -> list[Stimulus]:
        self._backend(self._target_of(action.subtask, action.attempt)).cancel(
            action.subtask, action.attempt, action.reason)
        self.reaping.add((action.subtask, action.attempt))
        self.journal(Event.CANCEL, subtask=action.subtask, attempt=action.attempt, reason=action.reason)
        return []

    @_carry_out.register
    def _discard(self, action: Discard, now: float) -> list[Stimulus]:
        discard_attempt_output(self.layout, action.subtask, action.attempt)
        self._cleanup_sink_staging(action.subtask, action.attempt)
        self.journal(Event.DISCARD, subtask=action.subtask, attempt=action.attempt, reason=action.reason)
        return []

    @_carry_out.register
    def _block_node(self, action: BlockNode, now: float) -> list[Stimulus]:
        self.journal(Event.BLOCK_NODE, node=action.node, until=action.until, reason=action.reason)
        return []

    @_carry_out.register
    def _invalidate(self, action: Invalidate, now: float) -> list[Stimulus]:
        self.observer.invalidate(action.subtask, action.attempt, action.reason)
        discard_attempt_output(self.layout, action.subtask, action.attempt)
        self.journal(Event.INVALIDATE, subtask=action.subtask, attempt=action.attempt, reason=action.reason)
        return []

    @_carry_out.register
    def _fail_stage(self, action: FailStage, now: float) -> list[Stimulus]:
        self.result = action
        self.journal(Event.STAGE_FAILED, reason=action.reason, causes=list(action.causes),
                     failed_attempts=action.failed_attempts, counts_by_cause=dict(action.counts_by_cause))
        return []

    @_carry_out.register
    def _complete_stage(self, action: CompleteStage, now: float) -> list[Stimulus]:
        self.result = action
        self.journal(Event.STAGE_COMPLETE, admitted=action.admitted)
        # What this run measured of its targets seeds the next run's first wave (core/speed.py).
        record_speeds(self.layout.store, run_slowness(self.scheduler.all_attempts(), self.scheduler.input_bytes),
                      self.clock(), f"{self.plan['dag_id']}/{self.plan['run_id']}/{self.layout.stage}")
        return []

    @_carry_out.register
    def _recover(self, action: RecoverPartition, now: float) -> list[Stimulus]:
        self.journal(Event.RECOVER_PARTITION, stage=action.stage, subtask=action.subtask, reason=action.reason)
        recovery = PartitionRecovery(
            self.layout.store, self.plan["dag_id"], self.plan["run_id"], stage_key(self.plan, action.stage),
            action.subtask,
            env=self.extra_env, target_env=self.target_env,
            blocked=lambda node: self.scheduler.blocklist.is_blocked(node, self.clock()),
            clock=self.clock)
        if action.lost_attempt is not None and recovery.lost_attempt not in (None, action.lost_attempt):
            # Re-produced already (e.g. before a controller restart): just read the new result.
            self._use_recovered(action.stage, action.subtask, recovery.committed_part())
            return [InputRestored(action.stage, action.subtask)]
        self.recoveries[(action.stage, action.subtask)] = recovery
        return []

    @_carry_out.register
    def _launch(self, action: Launch, now: float) -> list[Stimulus]:
        target = next(t for t in self.config.targets if t.name == action.target)
        backend = self._backend(target.name)
        view = self.views.get(target.name)
        key = (action.subtask, action.attempt)
        slot = self.slots.claim(target.name, view.capacity if view else target.slots, key, now)
        if slot is None:
            # Another stage or run took the slot since the observation: like ClaimLost, nothing started.
            self.journal(Event.SLOT_LOST, subtask=action.subtask, attempt=action.attempt, target=target.name)
            return [SlotLost(action.subtask, action.attempt, target.name)]
        record = {"target": target.name, "node": target.node_label, "speculative": action.speculative,
                  "created_at": now, "reason": action.reason, "kind": backend.kind, "slot": slot[0]}
        if not backend.claim(action.subtask, action.attempt, record):
            # Another controller instance owns this number: adopt what it launched (it holds its own slot).
            self.journal(Event.CLAIM_LOST, subtask=action.subtask, attempt=action.attempt)
            self.slots.release(key)
            return [ClaimLost(self.observer.poll(action.subtask, action.attempt, now))]
        command = attempt_command(self.plan, self.layout, action.subtask, action.attempt, target.name)
        env = attempt_env(self.plan["targets"][target.name].get("env") or {}, self.target_env.get(target.name, {}),
                          self.extra_env, self.faults.attempt_env(str(self.layout.barrier_release(action.subtask))))
        try:
            # YARN and Kubernetes submissions are kept off the nodes blocked now (backends/spark_submit.py).
            backend.launch(LaunchSpec(action.subtask, action.attempt, target.name, target.node_label,
                                      action.speculative, command, env,
                                      blocked_nodes=tuple(sorted(self.scheduler.blocklist.active(now)))))
        except Exception as exc:
            # Recorded for restarts and the read model; the scheduler hears it at the next check.
            self.layout.replace_json(self.layout.status(action.subtask, action.attempt),
                                     {"state": "FAILED", "end_at": self.clock(), "exit_code": None,
                                      "cause": f"launch failed: {exc}"})
            self.journal(Event.LAUNCH_FAILED, subtask=action.subtask, attempt=action.attempt, target=target.name,
                         cause=str(exc))
            self._launch_failures.append(LaunchFailed(action.subtask, action.attempt, str(exc), self.clock()))
            return []
        self.journal(Event.LAUNCH, subtask=action.subtask, attempt=action.attempt, target=target.name,
                     speculative=action.speculative, reason=action.reason, slot=slot[0])
        return []

    @_carry_out.register
    def _admit(self, action: Admit, now: float) -> list[Stimulus]:
        record = {"attempt": action.attempt, "at": self.clock()}
        if not self.layout.create_json(self.layout.admitted(action.subtask), record):
            winner = self.layout.read_json(self.layout.admitted(action.subtask))["attempt"]
            if winner != action.attempt:
                # A concurrent controller admitted another attempt first: its choice stands.
                self.journal(Event.ADMIT_LOST, subtask=action.subtask, attempt=action.attempt, winner=winner)
                return [AdmissionLost(action.subtask, action.attempt, winner)]
        self.journal(Event.ADMIT, subtask=action.subtask, attempt=action.attempt,
                     speculative=self.scheduler.attempts[action.subtask][action.attempt].speculative)
        return []

    def _reap(self, now: float) -> None:
        self.stopper.reap(self.reaping, self._target_of, self.scheduler.admitted, now)

    def _cleanup_sink_staging(self, subtask: int, attempt: int) -> None:
        """Drop what a discarded or cancelled attempt staged in the sink (e.g. its Postgres staging table)."""
        self.stopper.cleanup_sink_staging(subtask, attempt)

    def kill_all(self, reason: str) -> None:
        """Cancel every live attempt and wait (bounded) until their process groups are gone."""
        self.stopper.kill(self.scheduler.all_attempts(), self.reaping, target_of=self._target_of,
                          admitted=self.scheduler.admitted, slots=self.slots, reason=reason,
                          kill_grace=max(b.kill_grace for b in [self.observer, *self.backends.values()]),
                          clock=self.clock)
        self._publish_demand(0, self.clock())

    # -- records ----------------------------------------------------------------------------

    def summary(self, now: float | None = None) -> StageSummary:
        """Metrics and speculation status of the stage (also written to summary.json); cached between changes."""
        if self._summary is None or now is not None:
            self._summary = self._build_summary(self.clock() if now is None else now)
        return self._summary

    def _build_summary(self, now: float) -> StageSummary:
        return stage_summary(self.plan, self.scheduler, self.views, self.hybrid, now)

    def _write_summary(self, now: float) -> None:
        self._summary_at = now
        self.layout.replace_json(self.layout.summary, self.summary(now))

    def attempt_lines(self) -> list[str]:
        """Every attempt of the stage run, one line each, for the task log (control/attemptlog.py)."""
        return attempt_lines(self.layout, self.scheduler.all_attempts(), self.scheduler.admitted)

    def event_payload(self) -> ControllerEvent:
        """The one trigger event: everything finalize needs (dag.test drops defer kwargs on resume)."""
        summary = self.summary(self.clock())  # fresh: the event is what finalize records
        if isinstance(self.result, FailStage):
            return {"status": TriggerStatus.FAILED, "plan_path": str(self.layout.plan), "reason": self.result.reason,
                    "causes": list(self.result.causes), "failed_attempts": self.result.failed_attempts,
                    "counts_by_cause": dict(self.result.counts_by_cause),
                    "failed_keys": [list(key) for key in self.result.failed_keys], "summary": summary}
        admitted = self.result.admitted if isinstance(self.result, CompleteStage) else {}
        return {"status": TriggerStatus.SUCCESS, "plan_path": str(self.layout.plan),
                "admitted": {str(k): v for k, v in admitted.items()}, "summary": summary}


def _differs(known: Attempt | None, observed: Attempt) -> bool:
    """Whether an observation tells the scheduler anything new (progress alone does not)."""
    if known is None:
        return True
    return (known.state, known.node, known.deploying_at, known.end_at, known.exit_code, known.cause, known.app_id,
            known.ready_at, known.failure, known.input_wait, known.waiting_since) != (
        observed.state, observed.node, observed.deploying_at, observed.end_at, observed.exit_code, observed.cause,
        observed.app_id, observed.ready_at, observed.failure, observed.input_wait, observed.waiting_since)


def wipe_stage_attempts(layout: StageLayout) -> None:
    """Remove every attempt and admission of a stage run (its plan changed or a full rerun was forced).

    Owned deletes only: raises RunNotOwnedError, deleting nothing, unless this store owns the DAG run's
    prefix (planning claims it first), since old attempts kept under a new plan could be admitted for it.
    """
    layout.require_owned_run()
    for entry in layout.store.children(layout.name(layout.dir)):
        if entry.startswith("subtask=") and entry.endswith("/"):
            layout.delete_tree(layout.dir / entry.rstrip("/"))
    for path in (layout.summary, layout.committed):
        layout.delete(path)
