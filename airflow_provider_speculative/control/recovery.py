"""Re-produce one lost upstream partition for a consumer stage (FLIP-1 backtracking), through the store."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.backends.registry import attempt_observer, plan_backends
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.contract import attempt_env
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.plan import StagePlan, load_plan
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.exceptions import PartitionError
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.journal import Journal
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import verify_files_in
from airflow_provider_speculative.store.results import admitted_results, read_committed, write_committed


def attempt_command(plan: StagePlan, layout: StageLayout, subtask: int, attempt: int, target: str) -> list[str]:
    """The command line of one attempt: the target's launch command plus the attempt's arguments.

    ``--plan`` is the plan's path on a POSIX store and its URL on a store without paths (never a credential);
    the runtime reads either (``runtime/context.py``, ``read_attempt_plan``).
    """
    return [*plan["targets"][target]["command"], "--plan", str(layout.plan), "--subtask", str(subtask),
            "--attempt", str(attempt), "--target", target]


class PartitionRecovery:
    """Drive new attempts of ``stage[subtask]`` until one finishes, then re-admit and re-commit it.

    Re-entrant: a restarted controller adopts a recovery attempt that is already running or finished.
    """

    def __init__(self, root: Path | StoreBackend, dag_id: str, run_id: str, stage: str, subtask: int, *,
                 env: dict[str, str], blocked: Callable[[str], bool], clock: Callable[[], float] = time.time,
                 target_env: dict[str, dict[str, str]] | None = None) -> None:
        self.layout = StageLayout.at(root, dag_id, run_id, stage)
        raw = self.layout.read_json(self.layout.plan)
        if raw is None:
            raise FileNotFoundError(f"cannot re-produce {stage}[{subtask}]: its plan {self.layout.plan} is missing")
        self.plan = load_plan(raw, f"cannot re-produce {stage}[{subtask}]: plan {self.layout.plan}")
        self.stage, self.subtask = stage, subtask
        self.config = SpeculativeConfig.from_json(self.plan["config"])
        self.target_env = target_env or {}
        self.backends = plan_backends(self.plan, self.layout, self.target_env)
        self.backend = attempt_observer(self.layout)
        self.env, self.blocked, self.clock = env, blocked, clock
        marker = self.layout.read_json(self.layout.admitted(subtask)) or {}
        self.lost_attempt = marker.get("attempt")
        self.attempt: int | None = self._adoptable()
        self.failures = 0

    def _adoptable(self) -> int | None:
        for number in reversed(self.layout.attempt_numbers(self.subtask)):
            if self.lost_attempt is not None and number <= self.lost_attempt:
                break
            state = self.backend.poll(self.subtask, number).state
            if state == AttemptState.FINISHED or state in (AttemptState.CREATED, AttemptState.DEPLOYING,
                                                          AttemptState.RUNNING):
                return number
        return None

    def _target(self) -> Target:
        for target in self.config.targets:
            if not self.blocked(target.node_label):
                return target
        return self.config.targets[0]

    def _launch(self) -> None:
        number = max(self.layout.attempt_numbers(self.subtask), default=-1) + 1
        target = self._target()
        record = {"target": target.name, "node": target.node_label, "speculative": False,
                  "created_at": self.clock(), "reason": "failover: re-produce a lost partition"}
        if not self.backend.claim(self.subtask, number, record):
            self.attempt = number  # another controller launched it: adopt
            return
        env = attempt_env(self.plan["targets"][target.name].get("env") or {}, self.target_env.get(target.name, {}),
                          self.env)
        self.backends[target.name].launch(LaunchSpec(self.subtask, number, target.name, target.node_label, False,
                                       attempt_command(self.plan, self.layout, self.subtask, number, target.name),
                                       env))
        self.attempt = number
        self._journal(Event.RECOVERY_LAUNCH, attempt=number, target=target.name)

    def step(self) -> tuple[str, str | None]:
        """Advance; return ("running", None), ("done", None) or ("failed", reason)."""
        if self.attempt is None:
            self._launch()
            return "running", None
        status = self.backend.poll(self.subtask, self.attempt)
        if status.state == AttemptState.FINISHED:
            try:
                self._commit(self.attempt)
            except PartitionError as exc:
                return "failed", str(exc)
            return "done", None
        if status.state in (AttemptState.FAILED, AttemptState.CANCELED):
            self.failures += 1
            self._journal(Event.RECOVERY_FAILED, attempt=self.attempt, cause=status.cause)
            if self.failures > self.config.max_failures_per_subtask:
                return "failed", f"{self.failures} recovery attempts failed; last: {status.cause}"
            self.attempt = None
        return "running", None

    def _commit(self, number: int) -> None:
        manifest = self.layout.read_json(self.layout.manifest(self.subtask, number))
        if manifest is None:
            raise PartitionError(f"recovery attempt {number} of {self.stage}[{self.subtask}] has no manifest")
        verify_files_in(self.layout.store, self.layout.name(self.layout.data(self.subtask, number)), manifest["files"],
                        stage=self.stage, subtask=self.subtask, attempt=number)
        self.layout.replace_json(self.layout.admitted(self.subtask), {"attempt": number, "at": self.clock(),
                                                                     "replaces": self.lost_attempt})
        record = read_committed(self.layout)
        record["subtasks"][str(self.subtask)] = admitted_results(self.layout, {self.subtask: number})[
            "subtasks"][str(self.subtask)]
        record.setdefault("recovered", []).append(
            {"subtask": self.subtask, "attempt": number, "replaces": self.lost_attempt, "at": self.clock()})
        write_committed(self.layout, record)
        self._journal(Event.RECOVERED, attempt=number, replaces=self.lost_attempt)

    def committed_part(self) -> dict[str, Any]:
        """The re-committed result of the subtask (attempt, data dir, files)."""
        part: dict[str, Any] = read_committed(self.layout)["subtasks"][str(self.subtask)]
        return part

    def _journal(self, event: Event, **fields: Any) -> None:
        Journal.of_stage(self.layout, self.clock, subtask=self.subtask)(event, **fields)
