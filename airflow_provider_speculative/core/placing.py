"""Placement: which waiting subtask gets which free slot in one round, or is held back for a faster target.

The stage scheduler (core/scheduler.py) decides which subtasks want an attempt; a :class:`Placement`
places them. It sees the scheduler through :class:`PlacementState`, which names everything it reads
and the few things it changes, and returns the :class:`Launch` actions of the round. Not to be confused
with core/placement.py, which builds the Spark conf that pins an attempt's executors to a target.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from airflow_provider_speculative.core.blocklist import Blocklist
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.messages import Action, Launch
from airflow_provider_speculative.core.speed import HOLD_MARGIN, SLOW_FACTOR, HoldPlanner, Speeds
from airflow_provider_speculative.core.states import Attempt, AttemptState

# In the last wave, the launch expected to end last goes before the others only if that ends it, and every original
# it overtakes, at least this share of one expected duration (the median split on the fastest target) before it
# would have ended: a tie, or a gain within the estimates' noise, leaves the walk's order (originals first).
TAIL_MARGIN = 0.1

# What a round's hold planner reads of the attempts: the live ones on a target, whether any attempt went to
# a target, and the longest execution time of a target's live attempts when the round's speeds tell it.
HoldInputs = tuple[Callable[[str], list[Attempt]], Callable[[str], bool], Callable[[str], float | None] | None]


@dataclass
class Queue:
    """The subtasks waiting for an original attempt, kept between rounds so a quiet tick costs O(changes)."""

    # Subtasks still waiting for a slot (the queued ones and those a SlotLost marked).
    wanting: set[int] = field(default_factory=set)
    # Subtasks of ``wanting`` whose want was decided and has not changed since (anything that could change it
    # marks them dirty): subtask -> why it wants an original. With the sorted order, a round whose slots run
    # out stops there instead of walking every waiting subtask again, so a full cluster's tick is O(changes).
    queued: dict[int, str] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    # Queued subtasks without a held_back entry yet: past the last of them a round may pass over originals
    # that would all be held again, since holding them again changes nothing.
    unheld: set[int] = field(default_factory=set)


class PlacementState(Protocol):
    """The scheduler as placement sees it: what a round reads, and the only things it changes.

    Changed: ``free_slots`` (a launch takes one of its target's), ``held_back`` (originals held for a
    faster target, and released when launched), the queue (launched subtasks leave it, unplaced ones stay
    wanting) and, through :meth:`_add_attempt`, the attempts. Everything else is read only.
    """

    @property
    def config(self) -> SpeculativeConfig:
        """The stage's options (placement reads ``plan_last_wave``)."""

    @property
    def targets(self) -> tuple[Target, ...]:
        """The targets attempts may be placed on, in configuration order."""

    @property
    def blocklist(self) -> Blocklist:
        """Nodes that take no new attempts for a while."""

    @property
    def free_slots(self) -> dict[str, int] | None:
        """Free slots per target with slots shared through the store; None for fixed per-stage slots."""

    @property
    def capacity(self) -> dict[str, int]:
        """Slots per target with slots shared through the store."""

    @property
    def lost_targets(self) -> dict[str, str]:
        """Lost targets and why."""

    @property
    def probe_targets(self) -> frozenset[str]:
        """Targets that may get one probe original although history calls them slow."""

    @property
    def input_bytes(self) -> dict[int, int]:
        """Input size per subtask."""

    @property
    def attempts(self) -> dict[int, dict[int, Attempt]]:
        """Every attempt by subtask and number (read only: new ones through :meth:`_add_attempt`)."""

    @property
    def held_back(self) -> dict[int, tuple[float, str]]:
        """Subtask -> (since, why) while its original is held back for a faster target."""

    @property
    def _queue(self) -> Queue:
        """The subtasks waiting for an original attempt."""

    def _position(self, name: str) -> int | None:
        """The target's place in the configuration; None if unknown."""

    def _slot_count(self, name: str) -> int | None:
        """The target's slots, None if it takes no attempt (unknown or lost)."""

    def _median_size(self) -> float | None:
        """The median input size of the subtasks."""

    def _hold_inputs(self, speeds: Speeds, now: float) -> HoldInputs:
        """What a round's hold planner reads of the attempts (see :data:`HoldInputs`)."""

    def _add_attempt(self, attempt: Attempt) -> None:
        """Record a launched attempt, so later holds in the round count it as live."""


@dataclass
class _Walk:
    """What one placement round carries from subtask to subtask: its launches, slot budget and hold planner."""

    load: dict[str, int]
    speeds: Speeds
    now: float
    budget: int | None
    actions: list[Action] = field(default_factory=list)
    holds: HoldPlanner | None = None
    # Whether an attempt of this stage went to a target (a probe goes only to a target not tried yet), and the
    # targets this round launched on.
    tried: Callable[[str], bool] = field(default=lambda target: False)
    launched_on: set[str] = field(default_factory=set)
    # Attempts launched after the hold planner was built: its queues are of the attempts live before.
    since_holds: set[tuple[int, int]] = field(default_factory=set)


