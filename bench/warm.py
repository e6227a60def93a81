"""Benchmark: what does running a pipeline through the provider cost over one plain spark-submit?

Side by side, in one go, for each pipeline of ``--pipelines`` (default ``q1,q3``):

  q1  the example TPC-H Q1 (dags/tpch_q1.py: scan 8 subtasks -> aggregate 2, one all_to_all exchange)
  q3  the join example TPC-H Q3 (dags/tpch_q3.py: three scan stages, two joins, a top-10 stage; 21
      subtasks, five all_to_all exchange edges)
  q9, q10, q18  the other join examples (dags/tpch_q9.py, tpch_q10.py, tpch_q18.py; ``make data-tpch``):
      their plain run is the official query text through Spark SQL (bench/plain_sql.py), their
      reference DuckDB on the same files

and for each of the scenarios:

  a  one plain ``spark-submit`` of the whole query (bench/plain_q1.py, plain_q3.py or plain_sql.py, local[2])
  b  the pipeline through the provider, spark-submit targets (every attempt its own driver JVM)
  c  the pipeline through the provider, Spark Connect targets (clients of a pool of warm Connect
     servers started beforehand by devtools/localcluster.py; its start-up is reported but not
     counted: the pool is long-lived)
  d  as c, but run the way it is deployed: a real Airflow (PostgreSQL, LocalExecutor, api-server,
     scheduler, dag-processor, triggerer; tests/integration/airflow_cluster.py) started beforehand and
     not counted, like the pool. The wall time runs from the REST call that creates the DAG run to the
     run's end date. Independent stages overlap here (``dags test`` runs one task at a time). Stage
     tasks start in the triggerer (``start_in_triggerer``, the default: planned, run and committed
     there, no worker run per stage)
  e  as d, with ``start_in_triggerer=false``: every stage task plans on a worker, defers, and a stage
     with a sink resumes on a worker for finalize after the 6 s guard (triggers/timing.py); the
     behaviour before issue 24, side by side with d
  f  as d, with the api-server connection ``speculative_api`` defined: a sink stage records its asset
     event through the REST API and ends in the triggerer, instead of resuming on a worker to record
     it (docs/running.md, "Asset events without a worker")
  s  as c, with the sources (customer, orders, lineitem) on S3: an S3 endpoint started on loopback
     (devtools/services.py, moto's server by default), the same files uploaded before the runs (not counted), the
     pool started with the s3a jars (`make jars`) and endpoint; planning lists and checks the objects,
     attempts read them through s3a. With s, c runs on the same S3-capable pool, so s/c is the cost
     of the sources being on S3 (docs/store.md, "Sources on S3")
  t  as s, with the store on S3 as well (``store_path = s3://…``, ``experimental_s3_store``): plans,
     exchanges, manifests, journals and commits are objects of the same endpoint; t/c is the cost of
     running on object storage instead of the local file system, t/s the store's share of it

  u  as a (one plain ``spark-submit``), with the sources read from the same S3 endpoint through s3a (the
     s3a jars and endpoint of s and t): what a user who keeps the tables on S3 would run instead of t.
     u/a is what S3 costs plain Spark here, and t/u, beside c/a, whether the provider pays more for S3
     than Spark alone does (the endpoint's CPU is counted for u as for s and t)

  With ``--s3-endpoint seaweedfs``, s and t use SeaweedFS's compiled S3 gateway (`make s3-compiled`)
  instead of moto's Python server, whose own CPU would otherwise dwarf the provider's S3 cost; each row
  records the endpoint as ``s3_endpoint``. With t the pool's warm-up also writes and reads an exchange on
  the S3 store, as ``local-cluster start --s3`` does (``--no-s3-warm-up``: without those rounds).

  z  Airflow's own floor: ``airflow dags test`` of a DAG with one task that does nothing
     (bench/dags/bench_floor.py), in the same environment as c. What c costs beyond it is the
     provider's and Spark's; (c - z)/a is reported beside c/a

b and c run with ``airflow dags test`` in their own fresh AIRFLOW_HOME and store; speculation is off
(this measures overhead, not speculation). Both use 2 cores of Spark task slots in total: b two
targets x 1 slot of ``local[1]`` drivers, c two ``local[1]`` servers x 2 slots. Every output must equal
a's and an independent computation (pyarrow for Q1, DuckDB for the others), else the command exits 1.

It prints the wall times, b/a and c/a, and a breakdown of b and c from the store's journal, in time
order: Airflow start (process start, DAG parse, first task start and its planning up to the first
``plan.json``), hand-over (a stage's end to the next stage's plan: Airflow starting the next task and
its planning), deferral (plan written to the controller's first launch), the stage spans (first
launch to ``stage_complete``; per stage the attempts' start-up = launch to a ready Spark session and
Spark work = ready to end), resume (``stage_complete`` to the resumed task's finalize), commit
(finalize) and exit (last commit to the end of ``airflow dags test``). Each scenario runs under the
contention sampler of speculation.py (foreign CPU use on the machine).

    .venv/bin/python bench/warm.py [--data .data/tpch] [--pipelines q1,q3] [--repeat N] [--scenarios a,b,c,d,e,f,s,t,z]
        [--slot-priority critical_path|fifo] [--exchange-layout auto|partitioned|packed] [--s3-endpoint moto|seaweedfs]
        [--no-s3-warm-up]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import speculation as shared  # noqa: E402  (bench/speculation.py: output readers, reference Q1, load sampler)

from airflow_provider_speculative.cli.local_cluster import server_conf  # noqa: E402
from airflow_provider_speculative.devtools.localcluster import (  # noqa: E402
    LocalCluster,
    LocalClusterError,
    connection_definitions,
    jar_paths,
    s3a_jars,
    spark_submit,
)
from airflow_provider_speculative.devtools.services import S3_KINDS, S3Server, start_s3  # noqa: E402
from airflow_provider_speculative.hooks.objectstore import settings_from_environment, spark_s3_conf  # noqa: E402
from tests.integration.q3 import duckdb_q3, q3_difference, read_q3_output  # noqa: E402
from tests.integration.tpch_sql import QUERIES, duckdb_rows, rows_difference  # noqa: E402

DATE = "2026-01-01"
# The scheduled scenarios' untimed first run (--warm-deployment).
WARM_UP_DATE = "2026-01-02"
GOAL_C_OVER_A = 2.0
GOAL_C_OVER_A_SF1 = 1.3
GOAL_STARTUP = 2.0
GOAL_S_OVER_C = 1.3
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
SUBMIT_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}


@dataclass(frozen=True)
class Bench:
    """One pipeline of the benchmark: its DAG, its plain application and how to check its output."""

    name: str
    dag_id: str
    plain: str

    def plain_args(self, tpch: Path, run_dir: Path) -> list[str]:
        """What the plain application reads: lineitem for Q1, the TPC-H directory for Q3; Q9/Q10/Q18 their SQL."""
        if self.name == "q1":
            return [str(tpch / "lineitem")]
        if self.name in QUERIES:
            query = run_dir / f"{self.name}.sql"
            query.write_text(QUERIES[self.name])
            return [str(query), str(tpch)]
        return [str(tpch)]

    def reference(self, tpch: Path) -> Any:
        """The independent answer (pyarrow + integer arithmetic for Q1, DuckDB for the others)."""
        if self.name == "q1":
            return shared.reference_q1(tpch / "lineitem")
        if self.name in QUERIES:
            return duckdb_rows(QUERIES[self.name], tpch)
        return duckdb_q3(tpch)

    def output(self, run_dir: Path) -> Any:
        """The committed (or plain) output of one scenario."""
        if self.name == "q1":
            return shared.read_output(run_dir, DATE)
        directory = run_dir / "output" / self.dag_id / DATE
        if self.name in QUERIES:
            import pyarrow.parquet as pq

            table = pq.read_table(str(directory))
            return table.column_names, [tuple(row.values()) for row in table.to_pylist()]
        return read_q3_output(directory)

    def difference(self, got: Any, want: Any) -> str | None:
        """None when the rows are exactly equal."""
        if self.name == "q1":
            return shared.same_rows(got, want)
        if self.name in QUERIES:
            return rows_difference(got[0], got[1], want[0], want[1])
        return q3_difference(got, want)


BENCHES = {"q1": Bench("q1", "tpch_q1", "plain_q1.py"), "q3": Bench("q3", "tpch_q3", "plain_q3.py"),
           **{name: Bench(name, f"tpch_{name}", "plain_sql.py") for name in QUERIES}}


def base_env(run_dir: Path, tpch: Path) -> dict[str, str]:
    """What b and c share: a fresh Airflow home, store and output; speculation off."""
    env = shared.example_env(run_dir, tpch / "lineitem")
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "SPECULATIVE_EXAMPLE_TPCH": str(tpch),
        "AIRFLOW__SPECULATIVE__ENABLED": "false",
        "AIRFLOW__SPECULATIVE__CHECK_INTERVAL": "500ms",
    })
    return env


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, all its threads; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of this process's waited-for children and their waited-for descendants."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], run_dir: Path, log_name: str, env: dict[str, str],
          server_pids: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run ``cmd`` under the contention sampler; its wall time, CPU seconds and the sampler's summary.

    ``cpu_process`` is the command's own process tree (the plain JVM for a; ``airflow dags test``, its
    controller and the attempts' Connect clients for b and c), ``cpu_servers`` what the pool's Connect
    servers used meanwhile (they run c's Spark work), ``cpu`` their sum.
    """
    servers_before = sum(process_cpu(pid) for pid in server_pids)
    children_before = children_cpu()
    samples: list[tuple[float, float]] = []  # (time, the servers' CPU so far): per-stage CPU in breakdown()
    done = threading.Event()

    def sample() -> None:
        while True:
            samples.append((time.time(), sum(process_cpu(pid) for pid in server_pids) - servers_before))
            if done.wait(0.25):
                return

    sampler_thread = threading.Thread(target=sample, daemon=True)
    with shared.LoadSampler(str(run_dir)) as sampler, open(run_dir / log_name, "wb") as log:
        started = time.time()
        if server_pids:
            sampler_thread.start()
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        wall = time.time() - started
        done.set()
        if server_pids:
            sampler_thread.join()
    if code != 0:
        raise RuntimeError(f"{cmd[0]} failed ({code}); see {run_dir / log_name}")
    cpu_process = children_cpu() - children_before
    cpu_servers = sum(process_cpu(pid) for pid in server_pids) - servers_before
    return {"wall": round(wall, 2), "started": started, "load": sampler.summary(),
            "cpu_process": round(cpu_process, 1), "cpu_servers": round(cpu_servers, 1),
            "cpu": round(cpu_process + cpu_servers, 1), "cpu_samples": samples}


