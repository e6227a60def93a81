"""The last wave's rules (core/placing.py, _LastWave): what goes first, and what waits for a faster target."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from airflow_provider_speculative.core import placing
from airflow_provider_speculative.core.messages import Launch
from airflow_provider_speculative.core.placing import TAIL_MARGIN, _Job, _LastWave
from airflow_provider_speculative.devtools.simulator import (
    POLICIES,
    NodeSpec,
    Scenario,
    Simulator,
    StageSpec,
    cluster,
    simulate,
)


def original(subtask: int, duration: float) -> _Job:
    return _Job(subtask, "initial attempt", False, duration)


def copy(subtask: int, duration: float, left: float) -> _Job:
    return _Job(subtask, "speculative copy", True, duration, left)


def two_slots(d: float, running: float, count: int) -> list[float]:
    """When a target of two slots frees, one slot free now and one busy for ``running`` s, each use taking ``d``."""
    free, events = [0.0, running], []
    while len(events) < count:
        at = min(free)
        events.append(at)
        free[free.index(at)] = at + d
    return events


def test_on_two_fast_slots_a_copy_never_overtakes_the_last_two_originals() -> None:
    # The regression of the earlier tail-copy rule on the real pool: the throttled server's original overdue early,
    # two fresh originals left, one slot of the fast server free. The copy would end its subtask 3 s sooner, but
    # the second original would start when the copy ends instead and end when the copy would have: no gain.
    for running in (0.2, 1.0, 2.0):
        for left in (3.5, 6.0, 50.0):
            wave = _LastWave(two_slots(3.0, running, 4), [original(6, 3.0), original(7, 3.0), copy(2, 3.0, left)],
                             free_now=1, unit=3.0)
            assert wave.first() is None, (running, left)


def test_on_many_fast_slots_a_long_copy_goes_before_the_originals() -> None:
    # 56 originals of about 30 s and 100 fast slots freeing every 0.3 s: after them, a copy would start in 17 s
    # and end its subtask (150 s left on a slow node) in 77 s; first, in 60 s, while each original starts 0.3 s
    # later and still ends by 47 s.
    events = [0.3 * i for i in range(60)]
    jobs = [original(s, 30.0) for s in range(56)] + [copy(99, 60.0, 150.0)]
    wave = _LastWave(events, jobs, free_now=1, unit=30.0)
    found = wave.first()
    assert found is not None and found[0].subtask == 99
    assert "placed first in the last wave: expected to end its subtask in 60.0s instead of 76.8s" in found[1]
    wave.took(found[0])
    assert wave.ahead == 1 and all(not job.copy for job in wave.jobs) and wave.first() is None


def test_a_copy_whose_original_ends_first_anyway_stays_behind() -> None:
    events = [0.3 * i for i in range(60)]
    jobs = [original(s, 30.0) for s in range(56)] + [copy(99, 60.0, 40.0)]
    assert _LastWave(events, jobs, free_now=1, unit=30.0).first() is None


def test_a_large_original_queued_behind_small_ones_goes_first() -> None:
    events = [0.5 * i for i in range(12)]
    jobs = [original(s, 10.0) for s in range(9)] + [original(9, 40.0), copy(20, 10.0, 30.0)]
    found = _LastWave(events, jobs, free_now=2, unit=10.0).first()
    assert found is not None and found[0].subtask == 9 and not found[0].copy


def test_a_copy_goes_first_only_if_the_copies_it_overtakes_still_end_before_it_would_have() -> None:
    # Two copies end last within a slot of each other: the later one first would make the other end later still.
    events = [0.0, 1.3, 2.8, 4.1, 5.5]
    jobs = [original(10, 3.0), original(11, 3.6), copy(1, 3.4, 11.2), copy(3, 3.3, 10.1)]
    assert _LastWave(events, jobs, free_now=1, unit=3.0).first() is None


def test_ties_and_gains_within_the_margin_keep_the_walks_order() -> None:
    unit = 10.0
    events = [0.0, 0.0, 1.0, 1.0]
    gain = TAIL_MARGIN * unit / 2
    jobs = [original(0, 10.0), original(1, 10.0), copy(5, 10.0, 11.0 + gain)]
    assert _LastWave(events, jobs, free_now=1, unit=unit).first() is None


def test_an_original_waits_for_a_faster_target_only_if_it_would_end_the_wave_later_there() -> None:
    events = [2.0, 4.0, 6.0, 8.0]
    jobs = [original(0, 10.0), original(1, 10.0), original(2, 30.0)]
    wave = _LastWave(events, jobs, free_now=0, unit=10.0)
    # On a target twice as slow: subtask 2 (30 s) would end in 60 s there, vs 36 s after waiting; the wave's
    # last ends in 36 s.
    assert wave.hold(2, 2.0) == (60.0, 36.0, 36.0)
    # Subtask 0 (10 s): 20 s there, before the wave's last end: it takes the slow slot.
    assert wave.hold(0, 2.0) is None
    # Within the hold margin (1.2x slower: 36 vs 36): placed.
    assert wave.hold(2, 1.2) is None


def test_a_copy_waits_for_a_faster_target_whatever_its_original_is_guessed_to_need() -> None:
    events = [1.0, 2.0, 3.0]
    jobs = [original(0, 10.0), copy(7, 20.0, 25.0)]
    wave = _LastWave(events, jobs, free_now=0, unit=10.0)
    # 40 s on a target twice as slow, 22 s when it waits: it waits, though its original is guessed to end in 25 s.
    assert wave.hold(7, 2.0, copy=True) == (40.0, 22.0, 22.0)
    assert wave.hold(7, 1.2, copy=True) is None


def mirror(slow_speed: float) -> Scenario:
    """The real pool's regression: 2 servers of 2 slots, one throttled; the speed check calls it 2x slower.

    Q1's scan of 8 subtasks (one 30 % shorter, so the fast server's slots free one at a time) then the aggregate.
    The throttled server's one original becomes overdue early; its copy is wanted while two originals remain.
    """
    nodes = (NodeSpec("local-a", slots=2, cores=1.0), NodeSpec("local-b", slots=2, cores=1.0, speed=slow_speed))
    scan = StageSpec("scan", (1.0, 1.0, 1.0, 0.7, 1.0, 1.0, 1.0, 1.0))
    return Scenario("mirror", nodes, (scan, StageSpec("aggregate", (0.4, 0.4))), startup=0.25, speed_check=0.15)


@pytest.mark.parametrize("slow_speed", [0.14, 0.16, 0.18])
def test_the_two_server_regression_places_no_copy_first_and_is_not_slower(slow_speed: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, int, Any]] = []
    first = _LastWave.first

    def recorded(self: _LastWave) -> Any:
        found = first(self)
        asked.append((sum(not j.copy for j in self.jobs), sum(j.copy for j in self.jobs), found))
        return found

    monkeypatch.setattr(_LastWave, "first", recorded)
    launches: list[Launch] = []
    carry_out = Simulator.carry_out

    def seen(self: Simulator, actions: Any) -> Any:
        done = carry_out(self, actions)
        launches.extend(a for a in done if isinstance(a, Launch))
        return done

    monkeypatch.setattr(Simulator, "carry_out", seen)
    with_rule = Simulator(mirror(slow_speed), POLICIES["provider"]).run()
    # The copy was wanted with the last two originals queued and weighed: it stayed behind them.
    assert (2, 1, None) in asked
    assert not any("placed first" in a.reason for a in launches)
    without = simulate(mirror(slow_speed), "provider", overrides={"plan_last_wave": False})
    assert with_rule.makespan <= without.makespan


def test_switched_off_the_last_wave_is_never_modelled(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("last wave modelled")

    nodes = tuple(replace(n, speed=s) for n, s in zip(cluster(12, slots=2), [1.0, 0.5, 0.25] * 4, strict=True))
    scenario = Scenario("hetero", nodes, (StageSpec("s", tuple(10.0 + (i % 7) for i in range(60))),), startup=0.5)
    monkeypatch.setattr(placing._LastWave, "build", classmethod(refused))
    for policy in ("spark", "late", "mantri"):
        simulate(scenario, policy)  # the modelled systems place originals first: no last-wave rule
    simulate(scenario, "provider", overrides={"plan_last_wave": False})
    with pytest.raises(AssertionError, match="last wave modelled"):
        simulate(scenario, "provider")


def test_a_job_ends_when_its_original_would_if_that_is_sooner() -> None:
    assert copy(1, 10.0, 4.0).end(0.0) == 4.0
    assert copy(1, 10.0, 40.0).end(5.0) == 15.0
    assert original(1, 10.0).end(5.0) == 15.0 and original(1, 10.0).left == math.inf