class Placement:
    """Places one stage's wanted attempts on free slots, round by round, through a :class:`PlacementState`."""

    def __init__(self, state: PlacementState) -> None:
        self.state = state
        # What the current round computes once instead of per waiting subtask (None between rounds).
        self._round: _Round | None = None
        # The round's copies wanted, and its last wave's model once built (see last_wave).
        self._wanted: list[tuple[int, str]] = []
        self._wave: _LastWave | None = None
        self._wave_built = False

    def place(self, speculative: list[tuple[int, str]], load: dict[str, int], budget: int | None, speeds: Speeds,
              now: float) -> list[Action]:
        """One round: the queued originals, then the ``speculative`` copies; the Launch actions it decides.

        ``load`` counts live attempts per target (fixed per-stage slots) and is updated with the launches;
        ``budget`` caps the launches (hybrid inputs keep slots for their producers), None for no cap.
        """
        self._round = _Round(self.state, load, now, speeds)
        self._wanted = speculative
        try:
            actions: list[Action] = []
            if speculative:
                # Last wave: what is expected to end the stage, launched first where that ends it sooner.
                actions, speculative = self.tail_copies(speculative, load, budget, speeds, now)
                if budget is not None:
                    budget -= len(actions)
            actions += self.walk(speculative, load, budget, speeds, now)
        finally:
            self._round, self._wanted, self._wave, self._wave_built = None, [], None, False
        queue = self.state._queue
        order = queue.order
        if len(order) > 2 * len(queue.queued) + 64:
            queue.order = [subtask for subtask in order if subtask in queue.queued]
        else:
            # Originals launch from the front of the queue: dropping them there keeps the next walk's start O(1).
            head = 0
            while head < len(order) and order[head] not in queue.queued:
                head += 1
            del order[:head]
        return actions

    def tail_copies(self, speculative: list[tuple[int, str]], load: dict[str, int], budget: int | None,
                    speeds: Speeds, now: float) -> tuple[list[Action], list[tuple[int, str]]]:
        """In the last wave, launch first the copy (or queued original) expected to end last, if that pays.

        The walk places the queued originals first, in subtask order, then the copies (as Spark's
        TaskSetManager does). In the last wave (the queued originals fit in the slots of the targets that are
        not slow) :class:`_LastWave` models that order on those targets' slots from the scheduler's speed
        estimates. The launch expected to end last (a copy of a long-running original that would start only
        after every queued original, or a large original queued behind small ones) takes a free slot of such
        a target first when that weighs out: it ends :data:`TAIL_MARGIN` of an expected duration sooner, and
        each original it overtakes, starting when the next such slot frees instead, still ends that much
        before it would have. On a pool of few fast slots and splits of one size this never holds (an
        overtaken original then waits about one attempt and ends when the copy would have); on a large
        cluster the next slot frees soon. Only in rounds that want a copy; returns the launches and the copies
        left for the walk.
        """
        assert self._round is not None
        queued = len(self.state._queue.queued)
        # Nothing to order without a queued original or a free fast slot, or when every launch wanted gets one now
        # (checked in O(targets with a free slot) before the model is built).
        free = self._round.free_fast() if queued else 0
        if not free or queued + len(speculative) <= free:
            return [], speculative
        wave = self.last_wave(speeds, now)
        if wave is None:
            return [], speculative
        state = self.state
        walk = _Walk(load, speeds, now, budget)
        placed: set[int] = set()
        while wave.ahead < wave.free_now and not self._no_room(walk):
            found = wave.first()
            if found is None:
                break
            job, why = found
            if job.copy:
                avoid = {a.target for a in state.attempts[job.subtask].values() if a.live}
                target = self.pick_target(load, now, avoid, allow_blocked=False, speeds=speeds)
            else:
                target = self.pick_target(load, now, set(), allow_blocked=True, speeds=speeds)
            if target is None or speeds.is_slow(target.name):
                break  # no free slot of a target that is not slow left for it
            self._place_one(walk, job.subtask, job.copy, f"{job.reason}; {why}", target)
            wave.took(job)
            if job.copy:
                placed.add(job.subtask)
        if not placed:
            return walk.actions, speculative
        return walk.actions, [wanted for wanted in speculative if wanted[0] not in placed]

    def last_wave(self, speeds: Speeds, now: float) -> _LastWave | None:
        """The round's last-wave model, built from the state when first asked for; None before the last wave or if off.

        Off with ``[speculative] plan_last_wave = false``. Asked at the round's start when a copy is wanted, else
        when an original or copy would go to a slow target: O(targets + live attempts) then.
        """
        if not self._wave_built:
            self._wave_built = True
            assert self._round is not None
            if self.state.config.plan_last_wave:
                self._wave = _LastWave.build(self.state, self._round, self._wanted, speeds, now)
        return self._wave

    def walk(self, speculative: list[tuple[int, str]], load: dict[str, int], budget: int | None,
             speeds: Speeds, now: float) -> list[Action]:
        """The round's walk: the queued originals in subtask order, then ``speculative``; launch, hold or wait.

        Every original is decided as if each were tried in turn, but a stretch of originals that are all held
        already and would all be held again is passed over at once (see :meth:`_held_stretch`): a round costs
        O(launches + subtasks held for the first time + targets), not O(waiting subtasks).
        """
        assert self._round is not None
        state = self.state
        walk = _Walk(load, speeds, now, budget)
        queue = state._queue
        order, queued = queue.order, queue.queued
        last_unheld: int | None = None
        kept = 0  # originals passed that stay queued (held or without a slot)
        index = 0
        while index < len(order):
            subtask = order[index]
            reason = queued.get(subtask)
            if reason is None:  # launched subtasks leave the dict; the list is pruned now and then
                index += 1
                continue
            if self._no_room(walk):
                return walk.actions  # no slot left for anyone: the originals stay queued, copies wait
            target = self.pick_target(load, now, set(), allow_blocked=True, speeds=speeds)
            if (target is not None and speeds.is_slow(target.name)
                    and not (target.name in state.probe_targets and speeds.source.get(target.name) == "history")):
                if last_unheld is None:
                    last_unheld = max(queue.unheld, default=-1)
                if subtask > last_unheld:
                    held = self._held_stretch(walk, target, len(queued) - kept)
                    if held is None:
                        break  # every original left is held, and was already: nothing would change
                    if held:
                        index = self._pass_queued(index, held)
                        kept += held
                        continue
            self._place_one(walk, subtask, False, reason, target)
            kept += subtask in queued
            index += 1
        for subtask, reason in speculative:
            if self._no_room(walk):
                break
            avoid = {a.target for a in state.attempts[subtask].values() if a.live}
            target = self.pick_target(load, now, avoid, allow_blocked=False, speeds=speeds)
            self._place_one(walk, subtask, True, reason, target)
        return walk.actions

    def pick_target(self, load: dict[str, int], now: float, avoid: set[str], allow_blocked: bool,
                    speeds: Speeds | None = None) -> Target | None:
        """The free target a new attempt goes to, or None: not slow first, then the largest free share, then order.

        With slots shared through the store the share is free / capacity, not the free count, so targets of
        different sizes fill evenly, as the per-stage rule (no TargetsObserved: load / slots) does. A target
        known to be slow (core/speed.py) comes last; a blocked node is avoided unless every node is.
        """
        return self._round_for(load, now, speeds).pick(avoid, allow_blocked)

    def _round_for(self, load: dict[str, int], now: float, speeds: Speeds | None) -> _Round:
        """The current round if it was built for this load, clock and speeds, else one built for them."""
        placement = self._round
        if placement is None or not placement.serves(load, now, speeds):
            placement = _Round(self.state, load, now, speeds)
        return placement

    def _no_room(self, walk: _Walk) -> bool:
        """True once nothing more can be placed this round (the hybrid budget is spent or no slot is free)."""
        assert self._round is not None
        return (walk.budget is not None and walk.budget <= 0) or self._round.exhausted()

    def _pass_queued(self, index: int, count: int) -> int:
        """The index in the queue order just after the next ``count`` queued originals from ``index``."""
        queue = self.state._queue
        order, queued = queue.order, queue.queued
        while count:
            count -= order[index] in queued
            index += 1
        return index

    def _held_stretch(self, walk: _Walk, target: Target, remaining: int) -> int | None:
        """How many of the ``remaining`` originals, all held already, are held again before one goes to ``target``.

        ``target`` is slow and stays the first pick until something is launched, so each of them would try
        it: None when every one would be held (``target`` is busy, or holding pays for all of them), else the
        number held before holding no longer pays, with their reservations made in the hold planner. Their
        held-back reasons are kept, so nothing else about them changes.
        """
        if self._busy_slow(target, walk.speeds, walk.now, walk.load):
            return None  # held whatever the hold planner answers
        assert self._round is not None
        # The original the planner would place there next may still be held by the last wave (_place_one).
        held = self._round.holds_in_a_row(self._hold_planner(walk), target.name, remaining)
        return None if held >= remaining else held

    def _hold_planner(self, walk: _Walk) -> HoldPlanner:
        """The round's hold planner, made when an original first meets a slow target; its queues when asked for."""
        if walk.holds is None:
            state = self.state
            live_on, walk.tried, longest = state._hold_inputs(walk.speeds, walk.now)
            since = walk.since_holds

            def live_before(target: str) -> list[Attempt]:
                return [a for a in live_on(target) if (a.subtask, a.number) not in since] if since else live_on(target)

            walk.holds = HoldPlanner.lazy(walk.speeds, state._median_size(), state._slot_count, live_before, walk.now,
                                          longest)
        return walk.holds

    def _place_one(self, walk: _Walk, subtask: int, speculative: bool, reason: str, target: Target | None) -> None:
        """Launch ``subtask`` on ``target`` (the pick for it), hold its original back, or leave it waiting."""
        assert self._round is not None
        state, queue = self.state, self.state._queue
        placement, speeds, now = self._round, walk.speeds, walk.now
        held_back = state.held_back
        if target is None:
            if not speculative:
                queue.wanting.add(subtask)  # no free slot now: try again next tick
            return
        if not speculative and speeds.is_slow(target.name):
            def hold(why: Callable[[], str]) -> None:
                # An original held for a faster target: its reason is kept from the round it was first held.
                if subtask not in held_back:
                    held_back[subtask] = (now, why())
                    queue.unheld.discard(subtask)
                queue.wanting.add(subtask)

            holds = self._hold_planner(walk)
            # A target only an earlier DAG run calls slow gets one original per DAG run: a node that was
            # fixed is measured again instead of being avoided until its record expires.
            probe = (speeds.source.get(target.name) == "history" and target.name in state.probe_targets
                     and target.name not in walk.launched_on and not walk.tried(target.name))
            held = None if probe else placement.hold_for(holds, target.name)
            if held is not None:
                faster, finish, here = held
                hold(lambda: f"for faster target {faster} (expected to end in {finish:.1f} there vs {here:.1f} on "
                              f"{target.name}, {speeds.of(target.name):.1f}x slower, "
                              f"{speeds.source.get(target.name, 'run')})")
                return
            if not probe and self._busy_slow(target, speeds, now, walk.load):
                hold(lambda: f"for a faster target ({target.name} is {speeds.of(target.name):.1f}x slower, "
                              f"{speeds.source.get(target.name, 'run')}, and runs one attempt at a time)")
                return
            wave = None if probe else self.last_wave(speeds, now)
            late = wave.hold(subtask, speeds.of(target.name)) if wave is not None else None
            if late is not None and self._round.fast_usable():
                on_here, waiting, last = late
                hold(lambda: f"for a faster target (last wave: expected to end in {on_here:.1f} on {target.name}, "
                              f"{speeds.of(target.name):.1f}x slower, {speeds.source.get(target.name, 'run')}, vs "
                              f"{waiting:.1f} after waiting, and the wave's last in {last:.1f})")
                return
        elif speculative and speeds.is_slow(target.name) and placement.fast_usable():
            wave = self.last_wave(speeds, now)
            if wave is not None and wave.hold(subtask, speeds.of(target.name), copy=True) is not None:
                return  # the copy waits for a faster target: still wanted, it is placed in a later round
        if subtask in held_back:
            since, why = held_back.pop(subtask)
            reason += f"; held {now - since:.1f}s {why}"
        if not speculative:
            del queue.queued[subtask]
            queue.unheld.discard(subtask)
            queue.wanting.discard(subtask)
        free_slots = state.free_slots
        if free_slots is not None:
            free_slots[target.name] -= 1
        number = max(state.attempts[subtask], default=-1) + 1
        state._add_attempt(Attempt(
            subtask=subtask, number=number, target=target.name, speculative=speculative,
            state=AttemptState.CREATED, created_at=now, input_bytes=state.input_bytes.get(subtask)))
        walk.load[target.name] += 1
        placement.took(target.name)
        walk.launched_on.add(target.name)
        if walk.holds is not None:
            walk.since_holds.add((subtask, number))
        if walk.budget is not None:
            walk.budget -= 1
        walk.actions.append(Launch(subtask, number, target.name, speculative, reason))

    def _busy_slow(self, target: Target, speeds: Speeds, now: float, load: dict[str, int]) -> bool:
        """A slow target that runs something takes no further original while a faster one is usable.

        Its attempts share what little it has: two at once end no sooner than one after the other, and
        the second's work is missing on the faster target meanwhile. One at a time, a slow node still
        contributes without holding back work a faster target would end sooner.
        """
        free_slots = self.state.free_slots
        busy = (free_slots.get(target.name, 0) < self.state.capacity.get(target.name, target.slots)
                if free_slots is not None else load[target.name] > 0)
        if not busy:
            return False
        return self._round_for(load, now, speeds).fast_usable()


