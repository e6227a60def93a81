"""StageController against a fake backend on a real temporary store: launch failure, lost claim,
lost admission, reaping, and the refusal of actions it does not know."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, get_args

import pytest

from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.control import controller as controller_module
from airflow_provider_speculative.control.controller import StageController, wait_for_next_step
from airflow_provider_speculative.core.faults import FaultInjection, Faults
from airflow_provider_speculative.core.messages import (
    Action,
    AdmissionLost,
    Admit,
    BlockNode,
    ClaimLost,
    Discard,
    FailStage,
    InputRestored,
    Launch,
    RecoveryFailed,
    SlotLost,
    Tick,
)
from airflow_provider_speculative.core.states import TERMINAL, Attempt, AttemptState
from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout
from airflow_provider_speculative.store.results import admitted_results
from airflow_provider_speculative.store.slots import TargetSlots, holder_record
from tests.factories import Clock, stage_plan, write_plan

S = AttemptState
# Subtask 0 of every stage is slow from the start: a copy runs at once (fault injection, core/faults.py).
FORCED = Faults(rules=(("*", FaultInjection(force_speculation=frozenset({0}))),))


class FakeBackend:
    """Attempts in memory; claims in the real store (so two controllers race on them for real)."""

    kind: ClassVar[str] = "fake"
    kill_grace = 0.0
    fork_server = False

    def cleanup_pending(self, subtask: int, attempt: int) -> bool:
        return False

    def __init__(self, layout: StageLayout, clock: Clock) -> None:
        self.layout, self.clock = layout, clock
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.launched: list[LaunchSpec] = []
        self.cancelled: list[tuple[int, int]] = []
        self.fail_launch: set[tuple[int, int]] = set()
        self.survives_cancel: set[tuple[int, int]] = set()

    def claim(self, subtask: int, attempt: int, record: dict[str, Any]) -> bool:
        return create_exclusive_json(self.layout.claim(subtask, attempt), record)

    def launch(self, spec: LaunchSpec) -> None:
        if (spec.subtask, spec.attempt) in self.fail_launch:
            raise RuntimeError("no executor slot")
        self.launched.append(spec)
        self.attempts[(spec.subtask, spec.attempt)] = Attempt(spec.subtask, spec.attempt, spec.target, S.RUNNING,
                                                              deploying_at=self.clock())
        changes.notify(self.layout.dir, spec.subtask, spec.attempt)

    def poll(self, subtask: int, attempt: int, now: float | None = None) -> Attempt:
        known = self.attempts.get((subtask, attempt))
        return replace(known) if known else Attempt(subtask, attempt, "local-a", S.CREATED)

    def probe(self, subtask: int, attempt: int, now: float) -> bool:
        return True

    def cancel(self, subtask: int, attempt: int, reason: str) -> None:
        self.cancelled.append((subtask, attempt))
        # As on the real backends, an attempt that already ended (FINISHED above all) keeps its state.
        known = self.attempts.get((subtask, attempt))
        if (subtask, attempt) not in self.survives_cancel and (known is None or known.state not in TERMINAL):
            self.set(subtask, attempt, S.CANCELED)

    def reap(self, subtask: int, attempt: int, now: float | None = None) -> bool:
        return (subtask, attempt) not in self.survives_cancel

    def invalidate(self, subtask: int, attempt: int, reason: str) -> None:
        self.set(subtask, attempt, S.CANCELED)

    def set(self, subtask: int, attempt: int, state: AttemptState) -> None:
        """Change an attempt's state and leave a change notice, as every real writer does."""
        self.attempts[(subtask, attempt)] = replace(self.attempts[(subtask, attempt)], state=state,
                                                    end_at=self.clock())
        changes.notify(self.layout.dir, subtask, attempt)

    def finish(self, subtask: int, attempt: int) -> None:
        """Finish with a manifest, as a real attempt writes it."""
        atomic_write_json(self.layout.manifest(subtask, attempt), {"files": [], "records": 0})
        self.set(subtask, attempt, S.FINISHED)


@dataclass
class Harness:
    controller: StageController
    backend: FakeBackend
    clock: Clock
    layout: StageLayout

    def step(self, seconds: float = 1.0) -> list[Any]:
        self.clock.now += seconds
        return self.controller.step()

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in read_jsonl(self.layout.journal) if e["event"] == name]


