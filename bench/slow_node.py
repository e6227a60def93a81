"""Benchmark (issue 23, item 6): speculation with default settings on a real slow node, vs plain Spark.

A slow node here is a server whose process tree the kernel limits to SHARE of one CPU (cgroup cpu
quota, or a SIGSTOP duty cycle where cgroups are not writable: tests/slownode.py). Nothing is
injected into any attempt. For each query (``--queries q1,q3``: the examples dags/tpch_q1.py and
dags/tpch_q3.py, built here on the same Pipeline API) it runs, side by side in one command:

  a0  pool of 2 one-core Connect servers, no slow node, speculation off
  a   the same, speculation on (only ``enabled=true``; every other option at its default)
  a1  one of the two servers only (the other left out entirely), speculation on: what a run costs when
      the slow node contributes nothing, which bounds what any placement can reach (see ``compare``)
  b   one server throttled to SHARE, speculation off                 (per share of ``--shares``)
  c   the same throttled server, speculation on (defaults)           (per share)
  d0  plain Spark standalone (master + 2 one-core workers on loopback), bench/plain_q1.py or
      plain_q3.py with ``spark.speculation=true`` at Spark's defaults, no slow node
  d   the same with one worker's process tree (worker JVM + its executors) throttled to SHARE

Provider rows run the stages without Airflow (tests/integration/connect_runner.py: planned level by
level, controllers stepped as the triggerer would) on one warm pool started before the first row.
Plain rows run spark-submit in client mode against a standalone cluster started before the first
plain row; the driver is not throttled (it is not a worker).

Reported per row: makespan (provider: first attempt launch, or the speed check before it, to last
``stage_complete`` in the stages' journals; plain: first job submitted to last job completed in Spark's
event log), wall seconds (the runner call, or the spark-submit process), attempt-seconds, copies
launched, copies that won, wasted attempt-seconds (every attempt or task that was not the one kept),
attempts on the slow node; then the ratios c/a, b/a, c/d, a1/a, c/a1 (median and [min-max] over repeats),
the capacity estimate "c/a best" = a1 / (1 + share) / a, and the false-positive cost of a over a0. Every
committed result is checked against DuckDB (exit 1 if one differs). Results:
bench/results/slow-node-<timestamp>/results.json.

    .venv/bin/python bench/slow_node.py --scale 1 --shares 0.25,0.125 --repeat 3
    .venv/bin/python bench/slow_node.py --scale 0.1 --shares 0.25 --repeat 1     # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import speculation as shared  # noqa: E402  (bench/speculation.py: load sampler, leftover processes)

from airflow_provider_speculative.control.readmodel import run_report  # noqa: E402
from airflow_provider_speculative.core.config import SpeculativeConfig  # noqa: E402
from airflow_provider_speculative.core.graph import PipelineGraph  # noqa: E402
from airflow_provider_speculative.devtools.localcluster import LocalCluster, ServerInfo, free_base_port  # noqa: E402
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, parquet_source  # noqa: E402
from airflow_provider_speculative.store.files import read_json, read_jsonl  # noqa: E402
from airflow_provider_speculative.store.layout import StageLayout  # noqa: E402
from tests import slownode  # noqa: E402
from tests.integration.connect_runner import ConnectPool, committed_table, run_pipeline  # noqa: E402
from tests.integration.q1 import Q1_COLUMNS, compare_q1, duckdb_q1, output_decimal_scales, read_q1_output  # noqa: E402
from tests.integration.q3 import Q3_COLUMNS, duckdb_q3, q3_difference, read_q3_output, sort_q3  # noqa: E402
from tests.integration.standalone_cluster import StandaloneCluster, spark_home  # noqa: E402

APPS = REPO / "dags" / "apps"
ROWS = ("a0", "a", "a1", "b", "c", "c2", "d0", "d")
SLOW_ROWS = ("b", "c", "c2", "d")
WHAT = {
    "a0": "pool, no slow node, speculation off",
    "a": "pool, no slow node, speculation on",
    "a1": "one server of the pool only, speculation on",
    "b": "pool, slow server, speculation off",
    "c": "pool, slow server, speculation on",
    "c2": "pool, slow server, speculation on, the next run: target speeds learned by c (store/speeds.py)",
    "d0": "plain Spark, no slow node, spark.speculation",
    "d": "plain Spark, slow worker, spark.speculation",
}
# The goals (checked at share 1/4; at 1/8 only reported).
GOAL_SHARE = 0.25
GOAL_C_OVER_A = 1.10
GOAL_C_OVER_D = 1.05
GOAL_FALSE_POSITIVE_PCT = 5.0
# Both examples use 4 shuffle partitions (dags/tpch_q*.py); the plain applications get the same so
# that the query plans match. Nothing else of Spark's is changed for the plain rows.
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
PLAIN_CONF = {
    **SHUFFLE,
    "spark.speculation": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The driver runs here in client mode: loopback only, like every JVM the tests start.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # The event log is where copies, winners and task times of a plain run are read from; plain JSON
    # lines in one file (Spark 4 may default to rolling or compressed logs).
    "spark.eventLog.enabled": "true",
    "spark.eventLog.rolling.enabled": "false",
    "spark.eventLog.compress": "false",
}


# ---- the pipelines -------------------------------------------------------------------------------


def q1_graph(tpch: Path) -> PipelineGraph:
    """dags/tpch_q1.py without its sink: scan x8 -> all_to_all -> aggregate x2."""
    pipeline = Pipeline("slow_node_q1", spark_conf=SHUFFLE)
    scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=8,
                          inputs={"lineitem": parquet_source(str(tpch / "lineitem"))})
    pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=2,
                   inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])})
    return pipeline.graph()


def q3_graph(tpch: Path) -> PipelineGraph:
    """dags/tpch_q3.py without its sink: three scans, two joins, top 10 (21 subtasks, five exchanges)."""
    pipeline = Pipeline("slow_node_q3", spark_conf=SHUFFLE)
    customers = pipeline.stage("scan_customer", application=str(APPS / "q3_scan_customer.py"), parallelism=2,
                               max_parallelism=8, inputs={"customer": parquet_source(str(tpch / "customer"))})
    orders = pipeline.stage("scan_orders", application=str(APPS / "q3_scan_orders.py"), parallelism=4,
                            max_parallelism=8, inputs={"orders": parquet_source(str(tpch / "orders"))})
    lineitem = pipeline.stage("scan_lineitem", application=str(APPS / "q3_scan_lineitem.py"), parallelism=8,
                              max_parallelism=8, inputs={"lineitem": parquet_source(str(tpch / "lineitem"))})
    building = pipeline.stage("join_orders", application=str(APPS / "q3_join_orders.py"), parallelism=2,
                              max_parallelism=8, inputs={"customer": all_to_all(customers, key="c_custkey"),
                                                         "orders": all_to_all(orders, key="o_custkey")})
    revenue = pipeline.stage("join_lineitem", application=str(APPS / "q3_join_lineitem.py"), parallelism=4,
                             max_parallelism=8, inputs={"orders": all_to_all(building, key="o_orderkey"),
                                                        "lineitem": all_to_all(lineitem, key="l_orderkey")})
    pipeline.stage("top", application=str(APPS / "q3_top.py"), parallelism=1,
                   inputs={"candidates": all_to_all(revenue, key="l_orderkey")})
    return pipeline.graph()


@dataclass(frozen=True)
class Query:
    """One query: its pipeline, its final stage, its plain application and how its result is checked."""

    name: str
    graph: Callable[[Path], PipelineGraph]
    final_stage: str
    plain: str
    tables: tuple[str, ...]

    def plain_input(self, tpch: Path) -> Path:
        return tpch / "lineitem" if self.name == "q1" else tpch

    def reference(self, tpch: Path) -> Any:
        return duckdb_q1(tpch / "lineitem") if self.name == "q1" else duckdb_q3(tpch)

    def check_rows(self, rows: list[dict[str, Any]], scales: dict[str, int], want: Any) -> str | None:
        """None if ``rows`` (committed or plain output) equal DuckDB's answer, else what differs."""
        if self.name == "q3":
            return q3_difference(sort_q3([{c: r[c] for c in Q3_COLUMNS} for r in rows]), want)
        got: dict[tuple[str, str], dict[str, float]] = {}
        for r in rows:
            key = (r["l_returnflag"], r["l_linestatus"])
            if key in got:
                return f"group {key} committed twice"
            got[key] = {c: float(r[c]) for c in Q1_COLUMNS}
        problems = compare_q1(got, want, scales=scales)
        return "; ".join(problems[:3]) if problems else None

    def check_plain(self, out: Path, want: Any) -> str | None:
        if self.name == "q3":
            return q3_difference(read_q3_output(out), want)
        problems = compare_q1(read_q1_output(out), want, scales=output_decimal_scales(out))
        return "; ".join(problems[:3]) if problems else None