def time_left(attempt: Attempt, speeds: Speeds, per_byte: float, size: float, now: float) -> float:
    """Seconds ``attempt`` is expected to run from ``now``, from its target's slowness and what it ran.

    Its expected execution time is ``per_byte`` (on the fastest target) times ``size`` times its target's
    slowness. Where that cannot tell (it ran that long already, or only unfinished attempts bound the target's
    slowness, so the bound is about its own elapsed time) it is taken to need at least as long again as it ran.
    """
    expected = per_byte * size * speeds.of(attempt.target) * (2.0 if speeds.bounded(attempt.target) else 1.0)
    elapsed = attempt.execution_time(now)
    if elapsed >= expected:
        return elapsed
    return expected - elapsed


@dataclass
class _Job:
    """A launch the last wave may place first: a queued original or a wanted copy, and what is expected of it."""

    subtask: int
    reason: str
    copy: bool
    # Expected execution time on the fastest target.
    duration: float
    # A copy's subtask ends anyway when its best live attempt does, this long from now (inf for an original).
    left: float = math.inf

    def end(self, start: float) -> float:
        """When its subtask is expected to end if it is launched ``start`` s from now."""
        return min(self.left, start + self.duration)


@dataclass
class _LastWave:
    """The last wave's launches as the walk orders them, on the slots of the targets that are not slow.

    Times are seconds from now. ``events`` are the moments those slots free, in order: now for a free one,
    else when the attempt holding it is expected to end (:func:`time_left`; a slot held by another stage's
    attempt: one expected duration), and again one expected duration after each use. ``jobs`` (the queued
    originals in queue order, then the copies in the walk's order) take them in turn after the ``ahead``
    launched first. Built in O(fast targets + their live attempts + jobs log slots); :meth:`first` is O(jobs).
    """

    events: list[float]
    jobs: list[_Job]
    free_now: int
    unit: float
    ahead: int = 0
    # The expected end of the last job in the walk's order (when first asked for), and each job's place in it.
    _last: float | None = None
    _index: dict[int, int] = field(default_factory=dict)
    _copies: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._positions()

    def _positions(self) -> None:
        self._index = {job.subtask: i for i, job in enumerate(self.jobs) if not job.copy}
        self._copies = {job.subtask: i for i, job in enumerate(self.jobs) if job.copy}

    @classmethod
    def build(cls, state: PlacementState, placement: _Round, speculative: list[tuple[int, str]], speeds: Speeds,
              now: float) -> _LastWave | None:
        """The round's model, or None before the last wave (or before the speeds tell a duration)."""
        queue = state._queue
        per_byte, median = speeds.fastest_per_byte, state._median_size()
        if not (queue.queued or speculative) or per_byte is None or not median:
            return None
        free_slots, capacity, load = state.free_slots, state.capacity, placement.load
        slow = speeds.slow_targets
        fast: list[tuple[Target, int, int]] = []
        free_now = fast_slots = 0
        for target in placement.placeable_targets():
            name = target.name
            if name in slow:
                continue
            if free_slots is not None:
                slots, free = capacity.get(name, target.slots), free_slots.get(name, 0)
            else:
                slots, free = target.slots, target.slots - load[name]
            free = max(0, min(free, slots))
            fast.append((target, slots, free))
            fast_slots += slots
            free_now += free
        if len(queue.queued) > fast_slots:
            return None  # not the last wave
        sizes = state.input_bytes
        jobs = [_Job(subtask, queue.queued[subtask], False, per_byte * (sizes.get(subtask) or median))
                for subtask in queue.order if subtask in queue.queued]
        for subtask, reason in speculative:
            size = sizes.get(subtask) or median
            live = [a for a in state.attempts[subtask].values() if a.live]
            left = min((time_left(a, speeds, per_byte, a.input_bytes or size, now) for a in live), default=math.inf)
            jobs.append(_Job(subtask, reason, True, per_byte * size, left))
        live_on = state._hold_inputs(speeds, now)[0]
        unit = per_byte * median
        heap: list[tuple[float, float]] = []
        for target, slots, free in fast:
            slowness = speeds.of(target.name)
            step = unit * slowness
            heap.extend([(0.0, step)] * free)
            busy = slots - free
            if busy:
                # time_left of each live attempt, inlined; the busy slots free when the first of them end.
                factor = per_byte * slowness * (2.0 if speeds.bounded(target.name) else 1.0)
                ends = []
                for attempt in live_on(target.name):
                    expected = factor * (sizes.get(attempt.subtask) or attempt.input_bytes or median)
                    elapsed = attempt.execution_time(now)
                    ends.append(elapsed if elapsed >= expected else expected - elapsed)
                if len(ends) > busy:
                    ends = sorted(ends)[:busy]
                heap.extend((end, step) for end in ends)
                heap.extend([(step, step)] * (busy - len(ends)))  # held by another stage's attempts
        heapq.heapify(heap)
        events: list[float] = []
        while len(events) <= len(jobs):
            at, step = heap[0]
            events.append(at)
            heapq.heapreplace(heap, (at + step, step))
        return cls(events, jobs, free_now, unit)

    def hold(self, subtask: int, slowness: float, copy: bool = False) -> tuple[float, float, float] | None:
        """Whether a queued original (or a ``copy``) should wait for the faster targets, not go to a slower one.

        An original waits if, launched now on a target ``slowness`` times slower than the fastest, it is expected
        to end after the last job of the wave on the faster targets (so it would end the stage later), and later
        by :data:`HOLD_MARGIN` of its time there than when it waits for its turn on them. A copy waits on the
        second condition alone: its original's time left is a guess where the target is overdue or only bounded,
        and a copy only helps by ending first. Returns (its time there, its time after waiting, the wave's last
        end); None to place it. Uses the subtask's own size (the hold planner counts each as the median).
        """
        index = (self._copies if copy else self._index).get(subtask)
        if index is None:
            return None
        if self._last is None:
            events = self.events
            self._last = max((job.end(events[self.ahead + i]) for i, job in enumerate(self.jobs)), default=0.0)
        job = self.jobs[index]
        here = job.duration * slowness
        waiting = self.events[self.ahead + index] + job.duration
        if here * (1.0 - HOLD_MARGIN) <= waiting or (not copy and here <= self._last):
            return None
        return here, waiting, self._last

    def first(self) -> tuple[_Job, str] | None:
        """The job to launch now before the rest, and why; None when the walk's order is as good.

        Only the job expected to end last can bring the last end sooner by going first. It goes first if,
        launched now, it ends :data:`TAIL_MARGIN` of an expected duration before it would have, every
        original it overtakes (each one slot later) still ends that much before it would have, and every copy
        it overtakes still ends before it would have (those are candidates like it: a later round may place
        the one that is last then). Each move brings the last end sooner, or leaves fewer jobs at it.
        """
        jobs, events, ahead = self.jobs, self.events, self.ahead
        ends = [job.end(events[ahead + i]) for i, job in enumerate(jobs)]
        last = max(range(len(jobs)), key=ends.__getitem__)
        if last == 0:
            return None  # the walk launches it first anyway
        job, was = jobs[last], ends[last]
        now = job.end(events[ahead])
        originals = copies = 0.0
        overtaken = 0
        for i, other in enumerate(jobs[:last]):
            later = other.end(events[ahead + i + 1])
            if other.copy:
                copies = max(copies, later)
            else:
                originals = max(originals, later)
                overtaken += 1
        if max(now, originals) > was - TAIL_MARGIN * self.unit or copies >= was:
            return None
        return job, (f"placed first in the last wave: expected to end its subtask in {now:.1f}s instead of "
                     f"{was:.1f}s; the {overtaken} queued original(s) it overtakes by {originals:.1f}s")

    def took(self, job: _Job) -> None:
        """``job`` was launched now: it leaves the order and takes the next free slot."""
        self.jobs.remove(job)
        self.ahead += 1
        self._last = None
        self._positions()


