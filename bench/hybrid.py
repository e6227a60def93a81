"""Benchmark: makespan of the same pipeline with blocking vs hybrid exchanges (FLIP-235), side by side.

The pipeline is the example ``dags/tpch_q1_hybrid.py``: ``filter`` (8 subtasks, one lineitem part each)
-> ``pointwise`` -> ``partial`` (8) -> ``all_to_all`` (blocking) -> ``aggregate`` (2). The measured edge is
the pointwise chain filter -> partial, blocking in one scenario and hybrid in the other; every
scenario runs with and without a slow node (fault injection: every attempt on target ``connect-1`` is
4x slower, producer and consumer alike, as a slow machine would be):

  blocking-fast  hybrid-fast  blocking-slow  hybrid-slow      (interleaved, ``--repeat`` rounds)

Attempts run on two warm Spark Connect servers (devtools/localcluster.py, one core each, started once
and not counted); the stages run through the provider's controllers without Airflow
(devtools/runner.py ``run_stages``), because ``airflow dags test`` runs one task at a time and so can
never overlap two stages. Blocking: each stage starts after the previous one committed. Hybrid:
``filter`` and ``partial`` run together, ``partial``'s subtask i starting when ``filter``'s subtask i is
admitted. The makespan is from the first plan to ``aggregate``'s commit. Every scenario's output must
equal the others' and an independent Q1 (bench/speculation.py), else the command exits 1.

    .venv/bin/python bench/hybrid.py [--repeat N] [--factor 4] [--slots 2]

Prints the makespans, hybrid/blocking per condition (goal: <= 0.8 with the slow node) and whether
other processes shared the CPUs meanwhile (``contended``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import speculation as shared  # noqa: E402  (LoadSampler, reference Q1)

from airflow_provider_speculative.core.config import SpeculativeConfig  # noqa: E402
from airflow_provider_speculative.core.graph import (  # noqa: E402
    ExchangeSpec,
    PipelineGraph,
    SourceSpec,
    StageSpec,
)
from airflow_provider_speculative.devtools.faults import injected  # noqa: E402
from airflow_provider_speculative.devtools.localcluster import LocalCluster, free_base_port  # noqa: E402
from airflow_provider_speculative.devtools.runner import plan_connect_stage, run_stages, write_plan  # noqa: E402
from airflow_provider_speculative.hooks.targets import REMOTE_ENV  # noqa: E402
from airflow_provider_speculative.store.files import read_json  # noqa: E402
from airflow_provider_speculative.store.layout import StageLayout  # noqa: E402

APPS = REPO / "dags" / "apps"
DATA = REPO / ".data" / "tpch" / "lineitem"
RESULTS = HERE / "results"
KEY = ("l_returnflag", "l_linestatus")
SHUFFLE = {"spark.sql.shuffle.partitions": "2"}
GOAL = 0.8
SCENARIOS = ("blocking-fast", "hybrid-fast", "blocking-slow", "hybrid-slow")


def graph(mode: str) -> PipelineGraph:
    """The example pipeline with the filter -> partial edge in ``mode``."""
    stages = {
        "filter": StageSpec("filter", str(APPS / "q1_filter.py"), 8, {"lineitem": SourceSpec(str(DATA))},
                            spark_conf=SHUFFLE),
        "partial": StageSpec("partial", str(APPS / "q1_scan.py"), 8,
                             {"lineitem": ExchangeSpec("filter", "pointwise", mode=mode)}, spark_conf=SHUFFLE),
        "aggregate": StageSpec("aggregate", str(APPS / "q1_final.py"), 2,
                               {"partials": ExchangeSpec("partial", "all_to_all", KEY)}, spark_conf=SHUFFLE),
    }
    result = PipelineGraph("bench_hybrid", stages)
    result.validate()
    return result


def config(servers: dict[str, str], slots: int) -> SpeculativeConfig:
    """Speculation off (this measures the exchange)."""
    overrides: dict[str, Any] = {"check_interval": "250ms",
                                 "targets": [{"name": n, "conn_id": n, "slots": slots} for n in servers]}
    return SpeculativeConfig().with_overrides(overrides, "bench")


def faults(slow: bool, factor: float) -> dict[str, dict[str, Any]]:
    """The fault injection of a scenario: with the slow node, every attempt on target connect-1."""
    return {"bench_hybrid/*": {"targets": {"connect-1": {"factor": factor}}}} if slow else {}


def run_scenario(name: str, root: Path, servers: dict[str, str], slots: int, factor: float) -> dict[str, Any]:
    """One run of the pipeline; returns its makespan and per-stage spans."""
    mode, condition = name.split("-")
    g, cfg = graph(mode), config(servers, slots)
    env = {n: {REMOTE_ENV: url} for n, url in servers.items()}
    run_id = f"{name}-{time.time_ns()}"
    start = time.time()

    def plan(stage: str) -> dict[str, Any]:
        planned = plan_connect_stage(g, stage, root, "bench_hybrid", run_id, cfg)
        write_plan(planned)  # a hybrid consumer plans on its producer's written plan
        return planned

    with injected(faults(condition == "slow", factor)):
        if mode == "hybrid":
            run_stages([plan("filter"), plan("partial")], target_env=env)
        else:
            run_stages([plan("filter")], target_env=env)
            run_stages([plan("partial")], target_env=env)
        run_stages([plan("aggregate")], target_env=env)
    makespan = time.time() - start
    spans = {}
    for stage in ("filter", "partial", "aggregate"):
        layout = StageLayout(root, "bench_hybrid", run_id, stage)
        statuses = [read_json(layout.status(s, a)) or {} for s in range(8 if stage != "aggregate" else 2)
                    for a in layout.attempt_numbers(s)]
        launched = [s["launched_at"] for s in statuses if s.get("launched_at")]
        ended = [s["end_at"] for s in statuses if s.get("end_at")]
        spans[stage] = [round(min(launched) - start, 2), round(max(ended) - start, 2)] if launched and ended else None
    return {"scenario": name, "run_id": run_id, "makespan": round(makespan, 2), "spans": spans,
            "output": output(root, run_id)}


def output(root: Path, run_id: str) -> list[dict[str, Any]]:
    """The aggregate stage's committed rows, sorted by the group key, numbers rounded for comparison."""
    import pyarrow.parquet as pq

    layout = StageLayout(root, "bench_hybrid", run_id, "aggregate")
    committed = read_json(layout.committed)
    rows = []
    for sub, part in committed["subtasks"].items():
        data = layout.data(int(sub), part["attempt"])
        if any(data.rglob("*.parquet")):
            rows += pq.read_table(data).to_pylist()
    return sorted(({k: (round(float(v), 4) if not isinstance(v, str) else v) for k, v in r.items()} for r in rows),
                  key=lambda r: (r["l_returnflag"], r["l_linestatus"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--factor", type=float, default=4.0, help="slow node factor (fault injection)")
    parser.add_argument("--slots", type=int, default=2, help="attempt slots per Connect server")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset, in this order")
    parser.add_argument("--keep", action="store_true", help="keep every run's store (attempt logs, timestamps)")
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    if not (DATA / ".done").exists():
        print(f"no TPC-H data at {DATA}: run `make data`", file=sys.stderr)
        return 2
    out_dir = RESULTS / f"hybrid-{time.strftime('%Y%m%dT%H%M%S')}"
    out_dir.mkdir(parents=True)
    cluster = LocalCluster(out_dir / "cluster")
    started, _ = cluster.start(servers=2, base_port=free_base_port(), ui_base_port=free_base_port(), cores=1)
    servers = {f"connect-{i}": f"sc://127.0.0.1:{s.port}/" for i, s in enumerate(started)}
    results: list[dict[str, Any]] = []
    try:
        with shared.LoadSampler(str(out_dir)) as load:
            for round_ in range(args.repeat):
                for name in scenarios:
                    root = out_dir / "store"
                    result = run_scenario(name, root, servers, args.slots, args.factor)
                    result["round"] = round_
                    results.append(result)
                    print(f"round {round_} {name:14s} makespan {result['makespan']:7.2f}s  spans {result['spans']}",
                          flush=True)
                    if not args.keep:
                        shutil.rmtree(root / "bench_hybrid" / result["run_id"], ignore_errors=True)
        machine = load.summary()
    finally:
        cluster.stop()
    reference = results[0]["output"]
    wrong = [r["scenario"] for r in results if r["output"] != reference]
    expected = shared.reference_q1(DATA)
    if len(reference) != len(expected) or [(r["l_returnflag"], r["l_linestatus"], r["count_order"])
                                           for r in reference] != [(r["l_returnflag"], r["l_linestatus"],
                                                                    r["count_order"]) for r in expected]:
        wrong.append("reference Q1")
    median = {name: statistics.median(r["makespan"] for r in results if r["scenario"] == name) for name in scenarios}
    ratios = {c: round(median[f"hybrid-{c}"] / median[f"blocking-{c}"], 3)
              for c in ("fast", "slow") if f"hybrid-{c}" in median and f"blocking-{c}" in median}
    # The pointwise chain alone: from the first plan to the end of partial's last attempt.
    chain = {name: statistics.median(r["spans"]["partial"][1] for r in results if r["scenario"] == name)
             for name in scenarios}
    chain_ratios = {c: round(chain[f"hybrid-{c}"] / chain[f"blocking-{c}"], 3)
                    for c in ("fast", "slow") if f"hybrid-{c}" in chain and f"blocking-{c}" in chain}
    summary = {"median_makespan": median, "hybrid_over_blocking": ratios, "goal_slow": GOAL,
               "median_chain_end": chain, "chain_hybrid_over_blocking": chain_ratios,
               "factor": args.factor, "slots": args.slots, "repeat": args.repeat, "machine": machine,
               "outputs_equal": not wrong, "runs": [{k: v for k, v in r.items() if k != "output"} for r in results]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nmedian makespan (s): {json.dumps(median)}")
    print(f"hybrid / blocking: no slow node {ratios.get('fast')}, slow node x{args.factor:g} {ratios.get('slow')} "
          f"(goal <= {GOAL})")
    print(f"pointwise chain alone (filter -> partial): hybrid / blocking: no slow node {chain_ratios.get('fast')}, "
          f"slow node {chain_ratios.get('slow')}")
    print(f"machine: contended={machine.get('contended')} foreign cores mean {machine.get('foreign_cores_mean')} "
          f"peak {machine.get('foreign_cores_peak')}, max load1 {machine.get('max_load1')}")
    print(f"outputs: {'equal across scenarios and to the reference Q1' if not wrong else 'DIFFER: ' + str(wrong)}")
    print(f"results: {out_dir}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