def harness(tmp_path: Path, parallelism: int = 2, faults: Faults | None = None, **config: Any) -> Harness:
    plan = stage_plan(tmp_path / "store", parallelism=parallelism, config=config)
    layout = write_plan(plan)
    clock = Clock()
    backend = FakeBackend(layout, clock)
    # One fake serves both targets: what matters here is the controller's handling, not placement.
    controller = StageController.open(plan, clock=clock, backends={"local-a": backend, "local-b": backend},
                                 observer=backend, faults=faults)
    return Harness(controller, backend, clock, layout)


@pytest.mark.parametrize("ended", [S.FINISHED, S.FAILED, S.CANCELED])
def test_the_fake_backend_cancels_as_the_real_ones_do(tmp_path: Path, ended: AttemptState) -> None:
    """A cancel leaves an ended attempt's state alone: on SupervisedBackend, which spark_submit and
    spark_connect extend (their cancel stops what is alive, their poll reports the recorded end), and on the fake."""
    from airflow_provider_speculative.backends.supervised import SupervisedBackend

    layout = write_plan(stage_plan(tmp_path / "store", parallelism=1))
    create_exclusive_json(layout.claim(0, 0), {"target": "local-a", "created_at": 1.0})
    # A pid and process group that do not exist: a wrong cancel could signal nothing of this test run.
    atomic_write_json(layout.status(0, 0), {"state": ended.value, "pid": 999_999_999, "pgid": 999_999_999,
                                            "deploying_at": 1.0, "end_at": 2.0})
    real = SupervisedBackend(layout)
    real.cancel(0, 0, "a sibling won")
    fake = FakeBackend(layout, Clock())
    fake.attempts[(0, 0)] = Attempt(0, 0, "local-a", ended, deploying_at=1.0, end_at=2.0)
    fake.cancel(0, 0, "a sibling won")
    assert real.poll(0, 0).state == fake.poll(0, 0).state == ended
    assert fake.poll(0, 0).end_at == 2.0 and fake.cancelled == [(0, 0)]


def test_a_launch_failure_is_a_failed_attempt_and_the_subtask_restarts(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1)
    h.backend.fail_launch.add((0, 0))
    h.step()
    assert h.events("launch_failed")[0]["cause"] == "no executor slot"
    assert read_json(h.layout.status(0, 0))["state"] == "FAILED"
    h.step()  # the scheduler hears of the failure and places attempt 1
    attempt0 = h.controller.scheduler.attempts[0][0]
    assert attempt0.state == S.FAILED and attempt0.cause == "launch failed: no executor slot"
    assert [(s.subtask, s.attempt) for s in h.backend.launched] == [(0, 1)]


def test_launch_failures_past_the_limit_fail_the_stage_once(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, max_failures_per_subtask=1)
    h.backend.fail_launch.update({(0, 0), (0, 1), (0, 2)})
    for _ in range(6):
        h.step()
    assert h.controller.result is not None and h.controller.done and not h.controller.succeeded
    payload = h.controller.event_payload()
    assert payload["status"] == "failed" and "subtask 0 failed 2 times" in payload["reason"]
    assert len(h.events("stage_failed")) == 1


def test_a_lost_claim_adopts_the_other_controllers_attempt(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1)
    # Another controller instance claimed and launched attempt 0 first.
    assert create_exclusive_json(h.layout.claim(0, 0), {"target": "local-a", "created_at": h.clock()})
    h.backend.attempts[(0, 0)] = Attempt(0, 0, "local-a", S.RUNNING, deploying_at=h.clock())
    changes.notify(h.layout.dir, 0, 0)
    h.step()
    assert h.backend.launched == []  # nothing launched twice
    assert h.events("claim_lost") == [{"at": h.clock(), "event": "claim_lost", "subtask": 0, "attempt": 0}]
    assert h.controller.scheduler.attempts[0][0].state == S.RUNNING


