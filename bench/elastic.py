"""Benchmark: makespan of one stage when a worker joins mid-run (reactive slots) vs a fixed single worker.

A Spark standalone cluster on loopback (tests/integration/standalone_cluster.py: master on 127.0.0.1,
workers on 127.0.0.2, 127.0.0.3, ...; one core each) runs the Q1 scan stage (``--files`` lineitem
parts, one subtask each) on one reactive target (``"slots": "auto"``: capacity from the master's
``/json/`` every check). Two variants, side by side in one command, each on a fresh cluster:

- ``fixed``: one worker for the whole run (one slot: the subtasks run one after the other);
- ``elastic``: one worker at the start, a second one added as soon as the first attempt is launched;
  the controller sees it at its next check and places attempts there.

Makespan is the stage's wall time (plan written to stage decided), cluster start-up excluded. The
committed partial aggregates of both variants are merged and checked equal to each other and to an
independent Q1 (DuckDB) over the same files. The variants alternate (A B B A ...) over ``--repeat``
runs and the medians are compared. Contention: the 1-minute load average and the number of other
Spark JVMs on the machine are printed before and after each run (others run Spark here too).

Usage: PYTHONPATH=. .venv/bin/python bench/elastic.py [--files 4] [--repeat 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from airflow_provider_speculative.control.runner import plan_local_stage, run_stage
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.store.files import read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import read_committed
from tests.integration.q1 import assert_q1_equal, duckdb_q1
from tests.integration.standalone_cluster import StandaloneCluster
from tests.integration.test_standalone_cluster import APPS, DRIVER_CONF, SHUFFLE, merge_partials

DATA = Path(__file__).resolve().parents[1] / ".data" / "tpch" / "lineitem"


def other_spark_jvms(mine: set[int]) -> int:
    """Java processes running Spark classes that this benchmark did not start (other engineers' work)."""
    count = 0
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if "java" in (proc.info["name"] or "") and "spark" in cmd.lower() and proc.info["pid"] not in mine:
            count += 1
    return count


def descendants() -> set[int]:
    """Pids of every process this benchmark started (clusters, drivers, executors)."""
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def run_variant(name: str, files: Path, work: Path) -> dict[str, Any]:
    """One stage run on a fresh cluster; the elastic variant adds a worker once the first attempt launched."""
    with StandaloneCluster(work / "cluster") as cluster:
        cluster.start(workers=1)
        target = {"name": "cluster", "conn_id": "unused", "slots": "auto", "master_ui": cluster.webui_url,
                  "conf": DRIVER_CONF}
        config = SpeculativeConfig().with_overrides({"check_interval": "0.5s", "targets": [target]}, "bench")
        count = len(list(files.glob("*.parquet")))
        graph = PipelineGraph("elastic", {"scan": StageSpec(
            "scan", str(APPS / "q1_scan.py"), count, {"lineitem": SourceSpec(str(files))}, max_parallelism=8,
            spark_conf=SHUFFLE)})
        root = work / "store"
        layout = StageLayout(root, "elastic", name, "scan")
        added: dict[str, float] = {}
        stop = threading.Event()

        def add_when_launched(started: float) -> None:
            while not stop.is_set():
                if any(e["event"] == "launch" for e in read_jsonl(layout.journal)):
                    cluster.add_worker(wait=False)
                    added["at"] = time.monotonic() - started
                    return
                time.sleep(0.2)

        load_before, others_before = os.getloadavg()[0], other_spark_jvms(descendants())
        plan = plan_local_stage(graph, "scan", root, "elastic", name, config, cluster.master_url)
        started = time.monotonic()
        adder = threading.Thread(target=add_when_launched, args=(started,)) if name == "elastic" else None
        if adder:
            adder.start()
        try:
            controller = run_stage(plan, timeout=1200)
        finally:
            stop.set()
            if adder:
                adder.join()
        makespan = time.monotonic() - started
        load_after, others_after = os.getloadavg()[0], other_spark_jvms(descendants())
        nodes = sorted({a.node or "?" for a in controller.scheduler.all_attempts()})
        committed = read_committed(layout)
        return {"variant": name, "makespan_s": makespan, "worker_added_at_s": added.get("at"),
                "attempts": len(controller.scheduler.all_attempts()), "nodes": nodes,
                "q1": merge_partials(layout, committed),
                "load_before": load_before, "load_after": load_after,
                "other_spark_jvms": [others_before, others_after]}


def main() -> None:
    """Run both variants side by side and print the makespans and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4, help="lineitem parts (= subtasks)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant, alternating")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    order = [n for i in range(args.repeat) for n in (("fixed", "elastic") if i % 2 == 0 else ("elastic", "fixed"))]
    runs: dict[str, list[dict[str, Any]]] = {"fixed": [], "elastic": []}
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        files = Path(tmp) / "lineitem"
        files.mkdir()
        for path in sorted(DATA.glob("*.parquet"))[:args.files]:
            (files / path.name).symlink_to(path)
        reference = duckdb_q1(files)
        for i, name in enumerate(order):
            result = run_variant(name, files, Path(tmp) / f"run{i}-{name}")
            # Exactly Q1, whatever the number of workers.
            assert_q1_equal(result.pop("q1"), reference)
            result["output"] = "equal to DuckDB Q1"
            runs[name].append(result)
            print(f"{name:8s} makespan {result['makespan_s']:.1f} s, attempts {result['attempts']}, nodes "
                  f"{result['nodes']}, worker added at {result['worker_added_at_s']}, load "
                  f"{result['load_before']:.2f}->{result['load_after']:.2f}, other Spark JVMs "
                  f"{result['other_spark_jvms']}", flush=True)
    medians = {name: statistics.median(r["makespan_s"] for r in rs) for name, rs in runs.items()}
    ratio = medians["fixed"] / medians["elastic"]
    print(f"{args.files} subtasks, 1-core workers, {args.repeat} run(s) per variant (order {' '.join(order)}): "
          f"fixed {medians['fixed']:.1f} s, elastic {medians['elastic']:.1f} s, fixed / elastic {ratio:.2f}x; "
          "outputs equal")
    if args.json:
        args.json.write_text(json.dumps({"files": args.files, "runs": runs, "medians": medians, "ratio": ratio},
                                        indent=2))


if __name__ == "__main__":
    main()