QUERIES = {
    "q1": Query("q1", q1_graph, "aggregate", "plain_q1.py", ("lineitem",)),
    "q3": Query("q3", q3_graph, "top", "plain_q3.py", ("lineitem", "customer", "orders")),
}


class DefaultsPool(ConnectPool):
    """The pool's targets with every speculation option at its default (ConnectPool's config shortens
    check_interval for tests; a benchmark of the defaults must not)."""

    def config(self, **overrides: Any) -> SpeculativeConfig:
        targets = [{"name": s.name, "conn_id": s.conn_id, "slots": self.slots} for s in self.servers]
        return SpeculativeConfig().with_overrides({"targets": targets, **overrides}, "bench")


# ---- measuring one provider row ------------------------------------------------------------------


def provider_metrics(root: Path, graph: PipelineGraph, run_id: str, slow_target: str | None) -> dict[str, Any]:
    """Makespan from the journals, and every attempt's time, copy flag and outcome from the store."""
    launches, completes = [], []
    summaries: dict[str, Any] = {}
    copy_reasons: list[str] = []
    speed_checks: list[dict[str, Any]] = []
    for stage in graph.stages:
        layout = StageLayout(root, graph.name, run_id, stage)
        for event in read_jsonl(layout.journal):
            if event.get("event") == "launch":
                launches.append(event["at"])
                if event.get("speculative") and event.get("reason"):
                    copy_reasons.append(f"{stage}/{event.get('subtask')}: {event['reason']}")
            elif event.get("event") == "stage_complete":
                completes.append(event["at"])
            elif event.get("event") == "speed_check":
                # The check delays the first wave: the makespan starts with it.
                launches.append(event["started"])
                speed_checks.append({"stage": stage, **{k: event.get(k) for k in ("waited", "seconds", "slowness")}})
        summary = read_json(layout.summary) or {}
        summaries[stage] = {k: summary.get(k) for k in ("baseline_source", "baseline_floor_source",
                                                         "baseline_seconds", "numSlowExecutionVertices",
                                                         "numEffectiveSpeculativeExecutions", "blocked_nodes")}
    report = run_report(root, graph.name, run_id)
    attempts = [{**a, "stage": s["stage"], "subtask": sub["subtask"]}
                for s in report["stages"] for sub in s["subtasks"] for a in sub["attempts"]]
    timed = [a for a in attempts if a["start"] is not None and a["end"] is not None]
    seconds = [max(0.0, a["end"] - a["start"]) for a in timed]
    copies = [a for a in attempts if a["speculative"]]
    return {
        "makespan": round(max(completes) - min(launches), 2) if launches and completes else None,
        "attempts": len(attempts),
        "attempt_seconds": round(sum(seconds), 2),
        "copies": len(copies),
        "copies_won": sum(a["admitted"] for a in copies),
        # The losers: copies that lost and originals a copy beat (cancelled or discarded); their work is thrown away.
        "wasted_seconds": round(sum(s for a, s in zip(timed, seconds, strict=True) if not a["admitted"]), 2),
        "copy_seconds": round(sum(s for a, s in zip(timed, seconds, strict=True) if a["speculative"]), 2),
        "on_slow": sum(a["target"] == slow_target for a in attempts) if slow_target else None,
        # Attempts that started but recorded no end are left out of the seconds above (none so far).
        "unended": sum(a["start"] is not None and a["end"] is None for a in attempts),
        "copy_reasons": copy_reasons[:6],
        "speed_checks": speed_checks,
        "stages": summaries,
    }