def test_a_lost_admission_keeps_the_other_winner_and_discards_ours(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2,
                faults=FORCED)
    h.step()
    h.step()
    assert sorted((s.subtask, s.attempt) for s in h.backend.launched) == [(0, 0), (0, 1)]
    # A concurrent controller admitted attempt 1 while we saw attempt 0 finish.
    assert create_exclusive_json(h.layout.admitted(0), {"attempt": 1, "at": h.clock()})
    h.backend.finish(0, 0)
    h.step()
    assert h.events("admit_lost") == [{"at": h.clock(), "event": "admit_lost", "subtask": 0, "attempt": 0,
                                       "winner": 1}]
    assert h.controller.scheduler.admitted == {0: 1}
    assert not h.layout.manifest(0, 0).exists()  # the discarded attempt's output is gone
    assert h.events("discard")[0]["attempt"] == 0


def test_losers_are_reaped_before_the_stage_is_done(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2,
                faults=FORCED)
    h.step()
    h.step()
    h.backend.survives_cancel.add((0, 0))  # the loser's driver takes a while to die
    h.backend.finish(0, 1)
    h.step()
    assert (0, 0) in h.backend.cancelled and h.controller.scheduler.admitted == {0: 1}
    assert not h.controller.done  # admitted, but the loser is still alive: the stage waits for it
    h.backend.survives_cancel.clear()
    h.backend.set(0, 0, S.CANCELED)  # the driver finally died
    h.step()
    assert h.controller.done and h.controller.succeeded and h.controller.event_payload()["admitted"] == {"0": 1}


def test_the_fault_hook_reaches_the_attempts_of_its_stage_only(tmp_path: Path) -> None:
    held = harness(tmp_path / "held", parallelism=1, faults=Faults(rules=(("d/scan", FaultInjection(hold_end=True)),)))
    held.step()
    (spec,) = held.backend.launched
    assert spec.env["SPECULATIVE_HOLD_END"] == str(held.layout.barrier_release(0))
    assert json.loads(spec.env["SPECULATIVE_FAULT_INJECTION"])["hold_end"] is True
    other = harness(tmp_path / "other", parallelism=1,
                    faults=Faults(rules=(("d/aggregate", FaultInjection(hold_end=True)),)))
    other.step()
    assert not {"SPECULATIVE_HOLD_END", "SPECULATIVE_FAULT_INJECTION"} & set(other.backend.launched[0].env)


