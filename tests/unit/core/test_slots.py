"""Reactive slots (FLIP-159): the pure slot arithmetic and the scheduler's TargetsObserved rules, fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.messages import Cancel, FailStage, Launch, SlotLost, TargetsObserved, Tick
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.slots import (
    TargetView,
    Worker,
    cores_per_attempt,
    free_slots,
    holder_gone,
    parse_workers,
    standalone_view,
)
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.exceptions import ConfigError
from tests.unit.core.scheduler_helpers import step

S = AttemptState


def sched(parallelism: int, *names: str, **config) -> StageScheduler:
    targets = tuple(Target(name=n, slots=4) for n in names)
    return StageScheduler(parallelism=parallelism, config=SpeculativeConfig(targets=targets, **config))


def offer(free: dict[str, int], capacity: dict[str, int] | None = None, **lost) -> TargetsObserved:
    return TargetsObserved(free=free, capacity=capacity if capacity is not None else dict(free), **lost)


def launches(actions) -> list[tuple[int, str]]:
    return [(a.subtask, a.target) for a in actions if isinstance(a, Launch)]


# -- pure arithmetic ------------------------------------------------------------------------------


def test_free_slots_subtract_every_holder_and_respect_the_offer():
    assert free_slots({"a": 4, "b": 2}, {"a": 3, "b": 5}) == {"a": 1, "b": 0}
    # The master says fewer cores are free (another application): the offer bounds it.
    assert free_slots({"a": 4}, {"a": 1}, {"a": 1}) == {"a": 1}
    assert free_slots({"a": 4}, {"a": 1}, {"a": 0}) == {"a": 0}


def test_standalone_capacity_counts_alive_workers_only():
    status = {"workers": [
        {"id": "w1", "host": "h1", "state": "ALIVE", "cores": 4, "coresfree": 2},
        {"id": "w2", "host": "h2", "state": "DEAD", "cores": 4, "coresfree": 4},
        # A restarted worker registers again under a newer id: the newest registration wins.
        {"id": "w0", "host": "h3", "state": "DEAD", "cores": 2, "coresfree": 2},
        {"id": "w3", "host": "h3", "state": "ALIVE", "cores": 2, "coresfree": 1},
    ]}
    workers = parse_workers(status)
    view = standalone_view("c", workers, per_attempt=2, held=1, now=5.0)
    assert view.live and view.nodes == {"h1", "h3"}
    assert view.capacity == 2 + 1 and view.offered == 1 + 0
    assert view.free == 1  # min(capacity - held = 2, offered = 1)
    dead = standalone_view("c", [Worker("h2", "DEAD", 4, 4)], 1, 0, 5.0)
    assert not dead.live and dead.capacity == 0 and "no ALIVE worker" in dead.reason


def test_cores_per_attempt_comes_from_the_target_conf():
    assert cores_per_attempt({}) == 1
    assert cores_per_attempt({"spark.executor.cores": "2"}) == 2
    assert cores_per_attempt({"spark.cores.max": "3", "spark.executor.cores": "1"}) == 3


def test_a_slot_is_reclaimed_only_from_a_provably_gone_holder():
    holder = {"claimed_at": 100.0}
    assert holder_gone(holder, {"state": "FINISHED"}, True, 101.0) == "attempt FINISHED"
    assert holder_gone(holder, {"state": "RUNNING", "alive_at": 100.0}, True, 110.0) is None  # live: never stolen
    assert "silent" in holder_gone(holder, {"state": "RUNNING", "alive_at": 100.0}, True, 200.0)
    assert holder_gone(holder, None, True, 1000.0) is None  # claimed, not started yet: the controller owns it
    assert holder_gone(holder, None, False, 110.0) is None  # slot claimed a moment before claim.json
    assert holder_gone(holder, None, False, 1000.0) == "attempt never launched"


def test_reactive_target_config_is_validated_at_parse_time():
    config = SpeculativeConfig().with_overrides({"targets": [
        {"name": "c", "slots": "auto", "master_ui": "http://m:8080/", "conf": {"spark.executor.cores": "2"}}]}, "dag")
    (target,) = config.targets
    assert target.auto_slots and target.master_ui == "http://m:8080"
    # Without spark.cores.max a standalone application takes every free core: set from executor cores.
    assert target.conf["spark.cores.max"] == "2"
    # Round trip through plan.json.
    assert SpeculativeConfig.from_json(config.to_json()).targets == config.targets
    # The URL may come from the connection instead: checked when the stage is planned.
    assert SpeculativeConfig().with_overrides({"targets": [{"name": "c", "slots": "auto"}]}, "d").targets[0].auto_slots
    with pytest.raises(ConfigError, match="only used with 'slots': 'auto'"):
        SpeculativeConfig().with_overrides({"targets": [{"name": "c", "slots": 2, "master_ui": "http://m:1"}]}, "d")
    with pytest.raises(ConfigError, match="expected an http"):
        SpeculativeConfig().with_overrides({"targets": [{"name": "c", "slots": "auto", "master_ui": "m:8080"}]}, "d")
    with pytest.raises(ConfigError, match="slot_wait_timeout"):
        SpeculativeConfig().with_overrides({"slot_wait_timeout": 0}, "dag")


# -- the scheduler ---------------------------------------------------------------------------------


def test_launches_never_exceed_the_free_slots_the_store_reports():
    s = sched(6, "a", "b")
    # Other stages hold slots: only what is free is taken, however many subtasks want one.
    actions = s.handle(offer({"a": 1, "b": 2}), Tick(0.0))
    assert sorted(t for _, t in launches(actions)) == ["a", "b", "b"]
    # Next tick, nothing freed: nothing launched, the rest keep waiting (not failed).
    assert launches(s.handle(offer({"a": 0, "b": 0}, {"a": 4, "b": 4}), Tick(1.0))) == []
    assert "waiting for a free slot" in s.slot_status(1.0)


def test_placement_fills_targets_by_free_share_not_free_count():
    # a: 2 slots, b: 1 slot, all free. By share: a (2/2), then b (1/1 beats a's 1/2), then a (1/2 beats 0/1),
    # as the per-stage rule did by load / slots; by free count b would wait until a was down to 1.
    s = sched(3, "a", "b")
    assert launches(s.handle(offer({"a": 2, "b": 1}), Tick(0.0))) == [(0, "a"), (1, "b"), (2, "a")]


def test_a_target_appearing_mid_stage_gets_attempts_at_the_next_tick():
    s = sched(3, "a", "b")
    assert launches(s.handle(offer({"a": 1, "b": 0}, {"a": 1, "b": 0}, lost_targets={"b": "down"}), Tick(0.0))) == [
        (0, "a")]
    assert launches(s.handle(offer({"a": 0, "b": 0}, {"a": 1, "b": 0}, lost_targets={"b": "down"}), Tick(1.0))) == []
    # b's server answers again (one check interval later): it receives the waiting subtasks at once.
    assert launches(s.handle(offer({"a": 0, "b": 2}, {"a": 1, "b": 2}), Tick(2.0))) == [(1, "b"), (2, "b")]


def test_attempts_of_a_lost_target_are_cancelled_rerun_and_not_counted():
    s = sched(2, "a", "b", max_failures_per_subtask=0, max_failures_per_stage=0)
    s.handle(offer({"a": 1, "b": 1}), Tick(0.0))
    on_b = next(a for a in s.all_attempts() if a.target == "b")
    step(s, 1.0, [replace(on_b, state=S.RUNNING, deploying_at=1.0)])
    actions = s.handle(offer({"a": 0, "b": 0}, {"a": 1, "b": 0}, lost_targets={"b": "server does not answer"}),
                       Tick(2.0))
    cancels = [a for a in actions if isinstance(a, Cancel)]
    assert [(c.subtask, c.attempt) for c in cancels] == [(on_b.subtask, 0)]
    assert "target b lost: server does not answer" in cancels[0].reason
    # The cancelled attempt dies as FAILED (its client lost the server): still not counted, stage not failed.
    dying = s.attempts[on_b.subtask][0]
    actions = step(s, 3.0, [replace(dying, state=S.FAILED, end_at=3.0, cause="connection refused")])
    assert not [a for a in actions if isinstance(a, FailStage)]
    assert s.stage_failures() == 0 and s.failures(on_b.subtask) == 0
    # Rerun on the live target once a slot frees there.
    assert launches(s.handle(offer({"a": 1, "b": 0}, {"a": 1, "b": 0}, lost_targets={"b": "x"}), Tick(4.0))) == [
        (on_b.subtask, "a")]


def test_an_attempt_failing_on_a_lost_node_is_not_counted_but_one_on_a_live_node_is():
    s = sched(2, "c", max_failures_per_subtask=5, max_failures_per_stage=5)
    s.handle(offer({"c": 2}), Tick(0.0))
    a0, a1 = s.attempts[0][0], s.attempts[1][0]
    step(s, 1.0, [replace(a0, state=S.RUNNING, node="h2", deploying_at=1.0),
                  replace(a1, state=S.RUNNING, node="h1", deploying_at=1.0)])
    # The worker h2 leaves the alive list; before the tick the attempt is seen FAILED: not its fault.
    actions = s.handle(offer({"c": 0}, {"c": 1}, lost_nodes={"h2": "worker left the master's alive list"}),
                       *[], Tick(2.0))
    assert [c.subtask for c in actions if isinstance(c, Cancel)] == [0]
    step(s, 3.0, [replace(s.attempts[0][0], state=S.FAILED, end_at=3.0)])
    assert s.failures(0) == 0 and (0, 0) in s.target_lost
    # h1 stayed live: its attempt's failure counts.
    step(s, 4.0, [replace(s.attempts[1][0], state=S.FAILED, end_at=4.0, cause="bug")])
    assert s.failures(1) == 1 and s.stage_failures() == 1


def test_an_attempt_seen_on_a_lost_node_after_the_loss_is_cancelled_too():
    s = sched(1, "c")
    s.handle(offer({"c": 1}), Tick(0.0))
    s.handle(offer({"c": 0}, {"c": 1}, lost_nodes={"h2": "gone"}), Tick(1.0))
    # Its heartbeat named the node only now (executors' hosts come without change notices).
    actions = step(s, 2.0, [replace(s.attempts[0][0], state=S.RUNNING, node="h2", deploying_at=1.0)])
    assert [(c.subtask, c.attempt) for c in actions if isinstance(c, Cancel)] == [(0, 0)]


def test_no_live_slot_waits_with_a_status_then_fails_naming_the_stage_and_targets():
    targets = (Target(name="a", slots=4), Target(name="b", slots=4))
    s = StageScheduler(parallelism=1, config=SpeculativeConfig(targets=targets, slot_wait_timeout=60.0),
                       label="pipeline p, stage scan")
    dead = offer({"a": 0, "b": 0}, {"a": 0, "b": 0}, lost_targets={"a": "down", "b": "down"})
    assert s.handle(dead, Tick(0.0)) == []
    assert s.slot_status(30.0).startswith("waiting for a live slot on targets a, b for 30s")
    assert s.handle(dead, Tick(59.0)) == []
    (failed,) = [a for a in s.handle(dead, Tick(60.0)) if isinstance(a, FailStage)]
    assert "pipeline p, stage scan: no live slot on targets a, b for 60s" in failed.reason
    # A target coming back before the timeout resets the wait.
    s2 = sched(1, "a", slot_wait_timeout=60.0)
    s2.handle(offer({"a": 0}, {"a": 0}, lost_targets={"a": "down"}), Tick(0.0))
    assert launches(s2.handle(offer({"a": 1}), Tick(50.0))) == [(0, "a")]
    assert s2.waiting_for_slot_since is None


def test_a_lost_slot_race_forgets_the_launch_and_retries():
    s = sched(1, "a")
    (launch,) = [a for a in s.handle(offer({"a": 1}), Tick(0.0)) if isinstance(a, Launch)]
    assert s.handle(SlotLost(launch.subtask, launch.attempt, "a")) == []
    assert s.attempts[0] == {}
    assert launches(s.handle(offer({"a": 1}), Tick(1.0))) == [(0, "a")]
    assert s.attempts[0][0].number == 0  # the number was never claimed: reused


def test_without_observations_the_fixed_per_stage_slots_still_apply():
    s = sched(10, "a")
    assert len(launches(step(s, 0.0))) == 4  # Target a has 4 slots


def test_target_view_json():
    view = TargetView("a", live=True, capacity=3, held=1, checked_at=1.0)
    assert view.to_json() == {"live": True, "capacity": 3, "held": 1, "free": 2, "reason": "", "nodes": None,
                              "checked_at": 1.0}
