"""Benchmark: attempt-seconds to recover one lost upstream partition vs rerunning the whole pipeline.

Runs the example-sized TPC-H Q1 pipeline (scan: 8 subtasks over the 8 lineitem parts, aggregate: 2)
with real local Spark and no Airflow (the controller is driven directly), then loses the committed
output of one scan subtask and reruns the aggregate stage, which finds the partition missing:

  full    attempt-seconds of the whole pipeline (scan + aggregate)
  region  failover_strategy=region: the lost scan subtask is re-produced, then the aggregate
  all     failover_strategy=all: every scan subtask is re-produced (for comparison)

Usage: .venv/bin/python bench/recovery.py [--data .data/tpch/lineitem] [--lose 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.devtools.runner import plan_local_stage, run_stage
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout

REPO = Path(__file__).resolve().parents[1]
APPS = REPO / "dags" / "apps"


SHUFFLE = {"spark.sql.shuffle.partitions": "4"}


def attempt_seconds(layout: StageLayout, parallelism: int, newer_than: dict[int, int] | None = None) -> float:
    """Sum of (end - start) over a stage's attempts, optionally only attempts newer than given numbers."""
    backend, total = attempt_observer(layout), 0.0
    for subtask in range(parallelism):
        for number in layout.attempt_numbers(subtask):
            if newer_than is not None and number <= newer_than.get(subtask, -1):
                continue
            a = backend.poll(subtask, number)
            if a.deploying_at is not None and a.end_at is not None:
                total += a.end_at - a.deploying_at
    return total


def lose(layout: StageLayout, subtask: int) -> None:
    """Delete the committed output of one subtask (a lost disk, an expired result)."""
    attempt = read_json(layout.admitted(subtask))["attempt"]
    shutil.rmtree(layout.data(subtask, attempt))


def recover(graph: PipelineGraph, root: Path, strategy: str, lost: int) -> float:
    """Rerun the aggregate stage after losing scan[lost]; return attempt-seconds spent on the recovery."""
    scan = StageLayout(root, "bench", "r1", "scan")
    before = {s: max(scan.attempt_numbers(s)) for s in range(graph.stages["scan"].parallelism)}
    lose(scan, lost)
    config = SpeculativeConfig().with_overrides({"check_interval": 0.5, "failover_strategy": strategy}, "bench")
    aggregate = run_stage(plan_local_stage(graph, "aggregate", root, "bench", "r1", config), fresh=True)
    return (attempt_seconds(scan, graph.stages["scan"].parallelism, before)
            + aggregate.summary()["attempt_seconds"])


def main() -> None:
    """Measure and print full vs region vs all recovery attempt-seconds."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO / ".data" / "tpch" / "lineitem"))
    parser.add_argument("--lose", type=int, default=3, help="scan subtask whose output is lost")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = parser.parse_args()
    graph = PipelineGraph("bench", {
        "scan": StageSpec("scan", str(APPS / "q1_scan.py"), 8, {"lineitem": SourceSpec(args.data)},
                          spark_conf=SHUFFLE),
        "aggregate": StageSpec("aggregate", str(APPS / "q1_final.py"), 2,
                               {"partials": ExchangeSpec("scan", "all_to_all", ("l_returnflag", "l_linestatus"))},
                               spark_conf=SHUFFLE),
    })
    config = SpeculativeConfig().with_overrides({"check_interval": 0.5}, "bench")
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        root = Path(tmp)
        started = time.time()
        scan = run_stage(plan_local_stage(graph, "scan", root, "bench", "r1", config))
        aggregate = run_stage(plan_local_stage(graph, "aggregate", root, "bench", "r1", config))
        full = scan.summary()["attempt_seconds"] + aggregate.summary()["attempt_seconds"]
        region = recover(graph, root, "region", args.lose)
        everything = recover(graph, root, "all", args.lose)
        result = {"full_pipeline_attempt_seconds": round(full, 1), "region_recovery_attempt_seconds": round(region, 1),
                  "all_recovery_attempt_seconds": round(everything, 1),
                  "region_over_full": round(region / full, 3), "all_over_full": round(everything / full, 3),
                  "wall_seconds": round(time.time() - started, 1), "lost_scan_subtask": args.lose}
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"recovery-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
