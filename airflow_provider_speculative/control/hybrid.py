"""Watch the producer stages of hybrid inputs (FLIP-235) and turn what changed into scheduler stimuli.

No Airflow import. The producer's journal is the change notice: it is append-only, every admission,
invalidation, recovery, launch, replanning and failure of the producer is a record in it, so a poll
reads only the records since the last one (the store's journal cursor: O(changes)) and then the few
``admitted.json`` markers they name (the markers are the truth; the journal only says where to look).
The producer task's own state (``task.json``, written by its operator) says when it failed or was cleared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_speculative.core.copartition import KeyedParts, hybrid_key_refusal
from airflow_provider_speculative.core.events import ADMISSION_EVENTS, Event
from airflow_provider_speculative.core.hybrid import HybridEdge
from airflow_provider_speculative.core.messages import InputFailed, InputsAdmitted, InputWithdrawn
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.core.states import NO_COMMIT_TASK_STATES
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.layout import StageLayout, stage_key
from airflow_provider_speculative.store.task_state import task_state_path


@dataclass
class _Producer:
    """What the consumer knows of one producer stage."""

    layout: StageLayout
    parallelism: int
    fingerprint: str | None
    inputs: list[str]
    # The store's journal cursor after the last record read (None: nothing read yet).
    cursor: str | None = None
    admitted: dict[int, int] = field(default_factory=dict)
    launched: set[int] = field(default_factory=set)
    committed: bool = False
    last_change: float = 0.0
    reported_waiting: int = -1
    reported_committed: bool = False
    keys_checked: bool = False


class HybridInputWatcher:
    """Poll the producers of one consumer stage's hybrid inputs and return scheduler stimuli for what changed."""

    def __init__(self, plan: StagePlan, edges: dict[str, HybridEdge], timeout: float, now: float) -> None:
        self.where = f"pipeline {plan.get('pipeline')!r}, stage {plan['stage']!r}"
        self.timeout = timeout
        self.producers: dict[str, _Producer] = {}
        self.failed = False
        # The plan's store, opened once (store/roots.py): every producer's layout is over it.
        store = StageLayout.of_plan(plan).store
        for name, edge in edges.items():
            entry = plan["inputs"][name]
            known = self.producers.get(edge.upstream)
            if known is not None:
                known.inputs.append(name)
                continue
            self.producers[edge.upstream] = _Producer(
                StageLayout.of_plan(plan, edge.upstream, root=store), edge.producer_parallelism,
                entry.get("upstream_fingerprint"), [name], last_change=now)
        self._first = True
        self._store = store
        self._dag_run = (plan["dag_id"], plan["run_id"])
        self._prefix = stage_key(plan, "")
        # all_to_all inputs: their key types are checked again when a hybrid producer's first subtask is admitted.
        self._keyed = {name: (entry["upstream"], entry.get("mode")) for name, entry in (plan["inputs"] or {}).items()
                       if entry.get("kind") == "exchange" and entry.get("distribution") == "all_to_all"}
        self._known: dict[str, KeyedParts] | None = None

    def poll(self, now: float) -> list[Any]:
        """Stimuli for what changed at the producers since the last poll (everything, the first time)."""
        if self.failed:
            return []
        stimuli: list[Any] = []
        for stage, producer in self.producers.items():
            try:
                stimuli += self._poll_one(stage, producer, now)
            except StoreError as exc:
                stimuli.append(self._failure(stage, producer, f"its store records are unreadable: {exc}"))
            if stimuli and isinstance(stimuli[-1], InputFailed):
                self.failed = True
                return [stimuli[-1]]
        self._first = False
        return stimuli

    def _failure(self, stage: str, producer: _Producer, why: str) -> InputFailed:
        inputs = ", ".join(repr(i) for i in producer.inputs)
        return InputFailed(stage, f"{self.where}, input {inputs}: hybrid producer stage {stage!r} {why}")

    def _poll_one(self, stage: str, producer: _Producer, now: float) -> list[Any]:
        touched, replanned, events = self._read_journal(producer)
        if self._first:
            touched = set(range(producer.parallelism))
        if events:
            producer.last_change = now
        layout = producer.layout
        try:
            # The producer's controller rewrites its summary at least every few seconds while it runs.
            summary = layout.store.stat(layout.name(layout.summary))
        except StoreError:
            summary = None
        if summary is not None:
            producer.last_change = max(producer.last_change, summary.mtime)
        task = layout.read_json(task_state_path(layout)) or {}
        if task.get("state") in NO_COMMIT_TASK_STATES:
            return [self._failure(stage, producer, f"{task['state']} (try {task.get('try_number')}): "
                                                   f"{task.get('reason') or 'see its task log'}")]
        if replanned or self._first:
            plan = layout.read_json(layout.plan)
            if plan is None:
                return [self._failure(stage, producer, f"has no plan at {layout.plan}")]
            if producer.fingerprint is not None and plan.get("fingerprint") != producer.fingerprint:
                return [self._failure(stage, producer, (
                    f"was replanned (plan {plan.get('fingerprint')}, this stage was planned on "
                    f"{producer.fingerprint}); clear this stage too so it reads the new output"))]
        stimuli: list[Any] = []
        delta: dict[int, int] = {}
        for subtask in sorted(touched):
            if not 0 <= subtask < producer.parallelism:
                continue
            marker = layout.read_json(layout.admitted(subtask))
            current = int(marker["attempt"]) if marker is not None else None
            known = producer.admitted.get(subtask)
            if known is not None and known != current:
                del producer.admitted[subtask]
                stimuli.append(InputWithdrawn(stage, subtask, known,
                                              "its admission was withdrawn" if current is None
                                              else f"attempt {current} replaced it"))
            if current is not None and known != current:
                producer.admitted[subtask] = current
                delta[subtask] = current
        if events or self._first:
            # Re-checked on any producer change: a rerun withdraws a commit (rerun_invalidated).
            committed = layout.read_json(layout.committed)
            producer.committed = bool(committed and committed.get("fingerprint") == producer.fingerprint)
        if delta and not producer.keys_checked:
            refusal = self._check_keys(stage, producer, min(delta), delta[min(delta)])
            if refusal is not None:
                return [InputFailed(stage, refusal)]
        waiting = max(0, producer.parallelism - len(producer.launched | set(producer.admitted)))
        if delta or self._first or waiting != producer.reported_waiting \
                or producer.committed != producer.reported_committed:
            producer.reported_waiting, producer.reported_committed = waiting, producer.committed
            stimuli.append(InputsAdmitted(stage, delta, committed=producer.committed,
                                          waiting=0 if producer.committed else waiting))
        if not producer.committed and now - producer.last_change > self.timeout:
            return [self._failure(stage, producer, f"changed nothing for {now - producer.last_change:.0f}s "
                                                   "(hybrid_input_timeout); is its task still running?")]
        return stimuli

    def _check_keys(self, stage: str, producer: _Producer, subtask: int, attempt: int) -> str | None:
        """Refusal of the first admitted output of a hybrid producer next to the other keyed inputs, or None.

        Its schema exists only now (none was committed when this stage was planned); no consumer attempt has
        read it yet, since every consumer subtask waits for at least one admitted producer of each hybrid input.
        """
        producer.keys_checked = True
        names = [name for name in producer.inputs if name in self._keyed]
        if not names:
            return None
        if self._known is None:
            self._known = self._blocking_keyed()
        manifest = producer.layout.read_json(producer.layout.manifest(subtask, attempt)) or {}
        partitioning = manifest.get("partitioning")
        key = (partitioning or {}).get("key") or self._output_key(producer.layout)
        for name in names:
            self._known[name] = (list(key), [(manifest.get("schema"), partitioning)])
        return hybrid_key_refusal(self.where, names[0], stage, self._known)

    def _blocking_keyed(self) -> dict[str, KeyedParts]:
        """The blocking all_to_all inputs' committed (schema, partitioning) per producer subtask, with their keys."""
        known: dict[str, KeyedParts] = {}
        for name, (upstream, mode) in self._keyed.items():
            if mode == "hybrid":
                continue
            layout = StageLayout.over(self._store, *self._dag_run, self._prefix + upstream)
            committed = layout.read_json(layout.committed) or {}
            parts = [(p.get("schema"), p.get("partitioning")) for p in (committed.get("subtasks") or {}).values()]
            key = next(((r or {}).get("key") for _, r in parts if (r or {}).get("key")), None)
            known[name] = (list(key or self._output_key(layout)), parts)
        return known

    @staticmethod
    def _output_key(layout: StageLayout) -> list[str]:
        """The key a producer's plan hashes its output on."""
        plan = layout.read_json(layout.plan) or {}
        return list((plan.get("output") or {}).get("key") or [])

    @staticmethod
    def _read_journal(producer: _Producer) -> tuple[set[int], bool, int]:
        """New complete journal records since the last poll: subtasks touched, replanned?, record count."""
        layout = producer.layout
        chunk = layout.store.read_journal_from(layout.name(layout.journal), producer.cursor)
        producer.cursor = chunk.cursor
        touched: set[int] = set()
        # A replaced journal no longer holds the admissions and withdrawals read from the old one: every
        # marker is checked again, and the plan, as on the first poll.
        replanned = chunk.restarted
        if chunk.restarted:
            touched.update(range(producer.parallelism))
        for line in chunk.records:
            event = line.get("event")
            if event == Event.PLAN_DECIDED:
                replanned = True
            elif event == Event.LAUNCH and line.get("subtask") is not None:
                producer.launched.add(int(line["subtask"]))
            if event in ADMISSION_EVENTS and line.get("subtask") is not None:
                touched.add(int(line["subtask"]))
            elif event == Event.RERUN_INVALIDATED:
                touched.update(int(s) for s in line.get("subtasks") or ())
        return touched, replanned, len(chunk.records) + int(chunk.restarted)
