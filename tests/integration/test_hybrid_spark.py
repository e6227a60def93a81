"""Hybrid exchanges (FLIP-235) with real Spark on Spark Connect targets.

Both stages' controllers run at the same time, as their Airflow tasks do under a real scheduler (the
consumer's trigger rule is "always"); ``dag.test()`` runs one task at a time, so it cannot show two
stages overlapping. (a) a pointwise hybrid chain whose producer subtask 0 is slowed by fault injection
finishes its other chains first, asserted from the attempts' timestamps in the store, and an
``all_to_all`` hybrid consumer of the chain starts at half its producers admitted and reads the rest
incrementally (``ctx.read_incremental``); (b) a producer
partition invalidated while a consumer that read it is still running restarts exactly that consumer,
and only once the partition is re-produced; (c) the same chain as an Airflow DAG under ``dag.test()``
(trigger rule ``always``, the consumer waiting for its producer's plan in a trigger) succeeds; (d) a
hybrid producer whose key type cannot meet a blocking input's is refused when its first subtask is
admitted, before any consumer attempt.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative import Pipeline, all_to_all, parquet_source
from airflow_provider_speculative.control.controller import StageController, wait_for_next_step
from airflow_provider_speculative.control.rerun import invalidate_region, plan_rerun
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.devtools.runner import plan_connect_stage, run_stages, write_plan
from airflow_provider_speculative.hooks.targets import REMOTE_ENV
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import TEST_ENV
from tests.integration.spark_helpers import HERE, load_dag, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

APP = Path(__file__).resolve().parent / "apps" / "passthrough.py"
N = 4


@pytest.fixture(scope="module")
def servers(shared_connect_pool):
    """The session's two Connect servers (one core each): {target name: server URL}."""
    started = shared_connect_pool.servers
    names = [f"AIRFLOW_CONN_SPARK_CONNECT_HYBRID_{i}" for i in range(len(started))]
    try:
        # Also as Airflow connections, for the dag.test() case.
        for name, s in zip(names, started, strict=True):
            os.environ[name] = f'{{"conn_type": "spark_connect", "host": "127.0.0.1", "port": {s.port}}}'
        yield {f"connect-{i}": f"sc://127.0.0.1:{s.port}/" for i, s in enumerate(started)}
    finally:
        for name in names:
            os.environ.pop(name, None)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """Four tiny Parquet files: one per producer subtask."""
    directory = tmp_path / "src"
    directory.mkdir()
    for i in range(N):
        pq.write_table(pa.table({"k": list(range(i * 10, i * 10 + 10)), "v": [i] * 10}), directory / f"p{i}.parquet")
    return directory


def _config(servers: dict[str, str], **overrides) -> SpeculativeConfig:
    targets = [{"name": name, "conn_id": name, "slots": 4} for name in servers]
    return SpeculativeConfig().with_overrides({"check_interval": "300ms", "targets": targets, **overrides}, "test")


def _graph(source: Path, scan_config: dict, copy_config: dict | None = None, total: bool = False) -> PipelineGraph:
    stages = {
        "scan": StageSpec("scan", str(APP), N, {"rows": SourceSpec(str(source))}, config=scan_config),
        "copy": StageSpec("copy", str(APP), N, {"rows": ExchangeSpec("scan", "pointwise", mode="hybrid")},
                          config=copy_config or {}),
    }
    if total:
        stages["total"] = StageSpec("total", str(APP.parent / "incremental_count.py"), 1,
                                    {"rows": ExchangeSpec("copy", "all_to_all", ("k",), mode="hybrid")},
                                    config={"hybrid_min_admitted_share": 0.5})
    graph = PipelineGraph("hybrid_chain", stages)
    graph.validate()
    return graph


def _plans(graph: PipelineGraph, root: Path, run_id: str, servers: dict[str, str]) -> list[dict]:
    plans = []
    for stage in graph.topological_order():  # the consumer plans on the producer's written plan, not its commit
        stage_config = SpeculativeConfig().with_overrides(graph.stages[stage].config, stage)
        config = _config(servers, **{k: getattr(stage_config, k) for k in graph.stages[stage].config})
        plan = plan_connect_stage(graph, stage, root, "hybrid", run_id, config)
        write_plan(plan)
        plans.append(plan)
    return plans