def run_provider(pool: DefaultsPool, query: Query, tpch: Path, row_dir: Path, *, speculation: bool,
                 slow: ServerInfo | None, share: float | None, want: Any, timeout: float,
                 history_from: Path | None = None) -> dict[str, Any]:
    """One pipeline run on the pool, the slow server (if any) throttled for exactly its duration.

    ``history_from``: a previous row's directory whose store's target speed records (and only those)
    this run starts with, as the next daily run on the same store would.
    """
    root = (row_dir / "store").resolve()
    root.mkdir(parents=True)
    if history_from is not None:
        for record in sorted((history_from / "store" / "_targets").glob("*/speed.json")):
            copy = root / "_targets" / record.parent.name / "speed.json"
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record, copy)
    graph = query.graph(tpch)
    run_id = row_dir.name
    throttle_ctx = contextlib.nullcontext(None)
    if slow is not None:
        proc = LocalCluster.process(slow)
        if proc is None:
            raise RuntimeError(f"Connect server {slow.name} is not running; see {slow.log}")
        throttle_ctx = slownode.throttle(proc.pid, share)
    with throttle_ctx as held, shared.LoadSampler(str(row_dir.parent)) as sampler:
        started = time.time()
        run_pipeline(pool, graph, root, run_id, timeout=timeout, enabled=speculation)
        wall = time.time() - started
    result = {"wall": round(wall, 2), "load": sampler.summary(), "throttle": held.method if held else None,
              **provider_metrics(root, graph, run_id, slow.name if slow else None)}
    table = committed_table(root, graph.name, run_id, query.final_stage)
    scales = {f.name: f.type.scale for f in table.schema if hasattr(f.type, "scale")}
    result["check"] = query.check_rows(table.to_pylist(), scales, want)
    return result


