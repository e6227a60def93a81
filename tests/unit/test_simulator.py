"""The simulator drives the real scheduler core (no copy of its rules); determinism, node loss, what-if replay."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import pytest

from airflow_provider_speculative.core import detector as core_detector
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.messages import Action, Launch
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.devtools import simulator
from airflow_provider_speculative.devtools.simulator import (
    POLICIES,
    HostSpec,
    NodeLoss,
    NodeSpec,
    Scenario,
    Simulator,
    StageSpec,
    check_overrides,
    cluster,
    lognormal_work,
    simulate,
    slow_spells,
    whatif,
)
from airflow_provider_speculative.exceptions import ConfigError


def small(seed: int = 7, *, nodes: int = 6, subtasks: int = 10, slow: float = 0.125) -> Scenario:
    rng = random.Random(seed)
    specs = cluster(nodes, slots=1)
    return Scenario("small", specs, (StageSpec("s", lognormal_work(subtasks, rng, 10.0, 0.2)),), startup=0.5,
                    spells=slow_spells(specs, 0.2, slow, rng))


def test_every_action_is_the_cores_answer_to_the_same_stimuli(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple[Any, ...], list[Any]]] = []
    original = StageScheduler.handle

    def recording(self: StageScheduler, *stimuli: Any) -> list[Any]:
        actions = original(self, *stimuli)
        calls.append((stimuli, list(actions)))
        return actions

    monkeypatch.setattr(StageScheduler, "handle", recording)
    sim = Simulator(small(), POLICIES["provider"])
    result = sim.run()
    monkeypatch.setattr(StageScheduler, "handle", original)
    assert result.copies > 0 and calls
    assert type(sim.sched) is StageScheduler
    # The same stimuli fed directly to a fresh core scheduler give the same actions, call by call.
    fresh = StageScheduler(parallelism=10, config=sim.config, input_bytes=dict(sim.sched.input_bytes),
                           label=sim.sched.label, target_history={}, history_source={})
    for stimuli, actions in calls:
        assert fresh.handle(*stimuli) == actions
    assert fresh.completed and fresh.admitted == sim.sched.admitted


def test_the_provider_policy_uses_the_cores_detector_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    judge = core_detector.judge_one

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return judge(*args, **kwargs)

    monkeypatch.setattr(core_detector, "judge_one", spy)
    result = simulate(small(), "provider")
    assert seen and result.copies > 0
    # No copy of the rule in the simulator: it neither defines nor imports the core's detector functions.
    for name in ("judge_slow", "judge_one", "SlowWatch", "find_slow", "compute_baseline", "derived_floor",
                 "required_finished"):
        assert not hasattr(simulator, name), name
    assert POLICIES["provider"].rule is None and POLICIES["flink"].rule is None and POLICIES["none"].rule is None


def test_with_the_core_rule_broken_the_provider_policy_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("core detector called")

    monkeypatch.setattr(core_detector, "judge_one", broken)
    with pytest.raises(RuntimeError, match="core detector called"):
        simulate(small(), "provider")


def test_same_seed_same_result_other_seed_other_trace() -> None:
    def figures(seed: int) -> tuple[Any, ...]:
        r = simulate(small(seed), "provider")
        return (r.makespan, r.attempt_seconds, r.copies, r.copies_won, r.steps)

    assert figures(3) == figures(3)
    assert figures(3) != figures(4)


def test_speculation_beats_none_on_a_slow_node_and_costs_nothing_without_one() -> None:
    scenario = small(slow=0.125)
    assert simulate(scenario, "provider").makespan < simulate(scenario, "none").makespan
    healthy = simulate(scenario.healthy(), "provider")
    assert healthy.copies == 0 and healthy.wasted_seconds == 0


def test_a_lost_node_reruns_its_attempts_elsewhere_without_counting_failures() -> None:
    rng = random.Random(1)
    nodes = cluster(4, slots=1)
    scenario = Scenario("loss", nodes, (StageSpec("s", lognormal_work(12, rng, 10.0, 0.1)),), startup=0.5,
                        losses=(NodeLoss(nodes[0].name, 5.0),))
    sim = Simulator(scenario, POLICIES["provider"])
    result = sim.run()
    assert result.failed is None and sim.sched is not None and sim.sched.completed
    on_lost = [a for a in sim.sched.all_attempts() if a.target == nodes[0].name]
    assert on_lost and all(a.created_at is not None and a.created_at < 5.0 for a in on_lost)
    assert sim.sched.target_lost and sim.sched.stage_failures() == 0
    assert result.makespan > simulate(scenario.healthy(), "provider").makespan


def test_alternative_rules_run_through_the_core_placement() -> None:
    for name in ("spark", "late", "mantri"):
        sim = Simulator(small(slow=0.125), POLICIES[name])
        result = sim.run()
        assert isinstance(sim.sched, simulator.RuleScheduler) and result.failed is None, name
        assert sim.sched.completed


def test_unknown_or_bad_overrides_are_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="baseline_multipler"):
        check_overrides({"baseline_multipler": "2"})
    with pytest.raises(ConfigError, match="baseline_multiplier"):
        check_overrides({"baseline_multiplier": "0.5"})
    assert check_overrides({"max_concurrent_executions": "3"}) == {"max_concurrent_executions": 3}


# -- what-if on a small store written as the controller and backends write it ----------------------------


def write_store(root: Path, *, slow: float = 4.0) -> tuple[str, str]:
    """A finished 4-subtask stage on targets fast (2 slots) and slow (1 slot, ``slow`` x slower), one copy."""
    dag, run, stage = "dag", "run1", "scan"
    base = root / dag / run / stage
    base.mkdir(parents=True)
    config = {"enabled": True, "targets": [{"name": "fast", "slots": 2}, {"name": "slow", "slots": 1}],
              "check_interval": 1.0}
    plan = {"stage": stage, "parallelism": 4, "store_root": str(root), "dag_id": dag, "run_id": run,
            "config": config, "subtasks": [{"input_bytes": 1000}] * 4, "upstreams": []}
    (base / "plan.json").write_text(json.dumps(plan))
    t0 = 1000.0
    # (subtask, attempt, target, speculative, launched, ready, end, state, admitted)
    rows = [(0, 0, "fast", False, 0.0, 0.5, 5.5, "FINISHED", True),
            (1, 0, "fast", False, 0.0, 0.5, 5.5, "FINISHED", True),
            (2, 0, "slow", False, 0.0, 0.5 * slow, 0.5 * slow + 5 * slow, "CANCELED", False),
            (3, 0, "fast", False, 5.6, 6.1, 11.1, "FINISHED", True),
            (2, 1, "fast", True, 5.6, 6.1, 11.1, "FINISHED", True)]
    journal = []
    for subtask, number, target, spec, launched, ready, end, state, admitted in rows:
        if state == "CANCELED":
            end = 11.2
        d = base / f"subtask={subtask}" / f"attempt={number}"
        d.mkdir(parents=True)
        (d / "claim.json").write_text(json.dumps({"target": target, "speculative": spec,
                                                  "created_at": t0 + launched}))
        (d / "status.json").write_text(json.dumps({"state": state, "launched_at": t0 + launched,
                                                   "deploying_at": t0 + launched, "end_at": t0 + end,
                                                   "exit_code": 0 if state == "FINISHED" else None}))
        (d / "heartbeat.json").write_text(json.dumps({"session_ready_at": t0 + ready, "node": target,
                                                      "input_bytes": 1000}))
        if admitted:
            (base / f"subtask={subtask}" / "admitted.json").write_text(json.dumps({"attempt": number}))
        journal.append({"at": t0 + launched, "event": "launch", "subtask": subtask, "attempt": number,
                        "target": target, "speculative": spec})
    journal.append({"at": t0 + 11.3, "event": "stage_complete", "admitted": {"0": 0, "1": 0, "2": 1, "3": 0}})
    (base / "journal.jsonl").write_text("".join(json.dumps(line) + "\n" for line in journal))
    return dag, run


def test_whatif_replays_a_recorded_run_and_applies_overrides(tmp_path: Path) -> None:
    dag, run = write_store(tmp_path)
    result = whatif(tmp_path, dag, run, {})
    recorded, replayed = result["recorded"], result["replayed"]
    assert recorded["copies"] == 1 and recorded["copies_won"] == 1
    assert recorded["makespan"] == pytest.approx(11.3)
    assert abs(replayed["makespan"] - recorded["makespan"]) <= 0.15 * recorded["makespan"]
    assert result["model"]["target_speeds"]["slow"] < 0.5 < result["model"]["target_speeds"]["fast"]
    off = whatif(tmp_path, dag, run, {"enabled": "false"})
    assert off["whatif"]["copies"] == 0 and off["overrides"] == {"enabled": "false"}
    with pytest.raises(ConfigError, match="unknown option"):
        whatif(tmp_path, dag, run, {"no_such_option": "1"})


def test_whatif_cli_refuses_a_set_without_equals(capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_speculative.cli.commands import parse_sets

    assert parse_sets(["baseline_multiplier=2", " max_concurrent_executions = 3"]) == {
        "baseline_multiplier": "2", "max_concurrent_executions": "3"}
    with pytest.raises(SystemExit):
        parse_sets(["baseline_multiplier"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_node_specs_default_to_one_core_per_slot() -> None:
    sim = Simulator(Scenario("x", (NodeSpec("a", slots=2),), (StageSpec("s", (1.0, 1.0)),)), POLICIES["none"])
    assert sim.run().makespan == pytest.approx(1.0 + 1.0, abs=0.2)



def _hosted(*speeds: float, background: float = 1.0) -> Scenario:
    """One one-core, one-slot node per speed on one 2-core host, one 10 s subtask per node."""
    nodes = tuple(NodeSpec(f"n{i}", slots=1, cores=1.0, speed=v, host="h") for i, v in enumerate(speeds))
    return Scenario("hosted", nodes, (StageSpec("s", (10.0,) * len(nodes)),), startup=0.0,
                    hosts=(HostSpec("h", 2.0, background),))


def _ends(scenario: Scenario) -> dict[str, float]:
    sim = Simulator(scenario, POLICIES["none"])
    sim.run()
    assert sim.sched is not None
    return {a.target: a.end_at for a in sim.sched.all_attempts() if a.end_at is not None}


def test_nodes_on_one_host_share_its_free_cores_and_a_throttled_one_leaves_its_share_to_the_other() -> None:
    # Two servers, 1 core left by the host's other processes: each gets half of it.
    assert _ends(_hosted(1.0, 1.0)) == {"n0": pytest.approx(20.0), "n1": pytest.approx(20.0)}
    # Throttled to 1/4 core, n1 uses 0.25 of the free core and n0 gets the other 0.75 (its fair share would be 0.5).
    ends = _ends(_hosted(1.0, 0.25))
    assert ends["n0"] == pytest.approx(10.0 / 0.75)
    # n1 ran at 0.25 until n0 ended, then at its quota still (the host's free core exceeds it).
    assert ends["n1"] == pytest.approx(40.0)
    # Once a node's process ends, the other gets the host's whole free core (up to its own quota).
    ends = _ends(replace(_hosted(1.0, 1.0), stages=(StageSpec("s", (5.0, 10.0)),)))
    assert ends == {"n0": pytest.approx(10.0), "n1": pytest.approx(15.0)}
    # An idle host gives every node its quota: the same as cores of its own.
    assert _ends(_hosted(1.0, 0.25, background=0.0)) == {"n0": pytest.approx(10.0), "n1": pytest.approx(40.0)}
    with pytest.raises(ConfigError, match="unknown host"):
        Simulator(replace(_hosted(1.0), hosts=()), POLICIES["none"])


def test_a_speed_check_on_a_shared_host_sees_the_throttled_servers_share() -> None:
    nodes = (NodeSpec("a", slots=2, cores=1.0, host="h"), NodeSpec("b", slots=2, cores=1.0, speed=0.25, host="h"))
    scenario = Scenario("check", nodes, (StageSpec("s", (1.0,) * 4),), speed_check=0.1,
                        hosts=(HostSpec("h", 2.0, 1.0),))
    sim = Simulator(scenario, POLICIES["provider"])
    # a gets 0.75 of the free core and b its 0.25: the check waits twice a's time, b has not answered by then.
    assert sim._speed_check() == pytest.approx(2 * 0.1 / 0.75)
    assert sim.history["b"] >= 2.0 and sim.history["a"] == 1.0 and sim.history_source["b"] == "speed check"
    # With cores of their own a answers in 0.1 s.
    alone = Simulator(replace(scenario, nodes=tuple(replace(n, host=None) for n in nodes), hosts=()),
                      POLICIES["provider"])
    assert alone._speed_check() == pytest.approx(0.2)


def _late_sched(shares: dict[int, float], elapsed: float = 10.0) -> StageScheduler:
    """A stage on 20 one-slot targets whose subtasks run one attempt each, ``shares`` of their work done."""
    targets = tuple(Target(name=f"n{i}") for i in range(20))
    sched = StageScheduler(parallelism=len(shares), config=SpeculativeConfig(enabled=True, targets=targets))
    for subtask in shares:
        sched.attempts[subtask][0] = Attempt(subtask=subtask, number=0, target=f"n{subtask}",
                                             state=AttemptState.RUNNING, deploying_at=0.0, ready_at=1.0)
    return sched


def test_late_speculates_below_the_25th_percentile_rate_most_time_left_first_within_its_cap() -> None:
    rule = simulator.LateRule()
    assert (rule.slow_task, rule.slow_node, rule.cap) == (0.25, 0.25, 0.10)  # LATE, OSDI'08, section 4
    shares = {0: 0.9, 1: 0.8, 2: 0.1, 3: 0.3, 4: 0.2, 5: 0.7, 6: 0.6, 7: 0.5}
    sched = _late_sched(shares)

    def progress(attempt: Attempt) -> float:
        return shares[attempt.subtask]

    # Eight rates: the 25th percentile is the third slowest (0.3); strictly below it are 0.1 and 0.2. The cap,
    # 10 % of 20 slots, allows two copies at once: the most time left first.
    assert list(rule.judge(sched, 10.0, progress)) == [2, 4]
    # Available slots: with half the nodes lost (no capacity in TargetsObserved) the cap is one copy.
    sched.capacity = {f"n{i}": 1 if i < 10 else 0 for i in range(20)}
    sched.free_slots = dict.fromkeys(sched.capacity, 0)
    assert list(rule.judge(sched, 10.0, progress)) == [2]
    sched.capacity, sched.free_slots = {}, None
    sched.attempts[2][1] = Attempt(subtask=2, number=1, target="n9", speculative=True, state=AttemptState.RUNNING,
                                   deploying_at=9.0)
    assert list(rule.judge(sched, 10.0, progress)) == [4]  # one copy runs: one more within the cap
    sched.attempts[4][1] = Attempt(subtask=4, number=1, target="n8", speculative=True, state=AttemptState.RUNNING,
                                   deploying_at=9.0)
    assert rule.judge(sched, 10.0, progress) == {}


def test_late_copies_stay_within_the_cap_off_slow_nodes_in_the_rules_order(monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[tuple[list[int], set[str], list[Launch], int]] = []
    place = simulator.RulePlacement.walk

    def recording(self: simulator.RulePlacement, *args: Any) -> list[Any]:
        actions = place(self, *args)
        sched = self.state
        assert isinstance(sched, simulator.RuleScheduler)
        copies = [a for a in actions if isinstance(a, Launch) and a.speculative]
        live = sum(1 for a in sched.live_attempts() if a.speculative)
        steps.append((list(sched._judged), set(sched._avoid), copies, live))
        return actions

    monkeypatch.setattr(simulator.RulePlacement, "walk", recording)
    rng = random.Random(3)
    specs = cluster(20, slots=2)
    scenario = Scenario("late", specs, (StageSpec("s", lognormal_work(120, rng, 10.0, 0.3)),), startup=0.5,
                        spells=slow_spells(specs, 0.2, 0.125, rng))
    result = simulate(scenario, "late")
    assert result.copies >= 6 and result.failed is None
    for judged, avoid, copies, live in steps:
        assert live <= 4  # SpeculativeCap: 10 % of 40 slots
        assert not {c.target for c in copies} & avoid  # SlowNodeThreshold
        launched = [c.subtask for c in copies]
        assert launched == [s for s in judged if s in launched]  # most time left first
    assert any(avoid for _, avoid, copies, _ in steps if copies)
    # A free slot went to the task with the most time left, not to the lowest subtask number judged.
    assert any(copies and copies[0].subtask != min(judged) for judged, _, copies, _ in steps)


def test_every_action_type_has_a_handler() -> None:
    registry = Simulator.__dict__["_carry_out"].dispatcher.registry
    assert set(get_args(Action)) <= set(registry)


def test_an_unknown_action_is_refused() -> None:
    @dataclass(frozen=True)
    class Teleport:
        subtask: int

    sim = Simulator(small(), POLICIES["none"])
    with pytest.raises(TypeError, match="no handler for action type Teleport"):
        sim.carry_out([Teleport(0)])  # type: ignore[list-item]
