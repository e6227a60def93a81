"""Hybrid inputs end to end below Spark: the consumer's controller follows the producer's store, and an
attempt reads only admitted producer attempts (a producer's loser never feeds anyone)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.control.readmodel import stage_report
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.runtime.context import StageContext
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.files import atomic_write_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import PartitionError, build_manifest, write_manifest
from airflow_provider_speculative.store.task_state import record_task_state
from tests.factories import Clock, stage_plan, write_plan
from tests.unit.control.test_controller import FakeBackend

S = AttemptState


def consumer_plan(root: Path, parallelism: int = 3, distribution: str = "pointwise") -> dict[str, Any]:
    ranges = [[i, i + 1] for i in range(parallelism)] if distribution == "pointwise" else [[0, parallelism]] * 2
    return stage_plan(
        root, stage="enrich", parallelism=len(ranges), pipeline="p",
        config={"targets": [{"name": "local-a", "slots": 4}], "hybrid_input_timeout": 30},
        inputs={"rows": {"kind": "exchange", "upstream": "scan", "distribution": distribution, "mode": "hybrid",
                         "producer_parallelism": parallelism, "max_parallelism": 8, "upstream_fingerprint": "fp",
                         "schema": None}},
        upstream_info={"scan": {"parallelism": parallelism, "deterministic": True}},
        subtasks=[{"inputs": {"rows": {"producers": r, "subpartitions": None}}, "input_bytes": 0} for r in ranges],
        output={"key": [], "max_parallelism": 8, "sink": None})


class Producer:
    """The producer stage's store records, written as its operator and controller write them."""

    def __init__(self, root: Path) -> None:
        self.layout = StageLayout(root, "d", "r", "scan")
        atomic_write_json(self.layout.plan, {"stage": "scan", "parallelism": 3, "fingerprint": "fp"})
        journal.record(self.layout.journal, "plan_decided", parallelism=3)

    def finish(self, subtask: int, attempt: int, admit: bool = True) -> None:
        data = self.layout.data(subtask, attempt)
        data.mkdir(parents=True, exist_ok=True)
        (data / "part-0.parquet").write_bytes(f"rows of {subtask}/{attempt}".encode())
        write_manifest(self.layout.manifest(subtask, attempt), build_manifest(data, schema=None))
        if admit:
            atomic_write_json(self.layout.admitted(subtask), {"attempt": attempt})
            journal.record(self.layout.journal, "admit", subtask=subtask, attempt=attempt)

    def withdraw(self, subtask: int, attempt: int) -> None:
        self.layout.admitted(subtask).unlink()
        journal.record(self.layout.journal, "invalidate", subtask=subtask, attempt=attempt, reason="lost")


def controller(root: Path, clock: Clock, **kw: Any) -> tuple[StageController, FakeBackend]:
    plan = consumer_plan(root, **kw)
    layout = write_plan(plan)
    backend = FakeBackend(layout, clock)
    return StageController.open(plan, clock=clock, backends={"local-a": backend}, observer=backend), backend


def test_consumers_launch_as_producers_are_admitted_and_a_withdrawal_restarts_only_its_reader(tmp_path: Path) -> None:
    root, clock = tmp_path / "store", Clock()
    producer = Producer(root)
    ctrl, backend = controller(root, clock)
    ctrl.step()
    assert backend.launched == []
    assert ctrl.summary()["input_waits"]["0"] == "waiting for input 'rows': producer partitions 0/1 admitted (scan)"
    # What `airflow speculative status` and the stage view show.
    report = stage_report(ctrl.layout, ctrl.plan)
    assert report["input_waits"] == [
        "hybrid input from scan: producer partitions 0/3 admitted",
        "3 subtasks waiting for producer partitions; subtask 0: waiting for input 'rows': producer partitions 0/1 "
        "admitted (scan)"]
    assert report["subtasks"][2]["waiting_for"].endswith("producer partitions 0/1 admitted (scan)")
    producer.finish(1, 0)
    producer.finish(0, 0, admit=False)  # finished but lost the race: never read
    producer.finish(0, 1)
    clock.now += 1
    ctrl.step()
    assert sorted((s.subtask, s.attempt) for s in backend.launched) == [(0, 0), (1, 0)]
    assert ctrl.summary()["hybrid_inputs"] == {"scan": {"admitted": 2, "parallelism": 3, "committed": False}}
    # Both consumers recorded what they read; consumer 0 read producer 0's admitted attempt 1.
    for sub, read in ((0, {"0": 1}), (1, {"1": 0})):
        backend.attempts[(sub, 0)] = replace(backend.attempts[(sub, 0)], progress={"reads": {"scan": read}})
    producer.withdraw(0, 1)
    clock.now += 1
    ctrl.step()
    assert backend.cancelled == [(0, 0)]
    cancels = [e for e in read_jsonl(ctrl.layout.journal) if e["event"] == "cancel"]
    assert "scan[0] attempt 1" in cancels[0]["reason"]
    producer.finish(0, 2)
    clock.now += 1
    ctrl.step()
    assert (0, 1) in {(s.subtask, s.attempt) for s in backend.launched}