# Which part of a deployment a process is, by its own or an ancestor's command line (first match wins).
ROLES = (("connect servers", "SparkConnectServer"), ("triggerer", "triggerer"), ("scheduler", "scheduler"),
         ("api-server", "api_server"), ("dag-processor", "dag-processor"), ("postgres", "postgres"))


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """Every process: pid -> (parent pid, command line, CPU seconds of itself and its reaped children)."""
    table: dict[int, tuple[int, str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), cmdline,
                                  sum(int(f) for f in fields[11:15]) / tick)
    return table


def _role(pid: int, table: dict[int, tuple[int, str, float]]) -> str:
    """The role of ``pid``: the first of ROLES its own or an ancestor's command line names, else "other"."""
    seen = 0
    while pid in table and seen < 64:
        parent, cmdline, _ = table[pid]
        for role, marker in ROLES:
            if marker in cmdline:
                return role
        pid, seen = parent, seen + 1
    return "other"


def role_cpu(before: dict[int, tuple[int, str, float]],
             after: dict[int, tuple[int, str, float]]) -> dict[str, float]:
    """CPU seconds each role used between two process tables.

    A process's figure includes its reaped children, so a child that ended in between is counted in its
    parent's end figure, less its own figure at the start: every CPU second is counted once.
    """
    totals: dict[str, float] = {}
    for table, sign in ((after, 1.0), (before, -1.0)):
        for pid, (_, _, cpu) in table.items():
            role = _role(pid, table)
            totals[role] = totals.get(role, 0.0) + sign * cpu
    out = {role: round(cpu, 1) for role, cpu in sorted(totals.items(), key=lambda kv: -kv[1])}
    # The largest processes no role names, so a reader can tell what "other" was.
    others = sorted(((cpu - before.get(pid, (0, "", 0.0))[2], cmd[:80]) for pid, (_, cmd, cpu) in after.items()
                     if _role(pid, after) == "other"), reverse=True)[:3]
    out.update({f"other: {cmd}": round(cpu, 1) for cpu, cmd in others if cpu >= 0.5})
    return out