class _Round:
    """One placement round's view of the targets: each waiting subtask costs O(log targets), not O(targets).

    Blocks, lost targets and speeds do not change within a round; only the slots it takes do. So the
    pickable targets sit in a heap in the order placement prefers them, and a launch re-keys only the
    target it took a slot of; once no slot is free the heap is empty and every pick is O(1).
    """

    def __init__(self, sched: PlacementState, load: dict[str, int], now: float, speeds: Speeds | None) -> None:
        self.sched, self.load, self.now, self.speeds = sched, load, now, speeds
        self.targets = sched.targets
        targets = self.targets
        # Most rounds have no block at all: then no target needs a look-up.
        blocked = ([sched.blocklist.is_blocked(t.node_label, now) for t in targets] if sched.blocklist.until
                   else [False] * len(targets))
        # Every node blocked: an original still runs anywhere free rather than stall the stage; copies wait.
        self.all_blocked = all(blocked)
        lost = sched.lost_targets
        shared = sched.free_slots is not None
        self.pickable = {i for i, t in enumerate(targets)
                         if (self.all_blocked or not blocked[i]) and not (shared and t.name in lost)}
        self.placeable = [t.name for t, b in zip(targets, blocked, strict=True) if t.name not in lost and not b]
        self._blocked = blocked
        free_slots = sched.free_slots
        with_room = (i for i in self.pickable
                     if (free_slots.get(targets[i].name, 0) > 0 if free_slots is not None
                         else load[targets[i].name] < targets[i].slots))
        self._keys: dict[int, tuple[bool, float, int]] = {}
        for position in with_room:
            key = self._key(position)
            if key is not None:
                self._keys[position] = key
        self._heap: list[tuple[bool, float, int]] = list(self._keys.values())
        heapq.heapify(self._heap)
        self._fast_usable: bool | None = None
        self._holds: _HoldIndex | None = None

    def serves(self, load: dict[str, int], now: float, speeds: Speeds | None) -> bool:
        """True if this round was built for the same load, clock and speeds."""
        return load is self.load and now == self.now and speeds is self.speeds

    def _key(self, position: int) -> tuple[bool, float, int] | None:
        """Where the target stands in the pick order now (smallest first), or None without a free slot."""
        target = self.targets[position]
        slow = self.speeds is not None and self.speeds.is_slow(target.name)
        free_slots = self.sched.free_slots
        if free_slots is not None:
            free = free_slots.get(target.name, 0)
            if free > 0:
                return (slow, -free / max(1, self.sched.capacity.get(target.name, target.slots), free), position)
        elif self.load[target.name] < target.slots:
            return (slow, self.load[target.name] / target.slots, position)
        return None

    def _rekey(self, position: int) -> None:
        key = self._key(position)
        if key is None:
            self._keys.pop(position, None)
        elif self._keys.get(position) != key:
            self._keys[position] = key
            heapq.heappush(self._heap, key)

    def exhausted(self) -> bool:
        """True once no pickable target has a free slot: nothing more can be placed this round."""
        heap = self._heap
        while heap and self._keys.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return not heap

    def pick(self, avoid: set[str], allow_blocked: bool) -> Target | None:
        """The preferred pickable target with a free slot that is not in ``avoid``, or None."""
        if self.all_blocked and not allow_blocked:
            return None
        skipped: list[tuple[bool, float, int]] = []
        chosen: Target | None = None
        while self._heap:
            key = self._heap[0]
            if self._keys.get(key[2]) != key:
                heapq.heappop(self._heap)  # re-keyed or full since it was pushed
                continue
            if self.targets[key[2]].name in avoid:
                skipped.append(heapq.heappop(self._heap))
                continue
            chosen = self.targets[key[2]]
            break
        for key in skipped:
            heapq.heappush(self._heap, key)
        return chosen

    def took(self, name: str) -> None:
        """A slot of ``name`` was taken: its place in the order changes (or it leaves it when full)."""
        position = self.sched._position(name)
        if position is not None and position in self.pickable:
            self._rekey(position)

    def placeable_targets(self) -> list[Target]:
        """The targets of :attr:`placeable` (neither lost nor blocked), in configuration order."""
        lost = self.sched.lost_targets
        return [t for t, b in zip(self.targets, self._blocked, strict=True) if not b and t.name not in lost]

    def free_fast(self) -> int:
        """Free slots of the pickable targets that are not slow, at the round's start (O(targets with a free slot))."""
        free_slots = self.sched.free_slots
        total = 0
        for position, key in self._keys.items():
            if not key[0]:
                target = self.targets[position]
                total += (free_slots.get(target.name, 0) if free_slots is not None
                          else target.slots - self.load[target.name])
        return total

    def fast_usable(self) -> bool:
        """Some target that is not slow is neither lost nor blocked."""
        if self._fast_usable is None:
            speeds = self.speeds
            self._fast_usable = any(speeds is None or not speeds.is_slow(name) for name in self.placeable)
        return self._fast_usable

    def hold_for(self, holds: HoldPlanner, slow: str) -> tuple[str, float, float] | None:
        """``holds.hold_for(slow, placeable targets)``, answered in O(log targets)."""
        return self._hold_index(holds).hold_for(slow)

    def holds_in_a_row(self, holds: HoldPlanner, slow: str, limit: int) -> int:
        """How many of ``limit`` calls of :meth:`hold_for` for ``slow`` in a row would hold (see _HoldIndex)."""
        return self._hold_index(holds).holds_in_a_row(slow, limit)

    def _hold_index(self, holds: HoldPlanner) -> _HoldIndex:
        if self._holds is None or self._holds.planner is not holds:
            self._holds = _HoldIndex(holds, self.placeable)
        return self._holds