def test_without_a_hook_given_the_controller_reads_the_processs_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULATIVE_FAULT_INJECTION", '{"stages": {"d/*": {"force_speculation": [0]}}}')
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2)
    h.step()
    h.step()
    assert sorted((s.subtask, s.attempt, s.speculative) for s in h.backend.launched) == [(0, 0, False), (0, 1, True)]
    monkeypatch.delenv("SPECULATIVE_FAULT_INJECTION")
    plain = harness(tmp_path / "plain", parallelism=1, enabled=True, max_concurrent_executions=2)
    plain.step()
    plain.step()
    assert [(s.subtask, s.attempt) for s in plain.backend.launched] == [(0, 0)]


def test_a_slot_given_back_is_placed_in_the_same_step(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=10)  # 2 targets x 4 slots: two subtasks wait for a slot
    h.step()
    h.step()
    assert len(h.backend.launched) == 8
    h.backend.finish(0, 0)
    h.step()
    # The step that admits subtask 0 gives its slot to subtask 8 at once, not a step (up to
    # check_interval) later.
    assert h.controller.scheduler.admitted == {0: 0}
    assert [(s.subtask, s.attempt) for s in h.backend.launched[8:]] == [(8, 0)]
    assert len(h.controller.held) == 8


def test_an_unknown_action_is_refused(tmp_path: Path) -> None:
    h = harness(tmp_path)

    @dataclass(frozen=True)
    class Teleport:
        subtask: int

    with pytest.raises(TypeError, match="no handler for action type Teleport"):
        h.controller._carry_out(Teleport(0), h.clock())  # type: ignore[arg-type]


def test_every_action_type_has_a_handler() -> None:
    registry = StageController.__dict__["_carry_out"].dispatcher.registry
    assert set(get_args(Action)) <= set(registry)


class Trace:
    """What a controller asks of its scheduler and carries out, in order, and how deeply each ``handle`` call nests.

    A depth counts the open ``handle`` calls and action handlings, the new call included: 1 is a call from
    the step's loop, more is a step nested in another (a ``handle`` called while an action is carried out).
    """

    def __init__(self, controller: StageController, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[str, Any]] = []
        self.depths: list[int] = []
        self._open = 0
        handle, carry_out = controller.scheduler.handle, controller._carry_out

        def traced_handle(*stimuli: Any) -> list[Action]:
            self._open += 1
            self.depths.append(self._open)
            self.log.append(("handle", stimuli))
            try:
                return handle(*stimuli)
            finally:
                self._open -= 1

        def traced_carry_out(action: Action, now: float) -> list[Any]:
            self._open += 1
            self.log.append(("carry out", action))
            try:
                return carry_out(action, now)
            finally:
                self._open -= 1

        monkeypatch.setattr(controller.scheduler, "handle", traced_handle)
        monkeypatch.setattr(controller, "_carry_out", traced_carry_out)

    def handled(self) -> list[tuple[Any, ...]]:
        """The stimuli of each ``handle`` call, in order."""
        return [stimuli for kind, stimuli in self.log if kind == "handle"]


def test_a_lost_claim_is_handled_after_its_launch_not_inside_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, parallelism=1)
    assert create_exclusive_json(h.layout.claim(0, 0), {"target": "local-a", "created_at": h.clock()})
    h.backend.attempts[(0, 0)] = Attempt(0, 0, "local-a", S.RUNNING, deploying_at=h.clock())
    trace = Trace(h.controller, monkeypatch)
    h.step()
    assert trace.depths and max(trace.depths) == 1
    launch = next(i for i, (kind, action) in enumerate(trace.log)
                  if kind == "carry out" and isinstance(action, Launch))
    # The outcome is the scheduler's next stimulus, right after the action that produced it.
    kind, stimuli = trace.log[launch + 1]
    assert kind == "handle" and [type(s) for s in stimuli] == [ClaimLost]
    assert stimuli[0].observed.state == S.RUNNING
    assert h.controller.scheduler.attempts[0][0].state == S.RUNNING


def test_a_lost_admissions_actions_come_before_the_rest_of_its_batch(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2, faults=FORCED)
    h.step()
    h.step()
    assert create_exclusive_json(h.layout.admitted(0), {"attempt": 1, "at": h.clock()})
    h.backend.finish(0, 0)
    trace = Trace(h.controller, monkeypatch)
    h.step()
    assert max(trace.depths) == 1
    assert trace.log[0][0] == "handle" and isinstance(trace.log[0][1][-1], Tick)
    # The Discard the lost admission led to is carried out before the first batch's next action.
    assert trace.log[1:4] == [("carry out", Admit(0, 0)), ("handle", (AdmissionLost(0, 0, 1),)),
                              ("carry out", Discard(0, 0, "attempt 1 was admitted by another controller"))]


class FinishedRecovery:
    """A partition re-production that has finished, as control/recovery.py reports it."""

    def __init__(self, outcome: str, reason: str | None = None) -> None:
        self.outcome, self.reason = outcome, reason

    def step(self) -> tuple[str, str | None]:
        return self.outcome, self.reason

    def committed_part(self) -> dict[str, Any]:
        return {"attempt": 3}


def test_finished_re_productions_are_heard_in_one_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, parallelism=1)
    h.step()
    h.controller.recoveries = {("scan", 0): FinishedRecovery("done"),  # type: ignore[dict-item]
                               ("scan", 1): FinishedRecovery("failed", "no live target")}
    trace = Trace(h.controller, monkeypatch)
    h.step()
    assert max(trace.depths) == 1
    assert trace.handled()[1] == (InputRestored("scan", 0), RecoveryFailed("scan", 1, "no live target"))
    assert isinstance(h.controller.result, FailStage)
    assert "could not re-produce lost partition scan[1]: no live target" in h.controller.result.reason
    assert [(e["stage"], e["subtask"], e["attempt"]) for e in h.events("input_restored")] == [("scan", 0, 3)]
    assert not h.controller.recoveries


def test_outcomes_fed_back_without_end_stop_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, parallelism=1)
    monkeypatch.setattr(controller_module, "MAX_ROUNDS", 50)
    # A scheduler and a controller that answer each other forever: every action's outcome asks for another.
    monkeypatch.setattr(h.controller.scheduler, "handle", lambda *stimuli: [BlockNode("n1", 0.0, "slow")])
    monkeypatch.setattr(h.controller, "_carry_out", lambda action, now: [Tick(now)])
    with pytest.raises(RuntimeError, match="after 50 rounds"):
        h.step()


def test_a_tick_polls_only_what_changed(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=200, check_interval=1.0)
    h.step()
    h.step()  # 200 attempts running
    polled: list[tuple[int, int]] = []
    poll = h.backend.poll
    h.backend.poll = lambda s, a, now=None: polled.append((s, a)) or poll(s, a, now)  # type: ignore[method-assign]
    h.backend.finish(7, 0)
    h.step()
    # The noticed attempt, plus the rotating safety share: 200 live x 1 s / 300 s -> 1.
    assert (7, 0) in polled and len(polled) <= 1 + 4
    assert h.controller.scheduler.admitted == {7: 0}


def test_a_lost_notice_is_caught_by_the_rotating_full_poll(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=3, check_interval=20.0)  # 3 live x 20 s / 300 s -> 1 per tick
    h.step()
    h.step()
    h.backend.attempts[(1, 0)] = replace(h.backend.attempts[(1, 0)], state=S.FAILED, end_at=h.clock())
    for _ in range(4):  # no notice was written: within a full rotation the failure is seen
        h.step()
    assert h.controller.scheduler.attempts[1][0].state == S.FAILED


def test_early_wake_ups_do_not_multiply_the_rotating_polls(tmp_path: Path) -> None:
    targets = [{"name": "local-a", "slots": 600}, {"name": "local-b", "slots": 600}]
    h = harness(tmp_path, parallelism=1200, check_interval=1.0, targets=targets)
    h.step()
    h.step()
    assert len(h.controller.scheduler.live_attempts()) == 1200
    reads: list[tuple[int, int]] = []
    poll, probe = h.backend.poll, h.backend.probe
    h.backend.poll = lambda s, a, now=None: reads.append((s, a)) or poll(s, a, now)  # type: ignore[method-assign]
    h.backend.probe = lambda s, a, now: reads.append((s, a)) or probe(s, a, now)  # type: ignore[method-assign]
    h.step(1.0)
    one_interval = len(reads)  # 1200 x 1 s / 300 s full polls + 1200 x 1 s / 5 s probes
    reads.clear()
    for _ in range(10):  # the same second as ten steps woken early by change notices
        h.step(0.1)
    assert one_interval >= 240 and len(reads) <= one_interval * 1.1 + 10


def test_a_change_notice_wakes_the_wait_before_the_check_interval(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, check_interval=3600.0)
    h.step()  # launches attempt 0, whose launch leaves a notice
    h.step()  # acknowledges it
    assert not h.controller.changed()
    h.backend.finish(0, 0)  # the attempt ends and leaves a notice
    assert h.controller.changed()
    wait_for_next_step([h.controller])  # returns now, not after an hour
    h.step()
    assert h.controller.done and h.controller.succeeded


def test_a_waiting_controller_looks_for_notices_as_often_as_its_store_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from airflow_provider_speculative.store import roots
    from airflow_provider_speculative.store.backend import PosixBackend, S3Backend
    from tests.unit.store.memory import MemoryBackend

    assert harness(tmp_path, parallelism=1).controller.notice_poll == 0.1 == PosixBackend(tmp_path).notice_poll_seconds
    assert S3Backend("s3://lake/x", client=object()).notice_poll_seconds == 1.0  # type: ignore[arg-type]
    roots.forget_stores()
    roots.install_store(MemoryBackend("s3://lake/x"))  # the double stands for S3: each look a listing
    try:
        assert StageController(stage_plan("s3://lake/x"), backends={}, observer=object()).notice_poll == 1.0  # type: ignore[arg-type]
    finally:
        roots.forget_stores()
    # The wait sleeps the shortest poll of the controllers it waits for, until the check interval is over.
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(controller_module, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    waiting = [SimpleNamespace(config=SimpleNamespace(check_interval=3.0), wake_after=lambda: 0.0,
                               changed=lambda: False, notice_poll=poll) for poll in (1.0, 2.0)]
    wait_for_next_step(waiting)  # type: ignore[arg-type]
    assert slept == [0.0, 1.0, 1.0, 1.0]


def test_a_notice_one_controller_read_is_still_there_for_the_other_during_a_hand_over(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, check_interval=1.0)
    # The successor in another triggerer watches the same stage while the old one still steps.
    other = StageController.open(h.controller.plan, clock=h.clock, backends={"local-a": h.backend},
                                 observer=h.backend)
    h.step()  # launches attempt 0, whose launch leaves a notice
    h.step()  # reads the notice and polls the attempt
    assert not h.controller.changed()
    assert other.changed()  # not deleted from under the other controller, which has not read it yet
    assert other.notices.take() == {(0, 0)}
    h.step(changes.GRACE_SECONDS)  # a grace period after reading it, the first controller removes it
    assert changes.pending(h.layout.dir) == (set(), [])
    assert not other.changed() and other.notices.take() == set()


def test_the_wake_up_after_a_step_follows_its_cpu_time(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, check_interval=1.0)
    h.controller._step_cpu = 0.001
    assert h.controller.wake_after() == controller_module.WAKE_FLOOR
    h.controller._step_cpu = 0.03  # a large stage's tick: the next one no sooner than 10x its CPU time
    assert h.controller.wake_after() == pytest.approx(0.3)
    h.controller._step_cpu = 5.0
    assert h.controller.wake_after() == 1.0  # never later than check_interval


def test_only_a_controller_that_steps_with_fork_server_backends_starts_the_fork_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[bool] = []
    monkeypatch.setattr(controller_module, "prestart_fork_server", lambda: started.append(True))
    h = harness(tmp_path, parallelism=1)
    h.step()
    assert started == []  # backends that do not launch through it (this fake) never start it
    h = harness(tmp_path / "second", parallelism=1)
    h.backend.fork_server = True  # type: ignore[attr-defined]
    h.controller.kill_all("built only to stop attempts, as the operator does on a worker")
    assert started == []
    h.step()
    h.step()
    assert started == [True]  # once, at the first step


def _stage_with_attempts(layout: StageLayout) -> None:
    """Plan, journal, two subtasks' attempts with data, an admission, a summary and a commit."""
    atomic_write_json(layout.plan, {"dag_id": layout.dag_id, "run_id": layout.run_id, "stage": layout.stage})
    atomic_write_json(layout.journal, {"event": "plan_decided"})
    for subtask in (0, 1):
        assert create_exclusive_json(layout.claim(subtask, 0), {"target": "local-a"})
        (layout.data(subtask, 0)).mkdir(parents=True)
        (layout.data(subtask, 0) / "part-0.parquet").write_bytes(b"rows")
    assert create_exclusive_json(layout.admitted(0), {"attempt": 0})
    atomic_write_json(layout.summary, {"stage": layout.stage})
    atomic_write_json(layout.committed, {"stage": layout.stage, "subtasks": {}})


def test_wipe_removes_every_attempt_admission_summary_and_commit_of_an_owned_run(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    layout.claim_run()
    _stage_with_attempts(layout)

    controller_module.wipe_stage_attempts(layout)

    assert sorted(p.name for p in layout.dir.iterdir()) == ["journal.jsonl", "plan.json"]
    assert layout.owns_run()
    controller_module.wipe_stage_attempts(layout)  # nothing left to remove: fine
    controller_module.wipe_stage_attempts(StageLayout(layout.root, "d", "r", "never-planned"))


def test_wipe_of_a_run_this_store_does_not_own_refuses_and_keeps_everything(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    _stage_with_attempts(layout)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    with pytest.raises(RunNotOwnedError, match=r"DAG 'd' run 'r' stage 'scan'"):
        controller_module.wipe_stage_attempts(layout)

    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_discard_in_a_run_this_store_does_not_own_keeps_the_output_and_the_controller_goes_on(
        tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2, faults=FORCED)
    (h.layout.run_dir / "_owner.json").unlink()  # as a run an older version planned
    h.step()
    h.step()
    assert create_exclusive_json(h.layout.admitted(0), {"attempt": 1, "at": h.clock()})
    h.backend.finish(0, 0)
    h.step()

    assert [e["attempt"] for e in h.events("discard")] == [0]
    assert h.layout.manifest(0, 0).exists()  # kept: the run's prefix is not provably this store's


def another_controller_admits_first(h: Harness, monkeypatch: pytest.MonkeyPatch, winner: int) -> None:
    """The race of a hand-over: another controller finishes and admits ``winner`` just before this one admits."""
    create = StageLayout.create_json

    def racing(layout: StageLayout, path: Path, record: dict[str, Any]) -> bool:
        if path == layout.admitted(0) and not path.exists():
            h.backend.finish(0, winner)
            assert create(layout, path, {"attempt": winner, "at": h.clock()})
        return create(layout, path, record)

    monkeypatch.setattr(StageLayout, "create_json", racing)


def test_a_lost_admission_never_cancels_the_other_controllers_winner(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2, faults=FORCED)
    h.step()
    h.step()
    another_controller_admits_first(h, monkeypatch, winner=1)
    h.backend.finish(0, 0)
    h.step()  # sees attempt 0 finish (attempt 1 still running, as last polled) and loses the admission
    assert h.events("admit_lost")[0]["winner"] == 1
    assert (0, 1) not in h.backend.cancelled and (0, 1) not in h.controller.reaping
    assert [e["attempt"] for e in h.events("cancel")] == []
    sched = h.controller.scheduler
    assert sched.admitted == {0: 1} and sched.attempts[0][1].state == S.RUNNING  # as last observed
    h.step()  # the winner's end is observed
    assert sched.attempts[0][1].state == S.FINISHED
    assert [e["attempt"] for e in h.events("discard")] == [0]
    assert not h.layout.manifest(0, 0).exists() and h.layout.manifest(0, 1).exists()
    assert h.controller.done and h.controller.event_payload()["admitted"] == {"0": 1}


def test_a_lost_admission_never_discards_the_other_controllers_winner(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=1, enabled=True, max_concurrent_executions=2, faults=FORCED)
    h.step()
    h.step()
    # Both attempts end before this controller polls; another controller saw only attempt 1 and admitted it.
    h.backend.finish(0, 0)
    h.clock.now += 0.5
    h.backend.finish(0, 1)
    assert create_exclusive_json(h.layout.admitted(0), {"attempt": 1, "at": h.clock()})
    h.step()  # admits attempt 0 (the earlier end), discards attempt 1 and completes in one batch; admission lost
    assert h.layout.manifest(0, 1).exists()  # the winner's output is what the stage commits
    payload = h.controller.event_payload()
    assert h.controller.done and payload["admitted"] == {"0": 1}
    # What finalize commits (control/commit.py) is there.
    assert admitted_results(h.layout, {0: 1})["subtasks"]["0"]["attempt"] == 1
    assert h.controller.scheduler.admitted == {0: 1}
    assert [e["attempt"] for e in h.events("discard")] == [0]
    assert [e["admitted"] for e in h.events("stage_complete")] == [{"0": 1}]


def test_a_slot_taken_between_observation_and_launch_is_a_lost_slot_retried_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, parallelism=1)
    other_stage = StageLayout(h.layout.root, "d", "r", "aggregate")
    slots = TargetSlots(h.layout.root, "local-a")
    observe = h.controller.watcher.observe

    def observe_then_lose_local_a(now: float) -> dict[str, Any]:
        views = observe(now)
        # Another stage of the run fills local-a after this controller saw its slots free.
        while slots.claim(4, holder_record(other_stage, slots.count(), 0, now)) is not None:
            pass
        return views

    monkeypatch.setattr(h.controller.watcher, "observe", observe_then_lose_local_a)
    trace = Trace(h.controller, monkeypatch)
    h.step()
    launch = next(i for i, (kind, action) in enumerate(trace.log)
                  if kind == "carry out" and isinstance(action, Launch))
    assert trace.log[launch][1].target == "local-a"
    assert trace.log[launch + 1] == ("handle", (SlotLost(0, 0, "local-a"),))
    assert max(trace.depths) == 1
    assert h.events("slot_lost") == [{"at": h.clock(), "event": "slot_lost", "subtask": 0, "attempt": 0,
                                      "target": "local-a"}]
    # Nothing started and nothing is held: the attempt is forgotten, its number free again.
    assert h.backend.launched == [] and not h.layout.exists(h.layout.claim(0, 0))
    assert h.controller.scheduler.attempts[0] == {} and h.controller.held == {}
    monkeypatch.setattr(h.controller.watcher, "observe", observe)
    h.step()
    assert [(s.subtask, s.attempt, s.target) for s in h.backend.launched] == [(0, 0, "local-b")]
    assert [(key, target) for key, (target, _, _) in h.controller.held.items()] == [((0, 0), "local-b")]