def cpu_between(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The servers' CPU seconds between two times, interpolated from the samples (None without samples)."""
    if len(samples) < 2:
        return None

    def at(moment: float) -> float:
        for (t0, c0), (t1, c1) in itertools.pairwise(samples):
            if t0 <= moment <= t1:
                return c0 + (c1 - c0) * (moment - t0) / max(t1 - t0, 1e-9)
        return samples[0][1] if moment < samples[0][0] else samples[-1][1]

    return round(at(end) - at(start), 1)


def connect_targets(slots: int) -> list[dict[str, Any]]:
    """c's and d's targets: the pool's two Connect servers, ``slots`` each."""
    return [{"name": n, "conn_id": f"spark_connect_{n.replace('local-', 'bench_')}", "slots": slots}
            for n in ("local-a", "local-b")]


def run_plain(bench: Bench, run_dir: Path, tpch: Path, source: str | None = None,
              extra_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Scenarios a and u: one spark-submit of the whole query (u: ``source``, the tables' S3 URL, read by s3a)."""
    run_dir.mkdir(parents=True)
    out = run_dir / "output" / bench.dag_id / DATE
    conf = [arg for k, v in {**SUBMIT_CONF, **SHUFFLE, **(extra_conf or {})}.items() for arg in ("--conf", f"{k}={v}")]
    args = bench.plain_args(tpch, run_dir)
    if source is not None:
        if bench.name not in ("q1", "q3"):
            raise SystemExit(f"scenario u runs q1 and q3 only, not {bench.name}")
        args = [f"{source}/lineitem"] if bench.name == "q1" else [source]
    cmd = [spark_submit(), "--master", "local[2]", *conf, str(HERE / bench.plain), *args, str(out)]
    result = timed(cmd, run_dir, "spark-submit.log", {**os.environ, "PYSPARK_PYTHON": sys.executable})
    result.pop("started")
    return result


def run_floor(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Scenario z: ``airflow dags test`` of a one-task DAG that does nothing (Airflow's own cost)."""
    run_dir.mkdir(parents=True)
    env = {**env, "AIRFLOW__CORE__DAGS_FOLDER": str(HERE / "dags")}
    airflow = shared.airflow_bin()
    subprocess.run([airflow, "db", "migrate"], env=env, cwd=REPO, check=True, capture_output=True)
    result = timed([airflow, "dags", "test", "bench_floor", DATE], run_dir, "dags-test.log", env)
    for key in ("started", "cpu_samples"):
        result.pop(key)
    return result


def run_pipeline(bench: Bench, run_dir: Path, env: dict[str, str], server_pids: tuple[int, ...] = ()) -> dict[str, Any]:
    """Scenarios b and c: ``airflow dags test`` of the pipeline, then its breakdown from the store."""
    run_dir.mkdir(parents=True)
    (run_dir / "env.json").write_text(json.dumps({k: v for k, v in env.items()
                                                  if k.startswith(("AIRFLOW", "SPECULATIVE_"))}, indent=1))
    airflow = shared.airflow_bin()
    subprocess.run([airflow, "db", "migrate"], env=env, cwd=REPO, check=True, capture_output=True)
    result = timed([airflow, "dags", "test", bench.dag_id, DATE], run_dir, "dags-test.log", env, server_pids)
    started = result.pop("started")
    samples = result.pop("cpu_samples")
    return {**result, **breakdown(env["AIRFLOW__SPECULATIVE__STORE_PATH"], bench.dag_id, started, result["wall"],
                                  samples)}


def run_scheduled(bench: Bench, run_dir: Path, tpch: Path, extra_env: dict[str, str],
                  asset_api: bool = False, warm_deployment: bool = True) -> dict[str, Any]:
    """Scenario d: one DAG run through a real Airflow deployment (started before the clock, stopped after)."""
    from tests.integration.airflow_cluster import AirflowCluster, PostgresDatabase

    run_dir.mkdir(parents=True)
    db = PostgresDatabase()
    db.create()
    env = {k: v for k, v in base_env(run_dir, tpch).items() if k.startswith(("AIRFLOW__SPECULATIVE__", "SPECULATIVE_"))
           and k not in ("AIRFLOW__SPECULATIVE__STORE_PATH", "SPECULATIVE_EXAMPLE_OUTPUT")}
    env.update(extra_env)
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "True"
    deployment = AirflowCluster(run_dir, db.url, dags_folder=REPO / "dags", data=tpch / "lineitem", extra_env=env)
    if asset_api:  # all admins: the credentials are not checked, but the provider needs some
        deployment.env["AIRFLOW_CONN_SPECULATIVE_API"] = json.dumps(
            {"conn_type": "http", "host": deployment.base_url, "login": "bench", "password": "bench"})
    try:
        deployment.migrate()
        deployment.start_all()
        deployment.wait_healthy()
        deployment.wait_dag(bench.dag_id)
        deployment.cli("dags", "unpause", bench.dag_id)
        warm_up = None
        if warm_deployment:
            # A deployment runs for days: its triggerer's one-time set-up (Airflow's in-process execution API,
            # the provider's control plane, the first Connect sessions) is not a DAG run's cost. One run of
            # the same DAG for the next day pays it, untimed beyond its own wall; its speed records are removed
            # so the timed run checks the servers as a daily run (records older than speed_check_age) does.
            warm_up = _scheduled_run(deployment, bench.dag_id, WARM_UP_DATE)
            for record in (deployment.store / "_targets").glob("*/speed.json"):
                record.unlink()
        with shared.LoadSampler(str(run_dir)) as sampler:
            procs_before = _proc_table()
            started = time.time()
            wall = _scheduled_run(deployment, bench.dag_id, DATE)
        roles = role_cpu(procs_before, _proc_table())
        result = {"wall": round(wall, 2), "load": sampler.summary(), "cpu_roles": roles, "warm_up_wall": warm_up}
    except Exception:
        (run_dir / "diagnostics.txt").write_text(deployment.diagnostics())
        raise
    finally:
        deployment.shutdown()
        db.drop()
    return {**result, **breakdown(deployment.store, bench.dag_id, started, result["wall"], run_prefix="manual__")}


def _scheduled_run(deployment: Any, dag_id: str, date: str) -> float:
    """Create one run of ``dag_id`` for ``date`` through the REST API, wait for success; its wall seconds."""
    from tests.integration.airflow_cluster import _parse_time, wait_until

    started = time.time()
    run = deployment.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": f"{date}T00:00:00Z"})
    run_id = run["dag_run_id"]

    def finished() -> dict[str, Any] | None:
        state = deployment.dag_runs(dag_id)[run_id]
        return state if state["state"] in ("success", "failed") else None

    final = wait_until(finished, 1800, f"{dag_id} run {run_id} to finish", interval=0.5)
    if final["state"] != "success":
        raise RuntimeError(f"{dag_id} run {run_id} ended {final['state']}; see {deployment.logs}")
    ended = _parse_time(final.get("end_date"))
    return round((ended.timestamp() if ended else time.time()) - started, 2)


def _first_events(store: Any, stage: str) -> dict[str, float]:
    first: dict[str, float] = {}
    for event in store.read_journal(f"{stage}/journal.jsonl"):
        first.setdefault(event["event"], event["at"])
    return first


def breakdown(root: str | Path, dag: str, started: float, wall: float,
              cpu_samples: list[tuple[float, float]] | None = None, run_prefix: str | None = None) -> dict[str, Any]:
    """Where the wall time of one pipeline run went, from the store (stages in the order they ran).

    ``run_prefix``: the store holds a warm-up run too; the timed one is the last created (its run id
    carries its creation time after the prefix).
    """
    from airflow_provider_speculative.store.roots import open_store

    # Read by name, so that a store on S3 (scenario t) is broken down as a local one is.
    store = open_store(str(root))
    runs = sorted(f"{dag}/{r.rstrip('/')}" for r in store.children(dag)
                  if r.endswith("/") and r.startswith(run_prefix or ""))
    run = runs[-1] if run_prefix else runs[0]
    if not run_prefix and len(runs) != 1:
        raise RuntimeError(f"expected one DAG run of {dag} in {root}, found {len(runs)}")
    rows = []
    for entry in store.children(run):
        stage_name = f"{run}/{entry.rstrip('/')}"
        first = _first_events(store, stage_name) if entry.endswith("/") else {}
        if "plan_decided" in first:  # a stage run (other entries: the run's marker, task records)
            rows.append((stage_name, first))
    rows.sort(key=lambda row: row[1]["plan_decided"])
    stages: dict[str, Any] = {}
    totals = dict.fromkeys(("airflow_start", "handover", "deferral", "stage_spans", "resume", "commit"), 0.0)
    finalized: list[float] = []  # finalize_done of the stages so far (d overlaps independent stages)
    startups_all: list[float] = []
    for stage_name, first in rows:
        planned, launch = first["plan_decided"], first["launch"]
        complete = first["stage_complete"]
        finalize_started = first.get("finalize_started", complete)
        finalize_done = first.get("finalize_done", finalize_started)
        startups, works, ends = [], [], []
        for status_name in store.list_names(stage_name):
            if not status_name.endswith("/status.json") or "/attempt=" not in status_name:
                continue
            status = store.read_json(status_name) or {}
            beat = store.read_json(status_name[:-len("status.json")] + "heartbeat.json") or {}
            if status.get("state") != "FINISHED" or not beat.get("session_ready_at"):
                continue
            startups.append(beat["session_ready_at"] - status["launched_at"])
            works.append(status["end_at"] - beat["session_ready_at"])
            ends.append(status["end_at"])
        startups_all += startups
        # Before the first plan: Airflow's start, DAG parse, the task's start and planning; later ones:
        # the previous task's end, Airflow starting the next task and its planning.
        previous_end = max((end for end in finalized if end <= planned), default=None)
        before = planned - (started if previous_end is None else previous_end)
        totals["airflow_start" if not finalized else "handover"] += before
        totals["deferral"] += launch - planned
        totals["stage_spans"] += complete - launch
        totals["resume"] += finalize_started - complete
        totals["commit"] += finalize_done - finalize_started
        stages[stage_name.rsplit("/", 1)[-1]] = {
            "before": round(before, 2), "deferral": round(launch - planned, 2), "span": round(complete - launch, 2),
            "tail": round(complete - max(ends), 2) if ends else None,
            "resume": round(finalize_started - complete, 2), "commit": round(finalize_done - finalize_started, 2),
            "attempts": len(startups),
            "startup_mean": round(statistics.mean(startups), 2) if startups else None,
            "startup_max": round(max(startups), 2) if startups else None,
            "work_mean": round(statistics.mean(works), 2) if works else None,
            "server_cpu": cpu_between(cpu_samples or [], launch, complete)}
        finalized.append(finalize_done)
    totals["exit"] = started + wall - max(finalized, default=started)
    out = {k: round(v, 2) for k, v in totals.items()}
    out["startup_median"] = round(statistics.median(startups_all), 2) if startups_all else None
    out["startup_max"] = round(max(startups_all), 2) if startups_all else None
    return {**out, "stages": stages}


def main() -> int:
    """Run the scenarios of both pipelines, check the outputs, print the ratios and the breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "tpch",
                        help="TPC-H directory with lineitem/, customer/, orders/ (make data-q3)")
    parser.add_argument("--pipelines", default="q1,q3")
    parser.add_argument("--pool-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the Connect pool's servers (repeatable)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--scenarios", default="a,b,c")
    parser.add_argument("--base-port", type=int, default=15120)
    parser.add_argument("--ui-base-port", type=int, default=4120)
    parser.add_argument("--server-cores", type=int, default=1,
                        help="Spark task threads of each of c's two Connect servers (local[N])")
    parser.add_argument("--slots", type=int, default=2,
                        help="slots (concurrent attempts) of each of c's and d's two Connect targets")
    parser.add_argument("--warm-deployment", action=argparse.BooleanOptionalAction, default=True,
                        help="d, e, f: run the DAG once (untimed, a day later) before the timed run, as a "
                             "deployment that has been up runs it; its wall is reported as warm_up_wall")
    parser.add_argument("--slot-priority", choices=("critical_path", "fifo"), default=None,
                        help="d, e, f: [speculative] slot_priority of the deployment (default: the provider's)")
    parser.add_argument("--exchange-layout", choices=("auto", "partitioned", "packed"), default=None,
                        help="c-f, s, t: [speculative] exchange_layout (default: the provider's)")
    parser.add_argument("--exchange-commit", choices=("auto", "hadoop"), default=None,
                        help="c-f, s, t: [speculative] exchange_commit (default: the provider's)")
    parser.add_argument("--s3-endpoint", choices=S3_KINDS, default="moto",
                        help="s, t: the S3 endpoint (seaweedfs: the compiled one `make s3-compiled` builds)")
    parser.add_argument("--no-s3-warm-up", dest="s3_warm_up", action="store_false",
                        help="t: start the pool without the warm-up's rounds on the S3 store")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    options = {"AIRFLOW__SPECULATIVE__SLOT_PRIORITY": args.slot_priority} if args.slot_priority else {}
    if args.exchange_layout:
        options["AIRFLOW__SPECULATIVE__EXCHANGE_LAYOUT"] = args.exchange_layout
    if args.exchange_commit:
        options["AIRFLOW__SPECULATIVE__EXCHANGE_COMMIT"] = args.exchange_commit
    benches = [BENCHES[name] for name in args.pipelines.split(",")]
    tpch = args.data.resolve()
    results_dir = HERE / "results" / f"warm-{dt.datetime.now():%Y%m%d-%H%M%S}"
    results_dir.mkdir(parents=True)
    want = {bench.name: bench.reference(tpch) for bench in benches}
    pool = LocalCluster(results_dir / "local-cluster")
    results: list[dict[str, Any]] = []
    pool_started = None
    servers: list[Any] = []
    s3: S3Server | None = None
    s3_url = ""
    try:
        pool_conf: dict[str, str] = {}
        if {"s", "t", "u"} & set(scenarios):
            s3, s3_url = start_s3(kind=args.s3_endpoint), "s3://tpch/data"
            s3.create_bucket("tpch")
            s3.create_bucket("tpch-store")
            for table in ("customer", "orders", "lineitem"):
                s3.upload_tree(tpch / table, "tpch", f"data/{table}")
            os.environ.update(s3.environment())  # the pool's servers and the dags-test processes inherit it
            pool_conf = {**spark_s3_conf(settings_from_environment()), "spark.jars": ",".join(jar_paths(s3a_jars()))}
            print(f"S3 endpoint {s3.endpoint_url} ({args.s3_endpoint}): customer, orders, lineitem uploaded to "
                  f"{s3_url}", flush=True)
        try:  # parsed as `local-cluster start --conf` parses its settings
            pool_conf.update(server_conf(args.pool_conf, None, s3=False))
        except LocalClusterError as exc:
            raise SystemExit(f"--pool-conf: {exc}") from exc
        if {"c", "d", "e", "f", "s", "t"} & set(scenarios):
            t0 = time.time()
            # As `local-cluster start --s3` does for a store on S3: the warm-up also writes and reads there.
            warm_up_store = "s3://tpch-store/warm-up" if "t" in scenarios and args.s3_warm_up else None
            servers, _ = pool.start(servers=2, base_port=args.base_port, ui_base_port=args.ui_base_port,
                                      cores=args.server_cores, conf=pool_conf or None, warm_up_store=warm_up_store)
            pool_started = round(time.time() - t0, 2)
            print(f"Connect pool: 2 servers ready in {pool_started}s (not counted in c; warm-up "
                  f"{[s.extra.get('warm_up') for s in servers]}, on the store: "
                  f"{[s.extra.get('warm_up_store_objects') for s in servers]} objects)", flush=True)
            conns = {k.replace("LOCAL", "BENCH"): v for k, v in connection_definitions(servers).items()}
        for repeat in range(args.repeat):
            for bench in benches:
                row: dict[str, Any] = {"repeat": repeat, "pipeline": bench.name, "data": str(tpch)}
                if s3 is not None:
                    row["s3_endpoint"] = args.s3_endpoint
                for scenario in scenarios:
                    run_dir = results_dir / f"r{repeat}-{bench.name}-{scenario}"
                    if scenario == "a":
                        row["a"] = run_plain(bench, run_dir, tpch)
                    elif scenario == "u":
                        assert s3 is not None
                        endpoint_before = process_cpu(s3.proc.pid)
                        row["u"] = run_plain(bench, run_dir, tpch, s3_url, pool_conf)
                        row["u"]["cpu_endpoint"] = round(process_cpu(s3.proc.pid) - endpoint_before, 1)
                    elif scenario == "z":
                        row["z"] = run_floor(run_dir, base_env(run_dir, tpch))
                    elif scenario in ("d", "e", "f"):
                        row[scenario] = run_scheduled(bench, run_dir, tpch, {
                            **conns, "AIRFLOW__SPECULATIVE__TARGETS": json.dumps(connect_targets(args.slots)),
                            "AIRFLOW__SPECULATIVE__START_IN_TRIGGERER": "false" if scenario == "e" else "true",
                            **options},
                            asset_api=scenario == "f", warm_deployment=args.warm_deployment)
                    else:
                        env = {**base_env(run_dir, tpch), **options}
                        if scenario == "b":
                            targets = [{"name": n, "conn_id": "spark_default", "slots": 1, "conf": SUBMIT_CONF}
                                       for n in ("local-a", "local-b")]
                        elif scenario in ("s", "t"):
                            env.update(conns)
                            env.update(SPECULATIVE_EXAMPLE_TPCH=s3_url, SPECULATIVE_EXAMPLE_DATA=f"{s3_url}/lineitem")
                            if scenario == "t":
                                env.update(AIRFLOW__SPECULATIVE__STORE_PATH=f"s3://tpch-store/r{repeat}-{bench.name}",
                                           AIRFLOW__SPECULATIVE__EXPERIMENTAL_S3_STORE="true")
                            targets = connect_targets(args.slots)
                        else:
                            env.update(conns)
                            targets = connect_targets(args.slots)
                        env["AIRFLOW__SPECULATIVE__TARGETS"] = json.dumps(targets)
                        # The S3 endpoint shares the machine's cores: its CPU is part of what s and t cost here.
                        endpoint_before = process_cpu(s3.proc.pid) if s3 is not None else 0.0
                        row[scenario] = run_pipeline(bench, run_dir, env,
                                                     tuple(server.pid for server in servers) if scenario != "b" else ())
                        if s3 is not None:
                            row[scenario]["cpu_endpoint"] = round(process_cpu(s3.proc.pid) - endpoint_before, 1)
                    got = bench.output(run_dir) if scenario != "z" else want[bench.name]
                    problem = bench.difference(got, want[bench.name])
                    if problem:
                        raise RuntimeError(f"{bench.name} scenario {scenario} (repeat {repeat}) has a different "
                                           f"result: {problem}")
                    load = row[scenario]["load"]
                    cpu = row[scenario].get("cpu")
                    print(f"  r{repeat} {bench.name} {scenario}: wall {row[scenario]['wall']:.1f}s"
                          + (f", CPU {cpu}s (process {row[scenario]['cpu_process']}s, Connect servers "
                             f"{row[scenario]['cpu_servers']}s)" if cpu is not None else "")
                          + (f", S3 endpoint CPU {row[scenario]['cpu_endpoint']}s"
                             if scenario in ("s", "t", "u") and "cpu_endpoint" in row[scenario] else "")
                          + (", output equal to the reference" if scenario != "z" else ", no output (floor)")
                          + f"; foreign CPU mean {load.get('foreign_cores_mean')} cores"
                          f"{' (contended)' if load.get('contended') else ''}", flush=True)
                for s in ("b", "c", "d", "e", "f", "s", "t"):
                    if "a" in row and s in row:
                        row[f"{s}/a"] = round(row[s]["wall"] / row["a"]["wall"], 2)
                for s in ("b", "c", "s", "t"):
                    if "a" in row and s in row and row["a"].get("cpu"):
                        row[f"{s}/a cpu"] = round(row[s]["cpu"] / row["a"]["cpu"], 2)
                        row[f"{s}/a spark cpu"] = round(
                            (row[s]["cpu_servers"] or row[s]["cpu_process"]) / row["a"]["cpu"], 2)
                if "a" in row and "c" in row and "z" in row:
                    row["(c-z)/a"] = round((row["c"]["wall"] - row["z"]["wall"]) / row["a"]["wall"], 2)
                if "c" in row and "s" in row:
                    row["s/c"] = round(row["s"]["wall"] / row["c"]["wall"], 2)
                if "c" in row and "t" in row:
                    row["t/c"] = round(row["t"]["wall"] / row["c"]["wall"], 2)
                    if row["c"].get("cpu_servers") and row["t"].get("cpu_servers"):
                        row["t/c servers cpu"] = round(row["t"]["cpu_servers"] / row["c"]["cpu_servers"], 2)
                if "s" in row and "t" in row:
                    row["t/s"] = round(row["t"]["wall"] / row["s"]["wall"], 2)
                if "a" in row and "u" in row:
                    row["u/a"] = round(row["u"]["wall"] / row["a"]["wall"], 2)
                for s in ("s", "t"):
                    if "u" in row and s in row:
                        row[f"{s}/u"] = round(row[s]["wall"] / row["u"]["wall"], 2)
                results.append(row)
                (results_dir / "results.json").write_text(json.dumps(
                    {"pool_start": pool_started, "runs": results}, indent=1, default=str))
    finally:
        pool.stop()
        if s3 is not None:
            # With SPECULATIVE_MOTO_REQUEST_LOG=1 moto logs every request: kept for bench/s3_census.py.
            request_log = s3.directory / "s3.log"
            if os.environ.get("SPECULATIVE_MOTO_REQUEST_LOG") == "1" and request_log.exists():
                shutil.copy(request_log, results_dir / "s3-requests.log")
            s3.stop()
        # Scenario f's PostgreSQL server (tests/services.py starts one per process on first use).
        from tests import services

        services.stop_all()
    print(report(results))
    print(f"\nresults: {results_dir / 'results.json'}")
    return 0


def report(results: list[dict[str, Any]]) -> str:
    """Ratios (per repeat and median) and the breakdown of b and c, per pipeline."""
    lines: list[str] = []
    for name in dict.fromkeys(r["pipeline"] for r in results):
        runs = [r for r in results if r["pipeline"] == name]
        lines += ["", f"== {name} ==", "wall seconds: " + "; ".join(
            f"r{r['repeat']}: " + ", ".join(
                f"{s}={r[s]['wall']:.1f}{'*' if r[s]['load'].get('contended') else ''}"
                for s in ("a", "b", "c", "d", "e", "f", "s", "t", "u", "z") if s in r) for r in runs)
            + "   (* = contended)"]
        for ratio in ("b/a", "c/a", "(c-z)/a", "d/a", "e/a", "f/a", "s/a", "s/c", "c/a cpu", "c/a spark cpu",
                      "s/a cpu", "t/a", "t/c", "t/s", "t/c servers cpu", "u/a", "s/u", "t/u"):
            values = [r[ratio] for r in runs if ratio in r]
            if values:
                goal = (f" (goals: <= {GOAL_C_OVER_A:g} at SF 0.1, <= {GOAL_C_OVER_A_SF1:g} at SF 1)"
                        if ratio in ("c/a", "d/a", "e/a", "f/a") else
                        f" (goal: <= {GOAL_S_OVER_C:g}, sources on S3 vs local)" if ratio == "s/c" else
                        f" (goal: <= {GOAL_S_OVER_C:g}, sources and store on S3 vs local)" if ratio == "t/c" else "")
                lines.append(f"{ratio}: {values}, median {statistics.median(values):.2f}{goal}")
        for s in ("b", "c", "d", "e", "f", "s", "t"):
            for r in runs:
                if s not in r:
                    continue
                m = r[s]
                lines.append(
                    f"\n{s} r{r['repeat']}: wall {m['wall']:.1f}s = Airflow start {m['airflow_start']:.1f}s + "
                    f"hand-over {m['handover']:.1f}s + deferral {m['deferral']:.1f}s + stages {m['stage_spans']:.1f}s"
                    f" + resume {m['resume']:.1f}s + commit {m['commit']:.1f}s + exit {m['exit']:.1f}s; attempt "
                    f"start-up median {m['startup_median']}s, max {m['startup_max']}s"
                    + (f" (goal on a warm target <= {GOAL_STARTUP:g}s)" if s != "b" else ""))
                control = m["handover"] + m["deferral"] + m["resume"] + m["commit"]
                if s in ("d", "e", "f"):
                    lines.append(f"   independent stages overlap: the parts add up to more than the wall; Airflow "
                                 f"from the run's creation to the first plan {m['airflow_start']:.1f}s, from the last "
                                 f"commit to the run's end {m['exit']:.1f}s")
                    if m.get("warm_up_wall") is not None:
                        lines.append("   the deployment's first run of the DAG (untimed warm-up): "
                                     f"{m['warm_up_wall']:.1f}s")
                    if m.get("cpu_roles"):
                        lines.append("   CPU seconds by role, the whole machine from the run's creation to its "
                                     "end: " + ", ".join(f"{k} {v}" for k, v in m["cpu_roles"].items()))
                    lines += _stage_lines(m)
                    continue
                plain = f"; stages alone / a = {m['stage_spans'] / r['a']['wall']:.2f}" if "a" in r else ""
                lines.append(f"   the dags-test process (start + exit) {m['airflow_start'] + m['exit']:.1f}s, stage "
                             f"hand-over/deferral/resume/commit {control:.1f}s, stages {m['stage_spans']:.1f}s{plain}")
                lines += _stage_lines(m)
    return "\n".join(lines)


def _stage_lines(m: dict[str, Any]) -> list[str]:
    lines = []
    for stage, st in m["stages"].items():
        lines.append(f"   {stage:14} before {st['before']:5.1f}s  deferral {st['deferral']:4.1f}s  span "
                     f"{st['span']:5.1f}s (tail {st['tail']}s)  {st['attempts']:2} attempts: start-up "
                     f"mean {st['startup_mean']}s (max {st['startup_max']}s), work mean "
                     f"{st['work_mean']}s  resume {st['resume']}s  commit {st['commit']}s"
                     + (f"  server CPU {st['server_cpu']}s" if st.get("server_cpu") is not None else ""))
    return lines


if __name__ == "__main__":
    sys.exit(main())
