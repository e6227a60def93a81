"""Benchmark: a skewed key with equal-count vs equal-byte exchange ranges, side by side in one run.

One scan stage (4 producer files, max_parallelism 16; key 0 holds 60% of the rows) feeds two
identical partial-aggregation stages of 4 consumers: ``agg_count`` with equal-count subpartition
ranges (``balanced_exchange_ranges = false``) and ``agg_bytes`` with equal-byte ranges, where the
stage declares ``splittable_skew`` so the hot subpartition is split by producer range. Real local
Spark, no Airflow (devtools/runner.py). Printed: max/median consumer input bytes per variant and the
consumer stage's makespan (wall clock of the stage, and its slowest attempt), with ratios.

Attempts run on one local target with ``--slots`` slots (default 2: one per core of this machine),
so 4 consumers run in two waves, as on a cluster whose slots are all busy; with more slots than
cores, balancing cannot shorten a CPU-bound stage (the cores, not the slowest task, are the limit).
The variants alternate (A B B A ...) and the medians over ``--repeat`` runs of each are compared.

The consumers hash every row ``--rounds`` times (SHA-256), so their time follows the rows they read
rather than Spark's start-up (~40 s per attempt on this loaded 2-core machine, whatever the input).

A third variant, ``plain``, is what a user would run instead: the same query over the same files as ONE
``spark-submit --master local[SLOTS]`` (bench/plain_skew.py: same SHA-256 work, same aggregation) with
Spark's adaptive query execution on (``spark.sql.adaptive.enabled``, partition coalescing and
``skewJoin`` on; AQE's skew splitting applies to joins only: for an aggregation Spark relies on its
map-side partial aggregate, see plain_skew.py). Its wall time (JVM start included, as an attempt's is)
is compared with each provider variant's consumer-stage makespan, and with scan + consumer stage (the
whole query through the provider; the scan stage runs once and is shared). Every variant's result,
the partial rows of a split key added up, must equal the plain run's exactly (and pyarrow's sums),
else the command fails. A load sampler (bench/speculation.py's) records the CPU other processes used
during each run: other engineers run Spark on this machine too.

Usage: PYTHONPATH=. .venv/bin/python bench/skew.py [--rows 1000000] [--rounds 30] [--slots 2] [--repeat 2]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from speculation import LoadSampler  # noqa: E402  (bench/speculation.py: the contention sampler)

from airflow_provider_speculative.backends.registry import attempt_observer  # noqa: E402
from airflow_provider_speculative.core.config import SpeculativeConfig  # noqa: E402
from airflow_provider_speculative.devtools.runner import local_spark_submit, plan_local_stage, run_stage  # noqa: E402
from tests.integration.skew import (  # noqa: E402
    expected_sums,
    max_over_median,
    merged_sums,
    skew_graph,
    write_skewed_parquet,
)

VARIANTS = {"equal_count": ("agg_count", False), "equal_bytes": ("agg_bytes", True)}
# Spark 4's adaptive execution, as a user would switch it on for a skewed query.
PLAIN_CONF = {"spark.sql.adaptive.enabled": "true", "spark.sql.adaptive.coalescePartitions.enabled": "true",
              "spark.sql.adaptive.skewJoin.enabled": "true", "spark.sql.shuffle.partitions": "16",
              "spark.ui.showConsoleProgress": "false"}


def slowest_attempt(controller: Any) -> float:
    """Seconds of the slowest admitted attempt (deploying to end)."""
    observer, now = attempt_observer(controller.layout), time.time()
    durations = []
    for subtask, number in controller.scheduler.admitted.items():
        attempt = observer.poll(subtask, number, now)
        if attempt.deploying_at and attempt.end_at:
            durations.append(attempt.end_at - attempt.deploying_at)
    return max(durations)


def run_plain(source: Path, out: Path, rounds: int, slots: int) -> float:
    """One spark-submit of the whole query on ``local[slots]``; its wall seconds."""
    conf = [a for k, v in PLAIN_CONF.items() for a in ("--conf", f"{k}={v}")]
    cmd = [*local_spark_submit(f"local[{slots}]"), *conf, str(HERE / "plain_skew.py"), str(source), str(out),
           str(rounds)]
    started = time.monotonic()
    with open(out.parent / f"{out.name}.log", "wb") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    if code != 0:
        raise RuntimeError(f"plain spark-submit failed ({code}); see {out.parent / f'{out.name}.log'}")
    return time.monotonic() - started


def main() -> None:
    """Run the skewed pipeline once and print all variants side by side."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per producer file")
    parser.add_argument("--rounds", type=int, default=30, help="SHA-256 rounds per row read (consumer CPU work)")
    parser.add_argument("--slots", type=int, default=2, help="attempt slots (one local target); plain: local[SLOTS]")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    target = {"name": "local", "slots": args.slots, "conf": {"spark.ui.enabled": "false"}}
    config = SpeculativeConfig().with_overrides({"check_interval": 0.5, "targets": [target]}, "bench")
    names = [*VARIANTS, "plain"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    order = [name for i in range(args.repeat) for name in (names if i % 2 == 0 else names[::-1])]
    with tempfile.TemporaryDirectory(prefix="skew-bench-") as tmp:
        tmp_path = Path(tmp)
        source = write_skewed_parquet(tmp_path / "src", rows=args.rows)
        want = expected_sums(source)
        graph = skew_graph(source, rounds=args.rounds)
        root, dag = tmp_path / "store", "skew"
        with LoadSampler(tmp) as sampler:
            started = time.monotonic()
            run_stage(plan_local_stage(graph, "scan", root, dag, "bench", config))
            scan_s = time.monotonic() - started
        scan = {"makespan_s": scan_s, "load": sampler.summary()}
        print(f"scan stage (once, shared): {scan_s:.1f} s, load {scan['load']}", flush=True)
        reference: dict[int, tuple[Any, ...]] | None = None
        for i, name in enumerate(order):
            with LoadSampler(tmp) as sampler:
                if name == "plain":
                    out = tmp_path / f"plain-{i}"
                    row: dict[str, Any] = {"run": i, "makespan_s": run_plain(source, out, args.rounds, args.slots)}
                    result = merged_sums([out])
                else:
                    stage, balanced = VARIANTS[name]
                    plan = plan_local_stage(graph, stage, root, dag, "bench",
                                            config.with_overrides({"balanced_exchange_ranges": balanced}, "bench"))
                    loads = [s["input_bytes"] for s in plan["subtasks"]]
                    started = time.monotonic()
                    controller = run_stage(plan, fresh=True)
                    row = {"run": i, "input_bytes": loads, "max_over_median": max_over_median(loads),
                           "makespan_s": time.monotonic() - started,
                           "slowest_attempt_s": slowest_attempt(controller),
                           "skew": plan["exchange_skew"], "warnings": plan["warnings"]}
                    result = merged_sums([controller.layout.data(s, a)
                                          for s, a in controller.scheduler.admitted.items()])
            row["load"] = sampler.summary()
            # The same query must give the same result, whichever way it ran (exactly: ints and digests).
            assert {k: v[:2] for k, v in result.items()} == want, f"{name} run {i}: sums differ from pyarrow's"
            reference = reference if reference is not None else result
            assert result == reference, f"{name} run {i}: result differs from the first run's ({order[0]})"
            runs[name].append(row)
            print(f"  run {i} {name}: {row['makespan_s']:.1f} s, result equal, foreign cores mean "
                  f"{row['load'].get('foreign_cores_mean')} peak {row['load'].get('foreign_cores_peak')}", flush=True)
    keys = {"equal_count": ("max_over_median", "makespan_s", "slowest_attempt_s"), "plain": ("makespan_s",)}
    summary = {name: {key: statistics.median(r[key] for r in rs) for key in keys.get(name, keys["equal_count"])}
               for name, rs in runs.items()}
    print(f"rows per file {args.rows}, {args.rounds} SHA-256 rounds per row, 4 producers, 16 subpartitions, "
          f"4 consumers, {args.slots} slots (plain: local[{args.slots}], AQE on), "
          f"{args.repeat} runs per variant (order {' '.join(order)}); every result equal")
    for name in VARIANTS:
        rs = runs[name]
        print(f"{name:12s} input bytes {rs[0]['input_bytes']}  max/median {summary[name]['max_over_median']:.2f}  "
              f"makespan {[round(r['makespan_s'], 1) for r in rs]} s (median {summary[name]['makespan_s']:.1f})  "
              f"slowest attempt median {summary[name]['slowest_attempt_s']:.1f} s")
    print(f"{'plain':12s} one spark-submit, wall {[round(r['makespan_s'], 1) for r in runs['plain']]} s "
          f"(median {summary['plain']['makespan_s']:.1f}); scan stage (provider, once) {scan_s:.1f} s")
    count, balanced, plain = summary["equal_count"], summary["equal_bytes"], summary["plain"]["makespan_s"]
    ratios = {"max_over_median": count["max_over_median"] / balanced["max_over_median"],
              "makespan": count["makespan_s"] / balanced["makespan_s"],
              "slowest_attempt": count["slowest_attempt_s"] / balanced["slowest_attempt_s"]}
    print("equal_count / equal_bytes: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    for name in VARIANTS:
        ratios[f"{name}/plain"] = summary[name]["makespan_s"] / plain
        ratios[f"{name}+scan/plain"] = (summary[name]["makespan_s"] + scan_s) / plain
    print("provider / plain (makespan): " + ", ".join(
        f"{name} {ratios[f'{name}/plain']:.2f}x (with the scan stage {ratios[f'{name}+scan/plain']:.2f}x)"
        for name in VARIANTS))
    contended = [f"{r['run']}:{n}" for n, rs in runs.items() for r in rs if r["load"].get("contended")]
    print(f"contended runs (others used > 0.1 core mean or > 0.5 peak): {contended or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "rounds": args.rounds, "slots": args.slots, "runs": runs,
                                         "scan": scan, "summary": summary, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