def _env(servers: dict[str, str]) -> dict[str, dict[str, str]]:
    return {name: {REMOTE_ENV: url} for name, url in servers.items()}


def _admitted(layout: StageLayout, subtask: int) -> dict:
    """status.json of the subtask's admitted attempt (launch and end times, from the supervisor)."""
    attempt = read_json(layout.admitted(subtask))["attempt"]
    return {"attempt": attempt, **read_json(layout.status(subtask, attempt))}


def test_a_slow_producer_delays_only_its_own_chain(tmp_path: Path, source: Path, servers: dict[str, str]) -> None:
    root = tmp_path / "store"
    slow = {"hybrid/scan": {"attempts": [{"subtask": 0, "attempt": 0, "delay": 15}]}}
    with injected(slow):
        run_stages(_plans(_graph(source, {}, total=True), root, "r1", servers), target_env=_env(servers),
                   timeout=600)
    scan, copy = StageLayout(root, "hybrid", "r1", "scan"), StageLayout(root, "hybrid", "r1", "copy")
    total = StageLayout(root, "hybrid", "r1", "total")
    slow_producer_end = _admitted(scan, 0)["end_at"]
    for i in range(1, N):
        # Chains 1..3 were read, copied and admitted while producer 0 still ran.
        assert _admitted(copy, i)["end_at"] < slow_producer_end, i
        assert _admitted(copy, i)["launched_at"] >= _admitted(scan, i)["end_at"], i  # read admitted output only
    assert _admitted(copy, 0)["launched_at"] >= slow_producer_end
    # The copy equals the source, row for row.
    copied = pa.concat_tables(pq.read_table(p) for p in sorted(copy.dir.glob("subtask=*/attempt=*/data/**/*.parquet")))
    assert sorted(copied.column("k").to_pylist()) == list(range(N * 10))
    # The all_to_all consumer started once half its producers were admitted, before the slow chain ended,
    # read every producer's admitted attempt, in more than one piece, and counted every row once.
    assert _admitted(total, 0)["launched_at"] < _admitted(copy, 0)["end_at"]
    assert read_json(total.heartbeat(0, 0))["reads"] == {"copy": {str(i): 0 for i in range(N)}}
    files = sorted(total.dir.glob("subtask=0/attempt=*/data/*.parquet"))
    (row,) = pa.concat_tables(pq.read_table(p) for p in files).to_pylist()
    assert (row["n"], row["s"]) == (N * 10, sum(range(N * 10))) and row["pieces"] >= 2


def test_an_invalidated_partition_restarts_only_the_consumer_that_read_it(
        tmp_path: Path, source: Path, servers: dict[str, str]) -> None:
    root = tmp_path / "store"
    # copy[1] keeps running for a while after it read scan[1] and wrote (the fault is injected after the write).
    held = injected({"hybrid/copy": {"attempts": [{"subtask": 1, "attempt": 0, "delay": 30}]}})
    graph = _graph(source, {})
    scan_plan, copy_plan = _plans(graph, root, "r2", servers)
    scan, copy = StageLayout(root, "hybrid", "r2", "scan"), StageLayout(root, "hybrid", "r2", "copy")
    outcome: dict = {}

    def consumer() -> None:
        try:
            outcome["copy"] = run_stages([copy_plan], target_env=_env(servers), timeout=600)["copy"]
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc

    with held:
        thread = threading.Thread(target=consumer, daemon=True)
        thread.start()
        run_stages([scan_plan], target_env=_env(servers), timeout=600)
        wait_for(lambda: (read_json(copy.heartbeat(1, 0)) or {}).get("reads") == {"scan": {"1": 0}}, 300,
                 "copy[1] attempt 0 recorded reading scan[1] attempt 0")
        for i in (0, 2, 3):
            wait_for(lambda i=i: copy.admitted(i).exists(), 300, f"copy[{i}] admitted")
        # What `airflow speculative rerun --stage scan --subtask 1 --no-downstream --dry-run` shows, then does.
        region = plan_rerun(root, "hybrid", "r2", "scan", [1], downstream=False)
        assert region.subtasks == {"scan": {1}, "copy": {1}} and region.in_flight == {"copy": {1}}
        invalidate_region(root, "hybrid", "r2", region, "test: scan[1] lost")
        run_stages([scan_plan], target_env=_env(servers), timeout=600)  # re-produces scan[1] only
        thread.join(timeout=600)
    assert "error" not in outcome, outcome.get("error")
    assert [scan.attempt_numbers(i) for i in range(N)] == [[0], [0, 1], [0], [0]]
    assert [copy.attempt_numbers(i) for i in range(N)] == [[0], [0, 1], [0], [0]]
    cancels = [e for e in read_jsonl(copy.journal) if e["event"] == "cancel"]
    assert [(e["subtask"], e["attempt"]) for e in cancels] == [(1, 0)]
    assert "scan[1] attempt 0" in cancels[0]["reason"]
    assert read_json(copy.heartbeat(1, 1))["reads"] == {"scan": {"1": 1}}