# ---- measuring one plain Spark row ---------------------------------------------------------------


def event_log_metrics(log_dir: Path, slow_host: str | None) -> dict[str, Any]:
    """Makespan (jobs), task-seconds, speculative copies and winners from a Spark event log."""
    events: list[dict[str, Any]] = []
    for path in sorted(p for p in log_dir.rglob("*") if p.is_file()):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    jobs_start = [e["Submission Time"] for e in events if e.get("Event") == "SparkListenerJobStart"]
    jobs_end = [e["Completion Time"] for e in events if e.get("Event") == "SparkListenerJobEnd"]
    last = max([e.get("Timestamp") or 0 for e in events] + jobs_end + [0])
    # From TaskStart, not TaskEnd: a loser Spark kills when its other attempt succeeds may never get a
    # TaskEnd in the log (the application can end first), but it ran and it ran on some host.
    tasks: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("Event") not in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
            continue
        info = e["Task Info"]
        task = tasks.setdefault(info["Task ID"], {
            "key": (e["Stage ID"], e["Stage Attempt ID"], info["Index"]), "speculative": bool(info.get("Speculative")),
            "host": info.get("Host"), "launch": info["Launch Time"], "finish": None, "ok": False})
        if e["Event"] == "SparkListenerTaskEnd":
            task["finish"] = info["Finish Time"] or None
            task["ok"] = (e.get("Task End Reason") or {}).get("Reason") == "Success"
    # A task's winner: its first attempt to succeed; every other attempt of it (killed, failed, a late
    # duplicate success) is wasted work.
    winners: dict[tuple[int, int, int], dict[str, Any]] = {}
    for task in sorted((t for t in tasks.values() if t["ok"]), key=lambda t: t["finish"]):
        winners.setdefault(task["key"], task)
    for task in tasks.values():
        if task["finish"] is None:  # killed without a logged end: it ran until its winner finished
            winner = winners.get(task["key"])
            task["finish"] = winner["finish"] if winner else last
        task["seconds"] = max(0.0, (task["finish"] - task["launch"]) / 1000)
        task["kept"] = winners.get(task["key"]) is task
    copies = [t for t in tasks.values() if t["speculative"]]
    return {
        "makespan": round((max(jobs_end) - min(jobs_start)) / 1000, 2) if jobs_start and jobs_end else None,
        "attempts": len(tasks),
        "attempt_seconds": round(sum(t["seconds"] for t in tasks.values()), 2),
        "copies": len(copies),
        "copies_won": sum(t["kept"] for t in copies),
        "wasted_seconds": round(sum(t["seconds"] for t in tasks.values() if not t["kept"]), 2),
        "copy_seconds": round(sum(t["seconds"] for t in copies), 2),
        "on_slow": sum(t["host"] == slow_host for t in tasks.values()) if slow_host else None,
        "tasks_per_host": {h: sum(t["host"] == h for t in tasks.values())
                           for h in sorted({t["host"] for t in tasks.values()})},
    }