class _HoldIndex:
    """The candidate :meth:`HoldPlanner.hold_for` would choose, found in O(log targets) instead of O(targets).

    ``hold_for`` takes, among candidates at least SLOW_FACTOR faster than the slow target, the one whose
    earliest slot ends first (the first in order on a tie). Sorted by slowness those candidates are a
    prefix, so a segment tree of (finish, order) finds it; the planner itself still judges and reserves,
    given only that candidate. A reservation only delays a queue, so once the planner places now for a
    slow target it does so for the rest of the round, and is not asked again. The tree, which reads every
    candidate's queue, is built at the first :meth:`hold_for`; :meth:`holds_in_a_row` reads only as many
    queues as it needs.
    """

    def __init__(self, planner: HoldPlanner, candidates: list[str]) -> None:
        self.planner = planner
        self.candidates = candidates
        self.none = (math.inf, len(candidates))
        self.placing_now: set[str] = set()
        self.tree: list[tuple[float, int]] = []

    def _build(self) -> None:
        candidates, speeds = self.candidates, self.planner.speeds
        order = sorted(range(len(candidates)), key=lambda k: (speeds.of(candidates[k]), k))
        self.leaf = {k: j for j, k in enumerate(order)}
        self.scaled = [SLOW_FACTOR * speeds.of(candidates[k]) for k in order]
        self.size = 1
        while self.size < len(candidates):
            self.size *= 2
        self.tree = [self.none] * (2 * self.size)
        for j, k in enumerate(order):
            self.tree[self.size + j] = self._finish(k)
        for node in range(self.size - 1, 0, -1):
            self.tree[node] = min(self.tree[2 * node], self.tree[2 * node + 1])

    def _finish(self, k: int) -> tuple[float, int]:
        target = self.candidates[k]
        queue = self.planner.queue(target)
        if not queue or queue[0] == float("inf"):
            return self.none
        scale = self.planner.unit if self.planner.unit is not None else 1.0
        # The same expression as HoldPlanner.hold_for, so ties and rounding come out the same.
        return (queue[0] + scale * self.planner.speeds.of(target), k)

    def _best(self, count: int) -> tuple[float, int]:
        """The smallest (finish, order) among the first ``count`` leaves."""
        best = self.none
        low, high = self.size, self.size + count
        while low < high:
            if low & 1:
                best = min(best, self.tree[low])
                low += 1
            if high & 1:
                high -= 1
                best = min(best, self.tree[high])
            low //= 2
            high //= 2
        return best

    def hold_for(self, slow: str) -> tuple[str, float, float] | None:
        """The planner's answer for ``slow`` over every candidate; a reservation updates the tree."""
        if slow in self.placing_now:
            return None
        if not self.tree:
            self._build()
        eligible = bisect.bisect_right(self.scaled, self.planner.speeds.of(slow))
        finish, k = self._best(eligible)
        held = self.planner.hold_for(slow, [] if finish == math.inf else [self.candidates[k]])
        if held is None:
            self.placing_now.add(slow)
            return None
        self._refresh(k)  # the planner reserved a slot of the one candidate it was given
        return held

    def _refresh(self, k: int) -> None:
        """Candidate ``k`` changed its queue: its finish and the minima above it."""
        node = self.size + self.leaf[k]
        self.tree[node] = self._finish(k)
        node //= 2
        while node:
            self.tree[node] = min(self.tree[2 * node], self.tree[2 * node + 1])
            node //= 2

    def holds_in_a_row(self, slow: str, limit: int) -> int:
        """How many of ``limit`` :meth:`hold_for` calls for ``slow`` in a row would hold, with their reservations.

        Each hold takes the eligible slot whose next finish is earliest and pushes it back by one expected
        duration, until the earliest finish no longer pays; so the holds are exactly every slot's finishes
        up to that bound, whatever their order, counted per slot in O(eligible slots + holds). When all
        ``limit`` would hold, ``limit`` is returned and nothing is reserved (no one is left to see it);
        otherwise the reservations are made and ``slow`` is placed from then on, as after :meth:`hold_for`.
        """
        if slow in self.placing_now:
            return 0
        planner = self.planner
        speeds = planner.speeds
        if not speeds.is_slow(slow):
            self.placing_now.add(slow)
            return 0
        scale = planner.unit if planner.unit is not None else 1.0
        # The same expressions as HoldPlanner.hold_for: the same additions, so the same bound is met.
        slowness = speeds.of(slow)
        bound = (scale * slowness) * (1.0 - HOLD_MARGIN)
        if self._at_least(slowness, scale, bound, limit):
            return limit
        moved: list[tuple[int, list[float]]] = []
        total = 0
        for k, target in enumerate(self.candidates):
            if slowness < SLOW_FACTOR * speeds.of(target):
                continue
            queue = planner.queue(target)
            if not queue or queue[0] == float("inf"):
                continue
            step = scale * speeds.of(target)
            if queue[0] + step > bound:
                continue
            after = []
            for free_at in queue:
                while free_at + step <= bound:
                    free_at = free_at + step
                    total += 1
                after.append(free_at)
            if total >= limit:
                return limit
            moved.append((k, after))
        for k, after in moved:
            heapq.heapify(after)
            planner.queues[self.candidates[k]][:] = after
            if self.tree:
                self._refresh(k)
        self.placing_now.add(slow)
        return total

    def _at_least(self, slowness: float, scale: float, bound: float, limit: int) -> bool:
        """True if at least ``limit`` holds up to ``bound`` are sure, counting from slot counts where they tell.

        A queue not built yet whose entries all free within one expected duration (HoldPlanner.sure_slots)
        takes at least as many holds per slot as an entry one expected duration from now, since holds are
        repeated additions; a queue already built is counted exactly. No queue is built here.
        """
        planner, speeds = self.planner, self.planner.speeds
        total = 0
        for target in self.candidates:
            of = speeds.of(target)
            if slowness < SLOW_FACTOR * of:
                continue
            step = scale * of
            queue = planner.queues.get(target)
            if queue is None:
                slots = planner.sure_slots(target)
                if not slots:
                    continue
                free_at, holds = step, 0
                while free_at + step <= bound:
                    free_at = free_at + step
                    holds += 1
                total += slots * holds
            elif queue and queue[0] != float("inf"):
                for free_at in queue:
                    while free_at + step <= bound:
                        free_at = free_at + step
                        total += 1
            if total >= limit:
                return True
        return False
