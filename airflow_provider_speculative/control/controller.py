"""StageController: the I/O around the core scheduler (poll, act, journal). No Airflow import.

The trigger calls :meth:`StageController.step` every check interval. All state lives in the store,
so a controller rebuilt from the same plan (triggerer restart, HA double-run) reconnects to the
running attempts instead of launching them again.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import Backend, LaunchSpec, attempt_observer, plan_backends
from airflow_provider_speculative.control.recovery import PartitionRecovery, attempt_command
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.failover import files_in_range, input_readers
from airflow_provider_speculative.core.scheduler import (
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
    Invalidate,
    Launch,
    NodeBlocked,
    RecoverPartition,
    RecoveryFailed,
    Restored,
    StageScheduler,
    Tick,
)
from airflow_provider_speculative.core.states import Attempt, AttemptState, current_attempt
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json, read_json
from airflow_provider_speculative.store.journal import Journal
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import remove_attempt_output


class StageController:
    """Drive one stage run: restore from the store, then poll attempts, feed the core, carry out its actions."""

    def __init__(self, plan: dict[str, Any], clock: Callable[[], float] = time.time,
                 extra_env: dict[str, str] | None = None,
                 target_env: dict[str, dict[str, str]] | None = None) -> None:
        self.plan = plan
        # Secrets for the attempts (a sink's DSN, a Connect server's URL with its token): passed at
        # launch, never written to the store.
        self.extra_env = dict(extra_env or {})
        self.target_env = {name: dict(env) for name, env in (target_env or {}).items()}
        self.clock = clock
        self.layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
        self.config = SpeculativeConfig.from_json(plan["config"])
        self.journal = Journal(self.layout.journal, clock)
        # One backend per target (its kind was resolved from the target's connection at plan time);
        # the observer reads any attempt the same way (targets of an older plan, unknown ones).
        self.backends: dict[str, Backend] = plan_backends(plan, self.layout)
        self.observer = attempt_observer(self.layout)
        self.scheduler = StageScheduler(
            parallelism=plan["parallelism"], config=self.config,
            input_bytes={i: s["input_bytes"] for i, s in enumerate(plan["subtasks"]) if s.get("input_bytes")},
            speculation_blocker=plan.get("speculation_blocker"),
            reused=frozenset(plan.get("reused") or []),
            input_readers=input_readers(plan),
            upstreams={name: (info["parallelism"], info["deterministic"])
                       for name, info in (plan.get("upstream_info") or {}).items()})
        self.reaping: set[tuple[int, int]] = set()
        self.recoveries: dict[tuple[str, int], PartitionRecovery] = {}
        self.result: CompleteStage | FailStage | None = None
        self._restore()

    # -- restore ----------------------------------------------------------------------------

    def _restore(self) -> None:
        now = self.clock()
        attempts: list[Attempt] = []
        admitted: dict[int, int] = {}
        for subtask in range(self.plan["parallelism"]):
            for number in self.layout.attempt_numbers(subtask):
                if self.layout.claim(subtask, number).exists():
                    attempt = self.observer.poll(subtask, number, now)
                    attempts.append(attempt)
                    if read_json(self.layout.attempt_dir(subtask, number) / "cancel.json") is not None and attempt.live:
                        attempt.state = AttemptState.CANCELING
                        self.reaping.add((subtask, number))
            marker = read_json(self.layout.admitted(subtask))
            if marker is not None:
                admitted[subtask] = marker["attempt"]
        self.scheduler.handle(Restored(tuple(attempts), admitted, self._shared_blocks()))
        if attempts:
            self.journal("restored", attempts=len(attempts), admitted=admitted)

    def _shared_blocks(self) -> dict[str, float]:
        blocked = (read_json(self.layout.blocklist) or {}).get("until", {})
        return {node: float(until) for node, until in blocked.items()}

    # -- loop -------------------------------------------------------------------------------

    def step(self) -> list[Action]:
        """One check: poll non-terminal attempts, run the core, carry out its actions."""
        if self.result is not None:
            # Decided, but a cancelled loser may still be dying: keep reaping it, or `done` never turns true.
            self._reap(self.clock())
            return []
        now = self.clock()
        # Blocks other stages of the run added, then what changed, then decide.
        stimuli: list[Any] = [NodeBlocked(node, until) for node, until in self._shared_blocks().items()]
        stimuli += [AttemptObserved(self._backend(a.target).poll(a.subtask, a.number, now))
                    for a in self.scheduler.all_attempts() if a.state not in (
                        AttemptState.FINISHED, AttemptState.FAILED, AttemptState.CANCELED)]
        actions = self._carry_out_all(self.scheduler.handle(*stimuli, Tick(now)), now)
        actions += self._carry_out_all(self._step_recoveries(), now)
        self._reap(now)
        self._persist_blocks()
        self._write_summary(now)
        return actions

    def _backend(self, target: str) -> Backend:
        return self.backends.get(target) or self.observer

    def _carry_out_all(self, actions: list[Action], now: float) -> list[Action]:
        """Carry out actions, and the follow-up actions that carrying them out produced, in order."""
        done: list[Action] = []
        pending = list(actions)
        while pending:
            action = pending.pop(0)
            done.append(action)
            pending[:0] = self._carry_out(action, now)
        return done

    def _persist_blocks(self) -> None:
        # Blocks are extended while a slow attempt keeps running; a restarted controller and the
        # next stage of the run must see the latest deadline, not the first one.
        shared = self._shared_blocks()
        merged = dict(shared)
        for node, until in self.scheduler.blocklist.until.items():
            merged[node] = max(until, merged.get(node, until))
        if merged != shared:
            atomic_write_json(self.layout.blocklist, {"until": merged})

    @property
    def done(self) -> bool:
        """True once the stage completed or failed and no cancelled attempt is still alive."""
        return self.result is not None and not self.reaping and not self.recoveries

    def _step_recoveries(self) -> list[Action]:
        actions: list[Action] = []
        for key, recovery in list(self.recoveries.items()):
            if self.result is not None:
                del self.recoveries[key]
                continue
            outcome, reason = recovery.step()
            if outcome == "done":
                del self.recoveries[key]
                self._use_recovered(key[0], key[1], recovery.committed_part())
                actions += self.scheduler.handle(InputRestored(*key))
            elif outcome == "failed":
                del self.recoveries[key]
                actions += self.scheduler.handle(RecoveryFailed(key[0], key[1], reason or "unknown"))
        return actions

    def _use_recovered(self, stage: str, producer: int, part: dict[str, Any]) -> None:
        """Point this stage's plan at the re-produced partition (new attempts read the new plan)."""
        info = self.plan["upstream_info"][stage]
        for consumer, spec in enumerate(self.plan["subtasks"]):
            for entry in spec["inputs"].values():
                if entry["kind"] != "exchange" or entry["upstream"] != stage:
                    continue
                for old in entry["parts"]:
                    if old["subtask"] != producer:
                        continue
                    files = files_in_range(part["files"], entry["distribution"], consumer,
                                           self.plan["parallelism"], info["max_parallelism"])
                    spec["input_bytes"] += sum(f["size"] for f in files) - sum(f["size"] for f in old["files"])
                    old.update(attempt=part["attempt"], data=part["data"], files=files)
        atomic_write_json(self.layout.plan, self.plan)
        self.journal("input_restored", stage=stage, subtask=producer, attempt=part["attempt"])

    def _carry_out(self, action: Action, now: float) -> list[Action]:
        """Do what one action says; return the actions its outcome led to (e.g. a lost admission)."""
        if isinstance(action, Launch):
            return self._launch(action, now)
        if isinstance(action, Admit):
            return self._admit(action)
        if isinstance(action, RecoverPartition):
            return self._recover(action)
        if isinstance(action, Cancel):
            self._backend(self._target_of(action.subtask, action.attempt)).cancel(
                action.subtask, action.attempt, action.reason)
            self.reaping.add((action.subtask, action.attempt))
            self.journal("cancel", subtask=action.subtask, attempt=action.attempt, reason=action.reason)
        elif isinstance(action, Discard):
            remove_attempt_output(self.layout, action.subtask, action.attempt)
            self.journal("discard", subtask=action.subtask, attempt=action.attempt, reason=action.reason)
        elif isinstance(action, BlockNode):
            self.journal("block_node", node=action.node, until=action.until, reason=action.reason)
        elif isinstance(action, Invalidate):
            self.observer.invalidate(action.subtask, action.attempt, action.reason)
            remove_attempt_output(self.layout, action.subtask, action.attempt)
            self.journal("invalidate", subtask=action.subtask, attempt=action.attempt, reason=action.reason)
        elif isinstance(action, FailStage):
            self.result = action
            self.journal("stage_failed", reason=action.reason, causes=list(action.causes),
                         failed_attempts=action.failed_attempts, counts_by_cause=dict(action.counts_by_cause))
        elif isinstance(action, CompleteStage):
            self.result = action
            self.journal("stage_complete", admitted=action.admitted)
        else:
            raise TypeError(f"StageController: no handler for action {action!r}")
        return []

    def _target_of(self, subtask: int, attempt: int) -> str:
        known = self.scheduler.attempts.get(subtask, {}).get(attempt)
        return known.target if known is not None else "?"

    def _recover(self, action: RecoverPartition) -> list[Action]:
        self.journal("recover_partition", stage=action.stage, subtask=action.subtask, reason=action.reason)
        recovery = PartitionRecovery(
            self.layout.root, self.plan["dag_id"], self.plan["run_id"], action.stage, action.subtask,
            env=self.extra_env, target_env=self.target_env,
            blocked=lambda node: self.scheduler.blocklist.is_blocked(node, self.clock()),
            clock=self.clock)
        if action.lost_attempt is not None and recovery.lost_attempt not in (None, action.lost_attempt):
            # Re-produced already (e.g. before a controller restart): just read the new result.
            self._use_recovered(action.stage, action.subtask, recovery.committed_part())
            return self.scheduler.handle(InputRestored(action.stage, action.subtask))
        self.recoveries[(action.stage, action.subtask)] = recovery
        return []

    def _launch(self, action: Launch, now: float) -> list[Action]:
        target = next(t for t in self.config.targets if t.name == action.target)
        backend = self._backend(target.name)
        record = {"target": target.name, "node": target.node_label, "speculative": action.speculative,
                  "created_at": now, "reason": action.reason, "kind": backend.kind}
        if not backend.claim(action.subtask, action.attempt, record):
            # Another controller instance owns this number: adopt what it launched.
            self.journal("claim_lost", subtask=action.subtask, attempt=action.attempt)
            return self.scheduler.handle(ClaimLost(self.observer.poll(action.subtask, action.attempt, now)))
        command = attempt_command(self.plan, self.layout, action.subtask, action.attempt, target.name)
        env = {**(self.plan["targets"][target.name].get("env") or {}), **self.target_env.get(target.name, {}),
               **self.extra_env}
        try:
            # YARN and Kubernetes submissions are kept off the nodes blocked now (backends/spark_submit.py).
            backend.launch(LaunchSpec(action.subtask, action.attempt, target.name, target.node_label,
                                      action.speculative, command, env,
                                      blocked_nodes=tuple(sorted(self.scheduler.blocklist.active(now)))))
        except Exception as exc:
            atomic_write_json(self.layout.status(action.subtask, action.attempt),
                              {"state": "FAILED", "end_at": self.clock(), "exit_code": None,
                               "cause": f"launch failed: {exc}"})
        self.journal("launch", subtask=action.subtask, attempt=action.attempt, target=target.name,
                     speculative=action.speculative, reason=action.reason)
        return []

    def _admit(self, action: Admit) -> list[Action]:
        record = {"attempt": action.attempt, "at": self.clock()}
        if not create_exclusive_json(self.layout.admitted(action.subtask), record):
            winner = read_json(self.layout.admitted(action.subtask))["attempt"]
            if winner != action.attempt:
                # A concurrent controller admitted another attempt first: its choice stands.
                self.journal("admit_lost", subtask=action.subtask, attempt=action.attempt, winner=winner)
                return self.scheduler.handle(AdmissionLost(action.subtask, action.attempt, winner))
        self.journal("admit", subtask=action.subtask, attempt=action.attempt,
                     speculative=self.scheduler.attempts[action.subtask][action.attempt].speculative)
        return []

    def _reap(self, now: float) -> None:
        for subtask, number in sorted(self.reaping):
            if self._backend(self._target_of(subtask, number)).reap(subtask, number, now):
                self.reaping.discard((subtask, number))
                if self.scheduler.admitted.get(subtask) != number:
                    remove_attempt_output(self.layout, subtask, number)

    def kill_all(self, reason: str) -> None:
        """Cancel every live attempt and wait (bounded) until their process groups are gone."""
        for attempt in self.scheduler.all_attempts():
            backend = self._backend(attempt.target)
            if backend.poll(attempt.subtask, attempt.number).live:
                backend.cancel(attempt.subtask, attempt.number, reason)
                self.reaping.add((attempt.subtask, attempt.number))
        deadline = self.clock() + max(b.kill_grace for b in [self.observer, *self.backends.values()]) + 10
        while self.reaping and self.clock() < deadline:
            self._reap(self.clock())
            time.sleep(0.2)
        self.journal("killed_all", reason=reason, left=sorted(self.reaping))

    # -- records ----------------------------------------------------------------------------

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """Metrics and speculation status of the stage (also written to summary.json)."""
        now = self.clock() if now is None else now
        sched = self.scheduler
        baseline = sched.baseline
        return {
            "stage": self.plan["stage"], "parallelism": self.plan["parallelism"],
            "speculation": sched.speculation_status,
            "numSlowExecutionVertices": len(sched.slow_subtasks),
            "peakSlowExecutionVertices": sched.peak_slow,
            "numEffectiveSpeculativeExecutions": sched.effective_speculative_executions(),
            "baseline_seconds": baseline.seconds if baseline else None,
            "baseline_seconds_per_byte": baseline.per_byte if baseline else None,
            "blocked_nodes": sched.blocklist.active(now),
            "admitted": {str(k): v for k, v in sorted(sched.admitted.items())},
            "reused": sorted(sched.reused),
            "attempts": len(sched.all_attempts()),
            "speculative_attempts": sum(a.speculative for a in sched.all_attempts()),
            "attempt_seconds": round(sum(_attempt_seconds(a, now) for a in sched.all_attempts()), 3),
            "current": {str(s): (c.number if (c := current_attempt(list(sched.attempts[s].values()))) else None)
                        for s in range(self.plan["parallelism"])},
            "updated_at": now,
        }

    def _write_summary(self, now: float) -> None:
        atomic_write_json(self.layout.summary, self.summary(now))

    def event_payload(self) -> dict[str, Any]:
        """The one trigger event: everything finalize needs (dag.test drops defer kwargs on resume)."""
        summary = self.summary()
        if isinstance(self.result, FailStage):
            return {"status": "failed", "plan_path": str(self.layout.plan), "reason": self.result.reason,
                    "causes": list(self.result.causes), "failed_attempts": self.result.failed_attempts,
                    "counts_by_cause": dict(self.result.counts_by_cause), "summary": summary}
        admitted = self.result.admitted if isinstance(self.result, CompleteStage) else {}
        return {"status": "success", "plan_path": str(self.layout.plan),
                "admitted": {str(k): v for k, v in admitted.items()}, "summary": summary}


def _attempt_seconds(attempt: Attempt, now: float) -> float:
    if attempt.deploying_at is None:
        return 0.0
    end = attempt.end_at if attempt.end_at is not None else now
    return max(0.0, end - attempt.deploying_at)


def wipe_stage_attempts(layout: StageLayout) -> None:
    """Remove every attempt and admission of a stage run (its plan changed or a full rerun was forced)."""
    if layout.dir.is_dir():
        for entry in layout.dir.iterdir():
            if entry.name.startswith("subtask=") and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
        for name in ("summary.json", "committed.json"):
            (layout.dir / name).unlink(missing_ok=True)