def run_plain(cluster: StandaloneCluster, query: Query, tpch: Path, row_dir: Path, *, slow: str | None,
              share: float | None, want: Any, timeout: float) -> dict[str, Any]:
    """One spark-submit of the plain query on the standalone cluster, the slow worker throttled meanwhile."""
    log_dir = (row_dir / "eventlog").resolve()
    log_dir.mkdir(parents=True)
    out = (row_dir / "output").resolve()
    conf = {**PLAIN_CONF, "spark.eventLog.dir": log_dir.as_uri()}
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url,
           *[arg for k, v in conf.items() for arg in ("--conf", f"{k}={v}")],
           str(HERE / query.plain), str(query.plain_input(tpch)), str(out)]
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable}
    throttle_ctx = contextlib.nullcontext(None)
    if slow is not None:
        worker = cluster.workers[slow].proc
        if worker is None or worker.poll() is not None:
            raise RuntimeError(f"standalone worker {slow} is not running; see {cluster.workers[slow].log}")
        # spark-class execs the JVM, so this pid is the worker's; executors it starts are its children and
        # inherit its cgroup (the duty-cycle fallback walks the tree every period).
        throttle_ctx = slownode.throttle(worker.pid, share)
    with throttle_ctx as held, shared.LoadSampler(str(row_dir.parent)) as sampler, \
            open(row_dir / "spark-submit.log", "wb") as log:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=REPO, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:  # timed out or interrupted: the driver is ours to stop
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"spark-submit exited {code}; see {row_dir / 'spark-submit.log'}")
    result = {"wall": round(wall, 2), "load": sampler.summary(), "throttle": held.method if held else None,
              **event_log_metrics(log_dir, slow)}
    result["check"] = query.check_plain(out, want)
    return result


# ---- the run -------------------------------------------------------------------------------------


def plan_rows(rows: list[str], shares: list[float]) -> list[tuple[str, float | None]]:
    """One repeat's rows of one query: references first, then per share the three slow rows together
    (b, c and d of one share run back to back, so the machine's state drifts least between them)."""
    plan: list[tuple[str, float | None]] = [(r, None) for r in ("a0", "a", "a1", "d0") if r in rows]
    for share in shares:
        plan += [(r, share) for r in SLOW_ROWS if r in rows]
    return plan


def label(row: str, share: float | None) -> str:
    return row if share is None else f"{row}@{share:g}"


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so every ``finally`` (throttles, servers, cluster) runs on it too."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_leftovers(directory: Path, grace: float = 30.0) -> list[str]:
    """Processes still mentioning ``directory`` (attempts of a run that is over); wait, then kill them by pid."""
    deadline = time.time() + grace
    while (left := shared.leftovers(str(directory))) and time.time() < deadline:
        time.sleep(1)
    names = []
    for proc in left:
        with contextlib.suppress(Exception):
            names.append(" ".join(proc.cmdline())[:160])
            proc.kill()
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = (args.results / f"slow-node-{stamp}").resolve()
    out.mkdir(parents=True)
    with interrupt_on_sigterm():
        return _run(args, out, stamp)


