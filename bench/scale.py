"""Scale benchmark (pure Python, synthetic store): planning large stages and controller ticks.

    .venv/bin/python bench/scale.py [--ticks 20] [--sizes 100,1000,10000]

Measures, on this machine:
  1. planning a 10,000-subtask source stage over 10,000 files (plan_stage + writing plan.json);
  2. planning a 1,000 x 1,000 all_to_all consumer from a committed producer (read committed.json,
     plan_stage, write plan.json) -- goal for both: under 2 s, plan.json under 5 MB;
  3. CPU per controller tick over 100, 1,000 and 10,000 live attempts (real StageController, real
     files, a real live process as every attempt's pid) -- goal: under 50 ms at 10,000.
No Spark, no Airflow: the attempts are files a real supervisor would have written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from airflow_provider_speculative.backends import supervised  # noqa: E402
from airflow_provider_speculative.control.controller import PROBE_PERIOD, StageController  # noqa: E402
from airflow_provider_speculative.core.config import SpeculativeConfig  # noqa: E402
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec  # noqa: E402
from airflow_provider_speculative.core.plan import plan_stage  # noqa: E402
from airflow_provider_speculative.store.files import atomic_write_json  # noqa: E402
from airflow_provider_speculative.store.layout import StageLayout  # noqa: E402
from airflow_provider_speculative.store.results import read_committed, write_committed  # noqa: E402

CONTEXT = {"dag_id": "bench", "run_id": "r1", "logical_date": None, "application": "/apps/app.py"}


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def bench_source_plan(root: Path, n: int = 10_000) -> dict[str, float]:
    rng = random.Random(7)
    files = [(f"/data/big/part-{i:05d}.parquet", rng.randint(1_000_000, 200_000_000)) for i in range(n)]
    graph = PipelineGraph("bench", {"scan": StageSpec("scan", "/apps/app.py", n, {"src": SourceSpec("/data/big")},
                                                      max_parallelism=n)})
    layout = StageLayout(root, "bench", "r1", "scan")

    def plan() -> dict:
        result = plan_stage(graph, "scan", SpeculativeConfig(), source_files={"src": files}, upstream_committed={},
                            sink=None, speculation_blocker=None,
                            context={**CONTEXT, "store_root": str(root), "targets": {}})
        atomic_write_json(layout.plan, result)
        return result

    _, seconds = _timed(plan)
    return {"seconds": seconds, "plan_mb": layout.plan.stat().st_size / 1e6}


def bench_exchange_plan(root: Path, producers: int = 1_000, consumers: int = 1_000) -> dict[str, float]:
    rng = random.Random(11)
    graph = PipelineGraph("bench", {
        "scan": StageSpec("scan", "/apps/app.py", producers, {"src": SourceSpec("/data")}, max_parallelism=consumers),
        "agg": StageSpec("agg", "/apps/app.py", consumers, {"x": ExchangeSpec("scan", "all_to_all", ("k",))},
                         max_parallelism=consumers)})
    scan = StageLayout(root, "bench", "r1", "scan")
    # What finalize commits for a producer stage that wrote one file per subpartition per subtask.
    record = {"stage": "scan", "parallelism": producers, "fingerprint": "fp", "subtasks": {
        str(p): {"attempt": 0, "data": str(scan.data(p, 0)), "schema": {"type": "struct", "fields": []},
                 "records": 1, "files": [{"path": f"_sp={sp}/part-0.parquet", "size": rng.randint(1, 10_000),
                                          "subpartition": sp} for sp in range(consumers)]}
        for p in range(producers)}}
    _, commit_seconds = _timed(lambda: write_committed(scan, record))
    layout = StageLayout(root, "bench", "r1", "agg")

    def plan() -> dict:
        upstream = {"scan": read_committed(scan)}
        result = plan_stage(graph, "agg", SpeculativeConfig(), source_files={}, upstream_committed=upstream,
                            sink=None, speculation_blocker=None,
                            context={**CONTEXT, "store_root": str(root), "targets": {}})
        atomic_write_json(layout.plan, result)
        return result

    _, seconds = _timed(plan)
    return {"seconds": seconds, "plan_mb": layout.plan.stat().st_size / 1e6,
            "committed_mb": scan.committed.stat().st_size / 1e6, "commit_seconds": commit_seconds}


def bench_ticks(root: Path, n: int, ticks: int) -> dict[str, float]:
    """CPU per controller tick over ``n`` live attempts that all keep running."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        proc = psutil.Process(sleeper.pid)
        cfg = SpeculativeConfig().with_overrides({"targets": [{"name": "local-a", "slots": n}]}, "bench")
        plan = {"store_root": str(root), "dag_id": "bench", "run_id": f"t{n}", "stage": "scan", "parallelism": n,
                "config": cfg.to_json(), "inputs": {}, "upstream_info": {},
                "subtasks": [{"inputs": {}, "input_bytes": 1000} for _ in range(n)],
                "targets": {"local-a": {"kind": "spark_submit", "command": ["true"], "env": {}}}}
        layout = StageLayout(root, "bench", f"t{n}", "scan")
        atomic_write_json(layout.plan, plan)
        now = time.time()
        status = {"pid": sleeper.pid, "pgid": sleeper.pid, "create_time": proc.create_time(), "host": supervised.HOST,
                  "deploying_at": now, "launched_at": now, "alive_at": now, "state": "DEPLOYING"}
        for s in range(n):
            atomic_write_json(layout.claim(s, 0), {"target": "local-a", "node": "local-a", "created_at": now})
            atomic_write_json(layout.status(s, 0), status)
            atomic_write_json(layout.heartbeat(s, 0), {"phase": "RUNNING", "node": "local-a", "at": now})
        cpu0 = time.process_time()
        controller = StageController.open(plan)
        restore_cpu = time.process_time() - cpu0
        # Warm up: one probe rotation (PROBE_PERIOD / check_interval ticks), as a controller that has run a while.
        for _ in range(math.ceil(PROBE_PERIOD / cfg.check_interval)):
            controller.step()
        samples = []
        for i in range(ticks):
            if i % 5 == 0:  # a few attempts heartbeat between ticks, as live ones do
                for s in random.Random(i).sample(range(n), max(1, n // 50)):
                    atomic_write_json(layout.heartbeat(s, 0), {"phase": "RUNNING", "node": "local-a",
                                                                "at": time.time(), "tasks_done": i})
            cpu0 = time.process_time()
            controller.step()
            samples.append(time.process_time() - cpu0)
        assert all(a.live for a in controller.scheduler.all_attempts()), "every attempt must stay live"
        return {"tick_ms_median": statistics.median(samples) * 1000, "tick_ms_max": max(samples) * 1000,
                "restore_s": restore_cpu}
    finally:
        sleeper.kill()
        sleeper.wait()


def main() -> None:
    """Run the three measurements and print them as a table and JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        results = {"source_plan_10000x10000": bench_source_plan(root / "a"),
                   "all_to_all_plan_1000x1000": bench_exchange_plan(root / "b"),
                   "ticks": {n: bench_ticks(root / "c", int(n), args.ticks) for n in args.sizes.split(",")}}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    src, ex = results["source_plan_10000x10000"], results["all_to_all_plan_1000x1000"]
    print(f"plan 10,000 subtasks over 10,000 files: {src['seconds']:.2f} s, plan.json {src['plan_mb']:.2f} MB")
    print(f"plan 1,000 x 1,000 all_to_all:         {ex['seconds']:.2f} s, plan.json {ex['plan_mb']:.2f} MB "
          f"(producer committed.json {ex['committed_mb']:.2f} MB, written in {ex['commit_seconds']:.2f} s)")
    for n, tick in results["ticks"].items():
        print(f"controller tick, {int(n):>6} live attempts: median {tick['tick_ms_median']:.1f} ms CPU, "
              f"max {tick['tick_ms_max']:.1f} ms (restore {tick['restore_s']:.2f} s)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results, indent=1))
    print(f"cpu count {os.cpu_count()}")


if __name__ == "__main__":
    main()
