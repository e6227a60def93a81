"""Benchmark: a skewed key with equal-count vs equal-byte exchange ranges, side by side in one run.

One scan stage (4 producer files, max_parallelism 16; key 0 holds 60% of the rows) feeds two
identical partial-aggregation stages of 4 consumers: ``agg_count`` with equal-count subpartition
ranges (``balanced_exchange_ranges = false``) and ``agg_bytes`` with equal-byte ranges, where the
stage declares ``splittable_skew`` so the hot subpartition is split by producer range. Real local
Spark, no Airflow (control/runner.py). Printed: max/median consumer input bytes per variant and the
consumer stage's makespan (wall clock of the stage, and its slowest attempt), with ratios.

Usage: PYTHONPATH=. .venv/bin/python bench/skew.py [--rows 500000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import attempt_observer
from airflow_provider_speculative.control.runner import plan_local_stage, run_stage
from airflow_provider_speculative.core.config import SpeculativeConfig
from tests.integration.skew import max_over_median, skew_graph, write_skewed_parquet

BALANCED = SpeculativeConfig().with_overrides({"check_interval": 0.5}, "bench")
EQUAL_COUNT = BALANCED.with_overrides({"balanced_exchange_ranges": False}, "bench")


def slowest_attempt(controller: Any) -> float:
    """Seconds of the slowest admitted attempt (deploying to end)."""
    observer, now = attempt_observer(controller.layout), time.time()
    durations = []
    for subtask, number in controller.scheduler.admitted.items():
        attempt = observer.poll(subtask, number, now)
        if attempt.deploying_at and attempt.end_at:
            durations.append(attempt.end_at - attempt.deploying_at)
    return max(durations)


def main() -> None:
    """Run the skewed pipeline once and print both variants side by side."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000, help="rows per producer file")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skew-bench-") as tmp:
        tmp_path = Path(tmp)
        source = write_skewed_parquet(tmp_path / "src", rows=args.rows)
        graph = skew_graph(source)
        root, dag, run = tmp_path / "store", "skew", "bench"
        run_stage(plan_local_stage(graph, "scan", root, dag, run, BALANCED))
        results: dict[str, dict[str, Any]] = {}
        for name, stage, config in (("equal_count", "agg_count", EQUAL_COUNT), ("equal_bytes", "agg_bytes", BALANCED)):
            plan = plan_local_stage(graph, stage, root, dag, run, config)
            loads = [s["input_bytes"] for s in plan["subtasks"]]
            started = time.monotonic()
            controller = run_stage(plan)
            results[name] = {"input_bytes": loads, "max_over_median": max_over_median(loads),
                             "makespan_s": time.monotonic() - started, "slowest_attempt_s": slowest_attempt(controller),
                             "skew": plan["exchange_skew"], "warnings": plan["warnings"]}
    count, balanced = results["equal_count"], results["equal_bytes"]
    print(f"rows per file {args.rows}, 4 producers, 16 subpartitions, 4 consumers")
    for name, r in results.items():
        print(f"{name:12s} input bytes {r['input_bytes']}  max/median {r['max_over_median']:.2f}  "
              f"makespan {r['makespan_s']:.1f}s  slowest attempt {r['slowest_attempt_s']:.1f}s")
    ratios = {"max_over_median": count["max_over_median"] / balanced["max_over_median"],
              "makespan": count["makespan_s"] / balanced["makespan_s"],
              "slowest_attempt": count["slowest_attempt_s"] / balanced["slowest_attempt_s"]}
    print("equal_count / equal_bytes: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "results": results, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