def _run(args: argparse.Namespace, out: Path, stamp: str) -> int:
    tpch = args.data
    config = {"scale": args.scale, "data": str(tpch), "shares": args.shares, "queries": args.queries,
              "rows": args.rows, "repeat": args.repeat, "throttle_method": slownode.method_available(),
              "pool": {"servers": 2, "cores": 1, "slots": args.slots}, "plain_conf": PLAIN_CONF,
              "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}}
    print(f"results: {out}\ndata: {tpch} (scale {args.scale}); shares {args.shares}; throttle "
          f"{config['throttle_method']}; rows {','.join(args.rows)}", flush=True)
    want = {q: QUERIES[q].reference(tpch) for q in args.queries}
    results: list[dict[str, Any]] = []
    pool_dir = LocalCluster(out / "local-cluster")
    cluster: StandaloneCluster | None = None
    interrupted = False
    try:
        pool = None
        if {"a0", "a", "a1", "b", "c", "c2"} & set(args.rows):
            t0 = time.time()
            base = args.base_port or free_base_port(2)
            ui = args.ui_base_port or free_base_port(2)
            servers, _ = pool_dir.start(servers=2, base_port=base, ui_base_port=ui, cores=1)
            pool = DefaultsPool(tuple(servers), slots=args.slots)
            print(f"Connect pool: {', '.join(s.name for s in servers)} (1 core, {args.slots} slots each) ready in "
                  f"{time.time() - t0:.1f}s (not counted)", flush=True)
        if {"d0", "d"} & set(args.rows):
            t0 = time.time()
            # 2 GiB a worker so that an executor at Spark's default 1 GiB fits with room to spare.
            cluster = StandaloneCluster(out / "standalone", cores=1, memory="2g").start(workers=2)
            print(f"standalone: master {cluster.master_url}, workers {', '.join(cluster.nodes)} ready in "
                  f"{time.time() - t0:.1f}s (not counted)", flush=True)
        for query_name in args.queries:
            query = QUERIES[query_name]
            if pool is not None and args.warmup:
                # One unmeasured run first: the servers' JIT and the page cache then are as warm for a0 as for
                # the rows after it.
                t0 = time.time()
                warm = run_provider(pool, query, tpch, out / f"warmup-{query_name}", speculation=False, slow=None,
                                    share=None, want=want[query_name], timeout=args.timeout)
                stop_leftovers(out / f"warmup-{query_name}")
                print(f"{query_name} warm-up run: {time.time() - t0:.1f}s (not counted), result "
                      f"{'equal to DuckDB' if warm['check'] is None else 'DIFFERENT: ' + warm['check']}", flush=True)
        print(f"rows as they finish:\n{HEADER}", flush=True)
        for repeat in range(1, args.repeat + 1):
            for query_name in args.queries:
                query = QUERIES[query_name]
                for row, share in plan_rows(args.rows, args.shares):
                    row_dir = out / f"r{repeat}-{query_name}-{label(row, share).replace('@', '-')}"
                    row_dir.mkdir()
                    record: dict[str, Any] = {"repeat": repeat, "query": query_name, "row": row, "share": share,
                                              "label": label(row, share), "what": WHAT[row], "dir": str(row_dir)}
                    print(f"[{dt.datetime.now():%H:%M:%S}] r{repeat} {query_name} {record['label']}: "
                          f"{WHAT[row]}{f' (share {share:g})' if share else ''} ...", flush=True)
                    if args.wait_quiet > 0:
                        record["waited_for_quiet"] = shared.wait_quiet(str(out), args.wait_quiet)
                    try:
                        if row in ("d0", "d"):
                            assert cluster is not None
                            record.update(run_plain(cluster, query, tpch, row_dir,
                                                    slow=cluster.nodes[1] if row == "d" else None, share=share,
                                                    want=want[query_name], timeout=args.timeout))
                        else:
                            assert pool is not None
                            previous = (out / f"r{repeat}-{query_name}-{label('c', share).replace('@', '-')}"
                                        if row == "c2" else None)
                            on = DefaultsPool(pool.servers[:1], slots=pool.slots) if row == "a1" else pool
                            record.update(run_provider(on, query, tpch, row_dir,
                                                       speculation=row in ("a", "a1", "c", "c2"),
                                                       slow=pool.servers[1] if row in ("b", "c", "c2") else None,
                                                       share=share, want=want[query_name], timeout=args.timeout,
                                                       history_from=previous))
                        if record["check"] is not None:
                            record["error"] = f"result differs from DuckDB: {record['check']}"
                    except Exception as exc:  # a failed row is reported, and fails the command, but the rest runs
                        record["error"] = f"{type(exc).__name__}: {exc}"
                    left = stop_leftovers(row_dir)
                    if left:
                        record["leaked_processes"] = left
                    results.append(record)
                    print("  " + row_line(record), flush=True)
                    write_results(out, stamp, config, results)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: restoring throttles, stopping servers and the cluster", file=sys.stderr, flush=True)
    finally:
        # Throttles are context managers around each row and are already restored here.
        pool_dir.stop()
        if cluster is not None:
            cluster.stop()
        stop_leftovers(out, grace=5)
    summary = write_results(out, stamp, config, results)
    print()
    print(report(results, summary))
    print(f"\nwritten {out / 'results.json'}")
    errors = [r for r in results if "error" in r]
    return 130 if interrupted else (1 if errors else 0)


# ---- ratios and the report -----------------------------------------------------------------------


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def _median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _spread(values: list[float | None]) -> list[float] | None:
    """[min, max]: three repeats cannot tell 1.10 from 1.25 when a row varies 1.4x between repeats."""
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per query and share: c/a, b/a, c/d (makespan and wall), medians over repeats; per query: a vs a0."""
    ok = [r for r in results if "error" not in r]

    def pick(repeat: int, query: str, row: str, share: float | None) -> dict[str, Any] | None:
        return next((r for r in ok if (r["repeat"], r["query"], r["row"], r["share"]) == (repeat, query, row, share)),
                    None)

    out: dict[str, Any] = {}
    for query in dict.fromkeys(r["query"] for r in results):
        repeats = sorted({r["repeat"] for r in results if r["query"] == query})
        fp = []
        for rep in repeats:
            a0, a = pick(rep, query, "a0", None), pick(rep, query, "a", None)
            if a0 and a:
                extra = a["attempt_seconds"] - a0["attempt_seconds"]
                # What copies cost without a straggler: the attempt-seconds a threw away (losing copies, and
                # originals a copy beat), against a0's total. a - a0 is reported too, but it also holds the
                # run-to-run variation of every attempt, which at these durations is larger than 5%.
                fp.append({"repeat": rep, "copies": a["copies"], "copies_won": a["copies_won"],
                           "copy_seconds": a["copy_seconds"], "wasted_seconds": a["wasted_seconds"],
                           "wasted_pct": round(100 * a["wasted_seconds"] / a0["attempt_seconds"], 1),
                           "extra_attempt_seconds": round(extra, 2),
                           "extra_pct": round(100 * extra / a0["attempt_seconds"], 1),
                           "a_over_a0": _ratio(a["makespan"], a0["makespan"])})
        shares = {}
        for share in sorted({r["share"] for r in results if r["query"] == query and r["share"] is not None},
                            reverse=True):
            per = []
            for rep in repeats:
                a, b, c = pick(rep, query, "a", None), pick(rep, query, "b", share), pick(rep, query, "c", share)
                d0, d = pick(rep, query, "d0", None), pick(rep, query, "d", share)
                row: dict[str, Any] = {"repeat": rep}
                c2, a1 = pick(rep, query, "c2", share), pick(rep, query, "a1", None)
                for key, num, den in (("c/a", c, a), ("b/a", b, a), ("c/d", c, d), ("d/d0", d, d0), ("c2/a", c2, a),
                                      ("c2/d", c2, d), ("a1/a", a1, a), ("c/a1", c, a1)):
                    if num and den:
                        row[key] = _ratio(num["makespan"], den["makespan"])
                        row[f"{key} wall"] = _ratio(num["wall"], den["wall"])
                if a1 and a and a["makespan"]:
                    # What the slow server can add at best: its share of one core on top of the one server of
                    # a1. If a1 were all server CPU, a perfect placement would take a1 / (1 + share); the part
                    # that is not (clients starting, commits) does not shrink, so the true best is above this.
                    row["c/a best"] = round(a1["makespan"] / (1 + share) / a["makespan"], 3)
                per.append(row)
            keys = sorted({k for row in per for k in row if k != "repeat"})
            shares[f"{share:g}"] = {"per_repeat": per,
                                    "median": {k: _median([row.get(k) for row in per]) for k in keys},
                                    "spread": {k: _spread([row.get(k) for row in per]) for k in keys}}
        fp_keys = ("copies", "copies_won", "copy_seconds", "wasted_seconds", "wasted_pct", "extra_attempt_seconds",
                   "extra_pct", "a_over_a0")
        med_fp = {k: _median([f[k] for f in fp]) for k in fp_keys} if fp else {}
        goals = {}
        goal = shares.get(f"{GOAL_SHARE:g}", {}).get("median", {})
        if goal.get("c/a") is not None:
            goals[f"c/a <= {GOAL_C_OVER_A} at share {GOAL_SHARE:g}"] = goal["c/a"] <= GOAL_C_OVER_A
        if goal.get("c/d wall") is not None:
            goals[f"c/d (wall) <= {GOAL_C_OVER_D} at share {GOAL_SHARE:g}"] = goal["c/d wall"] <= GOAL_C_OVER_D
        if med_fp.get("wasted_pct") is not None:
            goals[f"false positives: copies in a waste <= {GOAL_FALSE_POSITIVE_PCT:g}% of a0's attempt-seconds"] = \
                med_fp["wasted_pct"] <= GOAL_FALSE_POSITIVE_PCT
        out[query] = {"false_positives": {"per_repeat": fp, "median": med_fp}, "shares": shares, "goals": goals}
    return out


def write_results(out: Path, stamp: str, config: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    summary = compare(results)
    (out / "results.json").write_text(json.dumps(
        {"started": stamp, "command": [sys.executable, *sys.argv], "config": config, "rows": results,
         "comparison": summary, "errors": [f"{r['label']} r{r['repeat']} {r['query']}: {r['error']}"
                                           for r in results if "error" in r]}, indent=1, default=str))
    return summary


def _f(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


HEADER = (f"{'rep':>3} {'query':5} {'row':9} {'what':44} {'makespan':>8} {'wall':>6} {'att-s':>6} {'att':>4} "
          f"{'copies':>6} {'won':>4} {'wasted':>6} {'on slow':>7} {'result':7} {'load':5}")


def row_line(r: dict[str, Any]) -> str:
    load = r.get("load") or {}
    result = "ERROR" if "error" in r else "ok"
    line = (f"{r['repeat']:>3} {r['query']:5} {r['label']:9} {r['what'][:44]:44} {_f(r.get('makespan')):>8} "
            f"{_f(r.get('wall')):>6} {_f(r.get('attempt_seconds')):>6} {r.get('attempts', '-'):>4} "
            f"{r.get('copies', '-'):>6} {r.get('copies_won', '-'):>4} {_f(r.get('wasted_seconds')):>6} "
            f"{'-' if r.get('on_slow') is None else r['on_slow']:>7} {result:7} "
            f"{'busy' if load.get('contended') else 'quiet':5}")
    return line + (f"\n      {r['error']}" if "error" in r else "")


def report(results: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [HEADER, "-" * len(HEADER), *(row_line(r) for r in results), "",
             "makespan: first attempt launch -> last stage_complete (pool rows), first job submitted -> last job "
             "done (plain rows); wall: the runner call / the spark-submit process; att-s: attempt- (task-) seconds; "
             "wasted: attempt-seconds of every attempt not kept; on slow: attempts (tasks) on the throttled node; "
             "load busy: other processes used the CPUs meanwhile"]
    for query, comp in summary.items():
        lines += ["", f"== {query} =="]
        fp = comp["false_positives"]["median"]
        if fp:
            lines.append(f"false positives (a vs a0, median): {fp['copies']} copies ({fp['copies_won']} won), "
                         f"{fp['copy_seconds']} copy attempt-s, wasted {fp['wasted_seconds']} attempt-s = "
                         f"{fp['wasted_pct']}% of a0's; all attempt-s a - a0 {fp['extra_attempt_seconds']} "
                         f"({fp['extra_pct']}%, includes run-to-run noise); makespan a/a0 {fp['a_over_a0']}")
        for share, values in comp["shares"].items():
            med = values["median"]
            spread = values["spread"]
            lines.append(f"share {share} (median [min-max]): " + ", ".join(
                f"{k} {v}" + (f" [{spread[k][0]}-{spread[k][1]}]" if spread.get(k) else "") for k, v in med.items()))
        for goal, met in comp["goals"].items():
            lines.append(f"goal {goal}: {'met' if met else 'NOT met'}")
    contended = [f"r{r['repeat']} {r['query']} {r['label']}" for r in results if (r.get("load") or {}).get("contended")]
    if contended:
        lines.append(f"\nnote: other processes used the CPUs during {', '.join(contended)}: those numbers are "
                     "contended")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="TPC-H scale factor; data from .data/tpch (0.1) or .data/tpch-sf<scale> (default 1)")
    parser.add_argument("--data", type=Path, default=None, help="TPC-H directory (overrides the one --scale picks)")
    parser.add_argument("--shares", default="0.25,0.125", help="CPU shares of the slow node (default 0.25,0.125)")
    parser.add_argument("--queries", default="q1,q3", help="comma-separated subset of q1,q3 (default both)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--repeat", type=int, default=1, help="repeat every row N times, interleaved (default 1)")
    parser.add_argument("--slots", type=int, default=2, help="slots of each Connect target (default 2, as "
                        "`speculative local-cluster` configures them)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the unmeasured pipeline run per query before the first row")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="before each row wait up to SECONDS for 20 s without foreign CPU use (default 0)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per pipeline level / spark-submit")
    parser.add_argument("--base-port", type=int, default=None, help="first gRPC port of the pool (default: free)")
    parser.add_argument("--ui-base-port", type=int, default=None, help="first Spark UI port of the pool (default: "
                        "free)")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="results root (default bench/results)")
    args = parser.parse_args(argv)
    args.shares = [float(s) for s in args.shares.split(",") if s.strip()]
    if not args.shares or not all(0 < s <= 1 for s in args.shares):
        parser.error("--shares: CPU shares in (0, 1]")
    args.queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.queries or set(args.queries) - set(QUERIES):
        parser.error(f"--queries: choose from {','.join(QUERIES)}")
    if not args.rows or set(args.rows) - set(ROWS):
        parser.error(f"--rows: choose from {','.join(ROWS)}")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    reason = slownode.unavailable_reason()
    if reason and set(args.rows) & set(SLOW_ROWS):
        parser.error(f"cannot throttle a node here: {reason}")
    if args.data is None:
        args.data = REPO / ".data" / ("tpch" if args.scale == 0.1 else f"tpch-sf{args.scale:g}")
    args.data = args.data.resolve()
    missing = [t for q in args.queries for t in QUERIES[q].tables if not any((args.data / t).glob("*.parquet"))]
    if missing:
        relative = os.path.relpath(args.data, REPO)
        parser.error(f"no Parquet files for {sorted(set(missing))} under {args.data}; generate them with "
                     f"`make data-q3 SCALE={args.scale:g} DATA_DIR={relative}`")
    return args


if __name__ == "__main__":
    sys.exit(main())