def test_a_failed_producer_fails_the_consumer_naming_pipeline_stage_and_input(tmp_path: Path) -> None:
    root, clock = tmp_path / "store", Clock()
    producer = Producer(root)
    ctrl, _ = controller(root, clock)
    ctrl.step()
    record_task_state(producer.layout, "failed", try_number=1, clear_number=0, reason="StageFailedError: boom")
    clock.now += 1
    ctrl.step()
    assert ctrl.result is not None and ctrl.done
    assert ctrl.result.reason == ("pipeline 'p', stage 'enrich', input 'rows': hybrid producer stage 'scan' failed "
                                  "(try 1): StageFailedError: boom")


def test_a_replanned_producer_fails_the_consumer_instead_of_mixing_outputs(tmp_path: Path) -> None:
    root, clock = tmp_path / "store", Clock()
    producer = Producer(root)
    ctrl, _ = controller(root, clock)
    ctrl.step()
    atomic_write_json(producer.layout.plan, {"stage": "scan", "parallelism": 3, "fingerprint": "other"})
    journal.record(producer.layout.journal, "plan_decided", parallelism=3)
    clock.now += 1
    ctrl.step()
    assert "was replanned" in ctrl.result.reason and "input 'rows'" in ctrl.result.reason


def test_an_attempt_reads_only_admitted_producer_attempts(tmp_path: Path) -> None:
    root = tmp_path / "store"
    producer = Producer(root)
    plan = consumer_plan(root, distribution="all_to_all")
    producer.finish(0, 0, admit=False)  # the loser finished first on disk, but was not admitted
    producer.finish(0, 1)
    producer.finish(1, 0)
    producer.finish(2, 0)
    ctx = StageContext(plan, 0, 0, "local-a")
    files = ctx.exchange_files("rows")
    assert [Path(f).parent.parent.name for f in files] == ["attempt=1", "attempt=0", "attempt=0"]
    assert "subtask=0/attempt=0" not in " ".join(files)
    assert read_json(ctx.layout.heartbeat(0, 0))["reads"] == {"scan": {"0": 1, "1": 0, "2": 0}}


def test_read_incremental_yields_each_admitted_producer_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    producer = Producer(root)
    plan = consumer_plan(root, distribution="all_to_all")
    producer.finish(2, 0)
    ctx = StageContext(plan, 1, 0, "local-a")
    batches: list[list[int]] = []
    seen: set[int] = set()
    while len(seen) < 3:
        batch = ctx.inputs.wait_admitted("rows", range(3), seen)
        batches.append(sorted(batch))
        seen |= set(batch)
        for p in (0, 1):
            if p not in seen and not producer.layout.admitted(p).exists():
                producer.finish(p, 0)
                break
    assert batches[0] == [2] and sorted(p for b in batches for p in b) == [0, 1, 2]


def _keyed_schema(column: str, spark_type: str) -> dict[str, Any]:
    return {"type": "struct", "fields": [{"name": column, "type": spark_type, "nullable": True, "metadata": {}}]}


def join_controller(root: Path, clock: Clock, hybrid_type: str) -> tuple[StageController, FakeBackend, Producer]:
    """A join of a blocking input 'dim' (committed, key id: long) and a hybrid input 'rows' from 'scan' (key k)."""
    producer = Producer(root)
    dim = StageLayout(root, "d", "r", "dimscan")
    atomic_write_json(dim.plan, {"stage": "dimscan", "parallelism": 1, "fingerprint": "dfp",
                                 "output": {"key": ["id"], "max_parallelism": 8}})
    atomic_write_json(dim.committed, {"fingerprint": "dfp", "subtasks": {"0": {
        "attempt": 0, "schema": _keyed_schema("id", "long"),
        "partitioning": {"key": ["id"], "max_parallelism": 8, "hash": "xxhash64-of-string-v1"}}}})
    plan = consumer_plan(root, distribution="all_to_all")
    plan["inputs"]["dim"] = {"kind": "exchange", "upstream": "dimscan", "distribution": "all_to_all",
                             "mode": "blocking", "producer_parallelism": 1, "max_parallelism": 8,
                             "upstream_fingerprint": "dfp", "schema": _keyed_schema("id", "long")}
    for sub in plan["subtasks"]:
        sub["inputs"]["dim"] = {"producers": [0, 1], "subpartitions": [0, 8]}
    layout = write_plan(plan)
    backend = FakeBackend(layout, clock)
    ctrl = StageController.open(plan, clock=clock, backends={"local-a": backend}, observer=backend)
    ctrl.step()
    # The hybrid producer's first subtask commits: its schema exists only now.
    data = producer.layout.data(0, 0)
    data.mkdir(parents=True)
    (data / "part-0.parquet").write_bytes(b"rows")
    manifest = build_manifest(data, schema=_keyed_schema("k", hybrid_type))
    manifest["partitioning"] = {"key": ["k"], "max_parallelism": 8, "hash": "xxhash64-of-string-v1",
                                "session_time_zone": "UTC"}
    write_manifest(producer.layout.manifest(0, 0), manifest)
    atomic_write_json(producer.layout.admitted(0), {"attempt": 0})
    journal.record(producer.layout.journal, "admit", subtask=0, attempt=0)
    clock.now += 1
    ctrl.step()
    return ctrl, backend, producer


