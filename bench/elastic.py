"""Benchmark: makespan of one stage when a worker joins mid-run (reactive slots) vs a fixed single worker.

A Spark standalone cluster on loopback (tests/integration/standalone_cluster.py: master on 127.0.0.1,
workers on 127.0.0.2, 127.0.0.3, ...; one core each) runs the Q1 scan stage (``--files`` lineitem
parts, one subtask each) on one reactive target (``"slots": "auto"``: capacity from the master's
``/json/`` every check). Two variants, side by side in one command, each on a fresh cluster:

- ``fixed``: one worker for the whole run (one slot: the subtasks run one after the other);
- ``elastic``: one worker at the start, a second one added as soon as the first attempt is launched;
  the controller sees it at its next check and places attempts there.

The plain alternative a user would run instead, on the same loopback cluster shapes (fresh each):

- ``plain_fixed``: ONE ``spark-submit`` of the whole Q1 (bench/plain_q1.py) on the one-worker cluster;
- ``plain_elastic``: the same, with the second worker added right after spark-submit starts (as early
  as the elastic variant adds it: when its first attempt launches). The standalone master gives a
  running application executors on a worker that joins as long as ``spark.cores.max`` allows: it is
  set to 2, the most the provider may use here (one slot per 1-core worker, two workers at most).

Makespan is the stage's wall time (plan written to stage decided), cluster start-up excluded; the
plain runs' is spark-submit's wall time (its JVM start included, as every attempt's is). The
committed partial aggregates of the provider variants are merged and checked equal to an independent
Q1 (DuckDB) over the same files, and the plain runs' Q1 output to the same and to the provider's. The
variants alternate (A B C D, D C B A, ...) over ``--repeat`` runs and the medians are compared.
Contention: the 1-minute load average and the number of other Spark JVMs on the machine are printed
before and after each run, and bench/speculation.py's sampler records the CPU other processes used
during it (others run Spark here too).

Usage: PYTHONPATH=. .venv/bin/python bench/elastic.py [--files 4] [--repeat 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from speculation import LoadSampler  # noqa: E402  (bench/speculation.py: the contention sampler)

from airflow_provider_speculative.core.config import SpeculativeConfig  # noqa: E402
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec, StageSpec  # noqa: E402
from airflow_provider_speculative.devtools.runner import local_spark_submit, plan_local_stage, run_stage  # noqa: E402
from airflow_provider_speculative.store.files import read_jsonl  # noqa: E402
from airflow_provider_speculative.store.layout import StageLayout  # noqa: E402
from airflow_provider_speculative.store.results import read_committed  # noqa: E402
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output  # noqa: E402
from tests.integration.standalone_cluster import StandaloneCluster  # noqa: E402
from tests.integration.test_standalone_cluster import APPS, DRIVER_CONF, SHUFFLE, merge_partials  # noqa: E402

DATA = HERE.parent / ".data" / "tpch" / "lineitem"
VARIANTS = ("fixed", "elastic", "plain_fixed", "plain_elastic")
# The most cores the provider may use on the elastic cluster (two 1-core workers, one slot each).
PLAIN_CORES_MAX = 2


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


def run_plain_variant(name: str, files: Path, work: Path) -> dict[str, Any]:
    """One spark-submit of Q1 on a fresh one-worker cluster; plain_elastic adds a worker once it started."""
    with StandaloneCluster(work / "cluster") as cluster:
        cluster.start(workers=1)
        out = work / "output"
        conf = {**DRIVER_CONF, **SHUFFLE, "spark.cores.max": str(PLAIN_CORES_MAX),
                "spark.ui.showConsoleProgress": "false"}
        cmd = [*local_spark_submit(cluster.master_url), *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
               str(HERE / "plain_q1.py"), str(files), str(out)]
        load_before, others_before = os.getloadavg()[0], other_spark_jvms(descendants())
        added: dict[str, float] = {}
        with open(work / "spark-submit.log", "wb") as log:
            started = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYSPARK_PYTHON": sys.executable})
            if name == "plain_elastic":
                node = cluster.add_worker(wait=False)
                added["at"] = time.monotonic() - started
            code = proc.wait(timeout=1200)
        makespan = time.monotonic() - started
        load_after, others_after = os.getloadavg()[0], other_spark_jvms(descendants())
        if code != 0:
            raise RuntimeError(f"{name}: spark-submit failed ({code}); see {work / 'spark-submit.log'}")
        # A worker that ran an executor of the application keeps its directory under the worker's work dir.
        nodes = sorted(n for n in cluster.nodes
                       if any((cluster.base_dir / f"worker-{n}" / "work").glob("app-*")))
        if name == "plain_elastic" and node not in nodes:
            print(f"  note: {name}: the application got no executor on the joining worker {node}", flush=True)
        return {"variant": name, "makespan_s": makespan, "worker_added_at_s": added.get("at"),
                "attempts": 1, "nodes": nodes, "q1": read_q1_output(out),
                "load_before": load_before, "load_after": load_after,
                "other_spark_jvms": [others_before, others_after]}


def main() -> None:
    """Run both variants side by side and print the makespans and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4, help="lineitem parts (= subtasks)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant, alternating")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    order = [n for i in range(args.repeat) for n in (VARIANTS if i % 2 == 0 else VARIANTS[::-1])]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        files = Path(tmp) / "lineitem"
        files.mkdir()
        for path in sorted(DATA.glob("*.parquet"))[:args.files]:
            (files / path.name).symlink_to(path)
        reference = duckdb_q1(files)
        outputs: dict[str, Any] = {}
        for i, name in enumerate(order):
            run = run_plain_variant if name.startswith("plain") else run_variant
            with LoadSampler(tmp) as sampler:
                result = run(name, files, Path(tmp) / f"run{i}-{name}")
            result["load"] = sampler.summary()
            # Exactly Q1, whatever the number of workers, and the same through the provider as plain.
            q1 = result.pop("q1")
            assert_q1_equal(q1, reference)
            for other, theirs in outputs.items():
                assert_q1_equal(q1, theirs)  # raises naming the differences
                result.setdefault("equal_to", []).append(other)
            outputs.setdefault(name, q1)
            result["output"] = "equal to DuckDB Q1 and to the other variants'"
            runs[name].append(result)
            print(f"{name:13s} makespan {result['makespan_s']:.1f} s, attempts {result['attempts']}, nodes "
                  f"{result['nodes']}, worker added at {result['worker_added_at_s']}, load "
                  f"{result['load_before']:.2f}->{result['load_after']:.2f}, other Spark JVMs "
                  f"{result['other_spark_jvms']}, foreign cores mean {result['load'].get('foreign_cores_mean')} "
                  f"peak {result['load'].get('foreign_cores_peak')}", flush=True)
    medians = {name: statistics.median(r["makespan_s"] for r in rs) for name, rs in runs.items()}
    ratios = {"fixed/elastic": medians["fixed"] / medians["elastic"],
              "plain_fixed/plain_elastic": medians["plain_fixed"] / medians["plain_elastic"],
              "fixed/plain_fixed": medians["fixed"] / medians["plain_fixed"],
              "elastic/plain_elastic": medians["elastic"] / medians["plain_elastic"]}
    print(f"{args.files} subtasks, 1-core workers, {args.repeat} run(s) per variant (order {' '.join(order)}): "
          + ", ".join(f"{n} {m:.1f} s" for n, m in medians.items()) + "; outputs equal")
    print("ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
          + f" (provider / plain; plain with spark.cores.max={PLAIN_CORES_MAX})")
    contended = [f"{n}" for n, rs in runs.items() for r in rs if r["load"].get("contended")]
    print(f"contended runs (others used > 0.1 core mean or > 0.5 peak): {contended or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"files": args.files, "runs": runs, "medians": medians, "ratios": ratios,
                                         "ratio": ratios["fixed/elastic"]}, indent=2))


if __name__ == "__main__":
    main()
