"""Benchmark: a skewed key with equal-count vs equal-byte exchange ranges, side by side in one run.

One scan stage (4 producer files, max_parallelism 16; key 0 holds 60% of the rows) feeds two
identical partial-aggregation stages of 4 consumers: ``agg_count`` with equal-count subpartition
ranges (``balanced_exchange_ranges = false``) and ``agg_bytes`` with equal-byte ranges, where the
stage declares ``splittable_skew`` so the hot subpartition is split by producer range. Real local
Spark, no Airflow (control/runner.py). Printed: max/median consumer input bytes per variant and the
consumer stage's makespan (wall clock of the stage, and its slowest attempt), with ratios.

Attempts run on one local target with ``--slots`` slots (default 2: one per core of this machine),
so 4 consumers run in two waves, as on a cluster whose slots are all busy; with more slots than
cores, balancing cannot shorten a CPU-bound stage (the cores, not the slowest task, are the limit).
The variants alternate (A B B A ...) and the medians over ``--repeat`` runs of each are compared.

The consumers hash every row ``--rounds`` times (SHA-256), so their time follows the rows they read
rather than Spark's start-up (~40 s per attempt on this loaded 2-core machine, whatever the input).

Usage: PYTHONPATH=. .venv/bin/python bench/skew.py [--rows 1000000] [--rounds 30] [--slots 2] [--repeat 2]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import attempt_observer
from airflow_provider_speculative.control.runner import plan_local_stage, run_stage
from airflow_provider_speculative.core.config import SpeculativeConfig
from tests.integration.skew import max_over_median, skew_graph, write_skewed_parquet

VARIANTS = {"equal_count": ("agg_count", False), "equal_bytes": ("agg_bytes", True)}


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
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per producer file")
    parser.add_argument("--rounds", type=int, default=30, help="SHA-256 rounds per row read (consumer CPU work)")
    parser.add_argument("--slots", type=int, default=2, help="attempt slots (one local target)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    target = {"name": "local", "slots": args.slots, "conf": {"spark.ui.enabled": "false"}}
    config = SpeculativeConfig().with_overrides({"check_interval": 0.5, "targets": [target]}, "bench")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    order = [name for i in range(args.repeat) for name in (list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1])]
    with tempfile.TemporaryDirectory(prefix="skew-bench-") as tmp:
        tmp_path = Path(tmp)
        source = write_skewed_parquet(tmp_path / "src", rows=args.rows)
        graph = skew_graph(source, rounds=args.rounds)
        root, dag = tmp_path / "store", "skew"
        run_stage(plan_local_stage(graph, "scan", root, dag, "bench", config))
        for i, name in enumerate(order):
            stage, balanced = VARIANTS[name]
            plan = plan_local_stage(graph, stage, root, dag, "bench",
                                    config.with_overrides({"balanced_exchange_ranges": balanced}, "bench"))
            loads = [s["input_bytes"] for s in plan["subtasks"]]
            started = time.monotonic()
            controller = run_stage(plan, fresh=True)
            runs[name].append({"run": i, "input_bytes": loads, "max_over_median": max_over_median(loads),
                               "makespan_s": time.monotonic() - started,
                               "slowest_attempt_s": slowest_attempt(controller),
                               "skew": plan["exchange_skew"], "warnings": plan["warnings"]})
    summary = {name: {key: statistics.median(r[key] for r in rs)
                      for key in ("max_over_median", "makespan_s", "slowest_attempt_s")}
               for name, rs in runs.items()}
    print(f"rows per file {args.rows}, {args.rounds} SHA-256 rounds per row, 4 producers, 16 subpartitions, "
          f"4 consumers, {args.slots} slots, "
          f"{args.repeat} runs per variant (order {' '.join(order)})")
    for name, rs in runs.items():
        print(f"{name:12s} input bytes {rs[0]['input_bytes']}  max/median {summary[name]['max_over_median']:.2f}  "
              f"makespan {[round(r['makespan_s'], 1) for r in rs]} s (median {summary[name]['makespan_s']:.1f})  "
              f"slowest attempt median {summary[name]['slowest_attempt_s']:.1f} s")
    count, balanced = summary["equal_count"], summary["equal_bytes"]
    ratios = {"max_over_median": count["max_over_median"] / balanced["max_over_median"],
              "makespan": count["makespan_s"] / balanced["makespan_s"],
              "slowest_attempt": count["slowest_attempt_s"] / balanced["slowest_attempt_s"]}
    print("equal_count / equal_bytes: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "rounds": args.rounds, "slots": args.slots, "runs": runs,
                                         "summary": summary, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