def test_a_hybrid_producers_key_type_is_checked_at_its_first_commit_before_any_consumer_reads(
        tmp_path: Path) -> None:
    ctrl, backend, _ = join_controller(tmp_path / "store", Clock(), "string")
    assert ctrl.done and ctrl.result is not None and backend.launched == []
    assert ctrl.result.reason.startswith(
        "pipeline 'p', stage 'enrich': key column 1 differs in type between inputs: 'dim'.id is long, 'rows'.k is "
        "string"), ctrl.result.reason
    assert "input 'rows' is a hybrid exchange: producer 'scan' was checked when its first subtask was admitted" \
        in ctrl.result.reason


def test_a_hybrid_producer_whose_key_type_matches_is_read(tmp_path: Path) -> None:
    clock = Clock()
    ctrl, backend, producer = join_controller(tmp_path / "store", clock, "integer")
    assert not ctrl.done and ctrl.result is None
    producer.finish(1, 0)
    producer.finish(2, 0)
    clock.now += 1
    ctrl.step()
    assert not ctrl.done and sorted((s.subtask, s.attempt) for s in backend.launched) == [(0, 0), (1, 0)]


def test_the_producers_journal_is_tailed_by_cursor_torn_line_and_replacement_included(tmp_path: Path) -> None:
    from airflow_provider_speculative.control.hybrid import HybridInputWatcher, _Producer

    producer = Producer(tmp_path / "store")
    watched = _Producer(producer.layout, 3, "fp", ["rows"])
    assert HybridInputWatcher._read_journal(watched) == (set(), True, 1)
    assert HybridInputWatcher._read_journal(watched) == (set(), False, 0)
    journal.record(producer.layout.journal, "launch", subtask=1, attempt=0)
    with open(producer.layout.journal, "a") as handle:
        handle.write('{"event": "admit", "subtask": 1, "attempt": 0}')  # its newline not written yet
    assert HybridInputWatcher._read_journal(watched) == (set(), False, 1) and watched.launched == {1}
    with open(producer.layout.journal, "a") as handle:
        handle.write("\n")
    assert HybridInputWatcher._read_journal(watched) == ({1}, False, 1)
    # Another file in its place: every marker and the plan are checked again.
    replacement = tmp_path / "journal.jsonl"
    replacement.write_text('{"event": "admit", "subtask": 2, "attempt": 0}\n')
    replacement.replace(producer.layout.journal)
    assert HybridInputWatcher._read_journal(watched) == ({0, 1, 2}, True, 2)


def test_exchange_files_refuses_packed_files_with_rows_outside_the_range_naming_the_input(tmp_path: Path) -> None:
    root = tmp_path / "store"
    producer = Producer(root)
    for subtask in range(3):
        producer.finish(subtask, 0)
        # Written packed: the one file holds rows of subpartitions 0-5.
        manifest = read_json(producer.layout.manifest(subtask, 0))
        for entry in manifest["files"]:
            entry["subpartitions"] = {str(sp): 1 for sp in range(6)}
        write_manifest(producer.layout.manifest(subtask, 0), manifest)
    plan = consumer_plan(root, distribution="all_to_all")
    whole = StageContext(plan, 0, 0, "local-a").exchange_files("rows")
    assert len(whole) == 3  # the whole input: a packed file is read as it is
    plan["subtasks"][0]["inputs"]["rows"]["subpartitions"] = [0, 8]  # every row of the files is in the range
    plan["subtasks"][1]["inputs"]["rows"]["subpartitions"] = [0, 4]
    assert StageContext(plan, 0, 0, "local-a").exchange_files("rows") == whole
    with pytest.raises(PartitionError, match="pipeline 'p', stage 'enrich', input 'rows': upstream 'scan' wrote "
                                             "packed files"):
        StageContext(plan, 1, 0, "local-a").exchange_files("rows")