def test_dag_test_runs_a_hybrid_chain(airflow_db, source: Path, servers: dict[str, str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import pendulum

    monkeypatch.setenv("SPECULATIVE_HYBRID_SOURCE", str(source))
    dag = load_dag("hybrid_chain", HERE / "dags")
    assert dag.get_task("copy").trigger_rule == "always"
    run = dag.test(logical_date=pendulum.datetime(2026, 3, 1, tz="UTC"))
    assert run.state == "success"
    store = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
    copy = StageLayout(store, "hybrid_chain", run.run_id, "copy")
    assert read_json(copy.committed)["parallelism"] == 2
    assert read_json(copy.dir / "task.json")["state"] == "committed"
    # Each copy subtask read its producer's admitted attempt.
    assert [read_json(copy.heartbeat(i, 0))["reads"] for i in range(2)] == [{"scan": {"0": 0}}, {"scan": {"1": 0}}]



def test_a_hybrid_producers_key_type_is_refused_at_its_first_commit(
        tmp_path: Path, source: Path, servers: dict[str, str]) -> None:
    # 'dim' (blocking, committed first) hashes an integer key; the hybrid producer 'scan' writes the key as a
    # string. Its schema does not exist when 'join' is planned, so the join is refused when scan's first
    # subtask is admitted, before any join attempt reads it; scan itself runs to the end.
    apps = APP.parent
    p = Pipeline("hybrid_keys")
    dim = p.stage("dim", application=str(APP), parallelism=1, inputs={"rows": parquet_source(str(source))})
    scan = p.stage("scan", application=str(apps / "select_exprs.py"), parallelism=2,
                   inputs={"rows": parquet_source(str(source))},
                   application_args=[json.dumps({"input": "rows", "select": ["cast(k AS string) AS k", "v"]})])
    p.stage("join", application=str(apps / "join_inputs.py"), parallelism=2,
            inputs={"dim": all_to_all(dim, key="k"), "rows": all_to_all(scan, key="k", mode="hybrid")},
            application_args=[json.dumps({"left": "rows", "right": "dim", "left_on": ["k"], "right_on": ["k"],
                                          "keep": []})])
    graph, root = p.graph(), tmp_path / "store"

    def plan(stage: str) -> dict:
        written = plan_connect_stage(graph, stage, root, "hybrid", "r4", _config(servers))
        write_plan(written)
        return written

    run_stages([plan("dim")], target_env=_env(servers), timeout=600)
    controllers = {stage: StageController.open(plan(stage), target_env=_env(servers)) for stage in ("scan", "join")}
    deadline = time.monotonic() + 600
    while not all(c.done for c in controllers.values()):
        assert time.monotonic() < deadline, "scan and join not decided within 600 s"
        for c in controllers.values():
            if not c.done:
                c.step()
        wait_for_next_step([c for c in controllers.values() if not c.done])
    reason = controllers["join"].event_payload()["reason"]
    assert controllers["join"].event_payload()["status"] != "success"
    assert reason.startswith("pipeline 'hybrid_keys', stage 'join': key column 1 differs in type between inputs: "
                             "'dim'.k is long, 'rows'.k is string"), reason
    assert "input 'rows' is a hybrid exchange: producer 'scan'" in reason, reason
    join = StageLayout(root, "hybrid", "r4", "join")
    assert not any(p.name.startswith("attempt=") for p in join.dir.rglob("*")), sorted(join.dir.rglob("*"))
    assert controllers["scan"].event_payload()["status"] == "success"
