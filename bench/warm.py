"""Benchmark: what does running TPC-H Q1 through the provider cost over one plain spark-submit?

Side by side, in one go (issue 12, item 7):

  a  one plain ``spark-submit`` of the whole query (bench/plain_q1.py, master local[2])
  b  the example pipeline (dags/tpch_q1.py) through the provider, spark-submit targets
     (every attempt its own driver JVM)
  c  the same pipeline through the provider, Spark Connect targets (clients of a pool of
     warm Connect servers started beforehand by control/localcluster.py; its start-up is
     reported but not counted: the pool is long-lived)

b and c run with ``airflow dags test`` in their own fresh AIRFLOW_HOME and store; speculation is off
(this measures overhead, not speculation). Both use 2 cores of Spark task slots in total: b two
targets x 1 slot of ``local[1]`` drivers, c two ``local[1]`` servers x 2 slots. Every output must equal
a's (and the independent Q1 of bench/speculation.py), else the command exits 1.

It prints the wall times, b/a and c/a, and a breakdown of b and c from the store: planning (Airflow
start, DAG parse and the operator's planning before the first stage's plan is written), attempt
start-up (``startup_seconds``: launch to a ready Spark session), Spark work (ready to end of the
admitted attempts), commit (finalize), and the Airflow overhead left (wall minus stage spans and commits).

    .venv/bin/python bench/warm.py [--repeat N] [--scenarios a,b,c] [--base-port 15120]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import speculation as shared  # noqa: E402  (bench/speculation.py: output readers and the reference Q1)

from airflow_provider_speculative.control.localcluster import (  # noqa: E402
    LocalCluster,
    connection_definitions,
    spark_submit,
)

DATE = "2026-01-01"
STAGES = ("scan", "aggregate")
GOAL_C_OVER_A = 2.0
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
SUBMIT_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}


def base_env(run_dir: Path, data: Path) -> dict[str, str]:
    """What b and c share: a fresh Airflow home, store and output; speculation off."""
    env = shared.example_env(run_dir, data)
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "AIRFLOW__SPECULATIVE__ENABLED": "false",
        "AIRFLOW__SPECULATIVE__CHECK_INTERVAL": "500ms",
    })
    return env


def run_plain(run_dir: Path, data: Path) -> dict[str, Any]:
    """Scenario a: one spark-submit of the whole query."""
    run_dir.mkdir(parents=True)
    out = run_dir / "output" / "tpch_q1" / DATE
    conf = [arg for k, v in {**SUBMIT_CONF, **SHUFFLE}.items() for arg in ("--conf", f"{k}={v}")]
    cmd = [spark_submit(), "--master", "local[2]", *conf, str(HERE / "plain_q1.py"), str(data), str(out)]
    started = time.time()
    with open(run_dir / "spark-submit.log", "wb") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"plain spark-submit failed ({code}); see {run_dir / 'spark-submit.log'}")
    return {"wall": round(wall, 2)}


def run_pipeline(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Scenarios b and c: ``airflow dags test`` of the example, then its breakdown from the store."""
    run_dir.mkdir(parents=True)
    (run_dir / "env.json").write_text(json.dumps({k: v for k, v in env.items()
                                                  if k.startswith(("AIRFLOW", "SPECULATIVE_"))}, indent=1))
    airflow = shared.airflow_bin()
    subprocess.run([airflow, "db", "migrate"], env=env, cwd=REPO, check=True, capture_output=True)
    started = time.time()
    with open(run_dir / "dags-test.log", "wb") as log:
        code = subprocess.call([airflow, "dags", "test", "tpch_q1", DATE], env=env, cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT)
    wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"airflow dags test failed ({code}); see {run_dir / 'dags-test.log'}")
    return {"wall": round(wall, 2), **breakdown(Path(env["AIRFLOW__SPECULATIVE__STORE_PATH"]), started, wall)}


def breakdown(store: Path, started: float, wall: float) -> dict[str, Any]:
    """Planning, start-up, Spark work, commit and Airflow overhead of one pipeline run (from the store)."""
    (run,) = [p for p in (store / "tpch_q1").iterdir() if p.is_dir()]
    stages: dict[str, Any] = {}
    previous_end = started
    planning = spans = commits = 0.0
    for stage in STAGES:
        stage_dir = run / stage
        journal = shared._read_jsonl(stage_dir / "journal.jsonl")
        first = {}
        for event in journal:
            first.setdefault(event["event"], event["at"])
        plan_at = (stage_dir / "plan.json").stat().st_mtime
        startups, works = [], []
        for attempt_dir in stage_dir.glob("subtask=*/attempt=*"):
            status = shared._read_json(attempt_dir / "status.json") or {}
            beat = shared._read_json(attempt_dir / "heartbeat.json") or {}
            if status.get("state") != "FINISHED" or not beat.get("session_ready_at"):
                continue
            startups.append(beat["session_ready_at"] - status["launched_at"])
            works.append(status["end_at"] - beat["session_ready_at"])
        span = first["stage_complete"] - first["launch"]
        commit = first.get("finalize_done", first["stage_complete"]) - first["stage_complete"]
        # Up to the plan: Airflow start and DAG parse (first stage) or the hand-over from the previous
        # stage, then the operator's planning; the controller launches right after.
        plan_time = plan_at - previous_end
        stages[stage] = {"planning": round(plan_time, 2), "span": round(span, 2), "commit": round(commit, 2),
                         "attempts": len(startups),
                         "startup_mean": round(statistics.mean(startups), 2) if startups else None,
                         "startup_max": round(max(startups), 2) if startups else None,
                         "work_mean": round(statistics.mean(works), 2) if works else None}
        planning += plan_time
        spans += span
        commits += commit
        previous_end = first.get("finalize_done", first["stage_complete"])
    return {"stages": stages, "planning": round(planning, 2), "stage_spans": round(spans, 2),
            "commit": round(commits, 2), "airflow_overhead": round(wall - spans - commits, 2)}


def main() -> int:
    """Run the scenarios, check the outputs, print the ratios and the breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "tpch" / "lineitem")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--scenarios", default="a,b,c")
    parser.add_argument("--base-port", type=int, default=15120)
    parser.add_argument("--ui-base-port", type=int, default=4120)
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    results_dir = HERE / "results" / f"warm-{dt.datetime.now():%Y%m%d-%H%M%S}"
    results_dir.mkdir(parents=True)
    want = shared.reference_q1(args.data)
    pool = LocalCluster(results_dir / "local-cluster")
    results: list[dict[str, Any]] = []
    try:
        pool_started = None
        if "c" in scenarios:
            t0 = time.time()
            servers, _ = pool.start(servers=2, base_port=args.base_port, ui_base_port=args.ui_base_port, cores=1)
            pool_started = round(time.time() - t0, 2)
            print(f"Connect pool: 2 servers ready in {pool_started}s (not counted in c)")
            conns = {k.replace("LOCAL", "BENCH"): v for k, v in connection_definitions(servers).items()}
        for repeat in range(args.repeat):
            row: dict[str, Any] = {"repeat": repeat}
            for scenario in scenarios:
                run_dir = results_dir / f"r{repeat}-{scenario}"
                if scenario == "a":
                    row["a"] = run_plain(run_dir, args.data)
                else:
                    env = base_env(run_dir, args.data)
                    if scenario == "b":
                        targets = [{"name": n, "conn_id": "spark_default", "slots": 1, "conf": SUBMIT_CONF}
                                   for n in ("local-a", "local-b")]
                    else:
                        env.update(conns)
                        targets = [{"name": n, "conn_id": f"spark_connect_{n.replace('local-', 'bench_')}",
                                    "slots": 2} for n in ("local-a", "local-b")]
                    env["AIRFLOW__SPECULATIVE__TARGETS"] = json.dumps(targets)
                    row[scenario] = run_pipeline(run_dir, env)
                got = shared.read_output(run_dir, DATE)
                problem = shared.same_rows(got, want)
                if problem:
                    raise RuntimeError(f"scenario {scenario} (repeat {repeat}) committed different data: {problem}")
                print(f"  r{repeat} {scenario}: wall {row[scenario]['wall']:.1f}s, output equal to the reference")
            for s in ("b", "c"):
                if "a" in row and s in row:
                    row[f"{s}/a"] = round(row[s]["wall"] / row["a"]["wall"], 2)
            results.append(row)
    finally:
        pool.stop()
    (results_dir / "results.json").write_text(json.dumps({"pool_start": pool_started, "runs": results}, indent=1))
    print(report(results))
    print(f"\nresults: {results_dir / 'results.json'}")
    return 0


def report(results: list[dict[str, Any]]) -> str:
    """Ratios (per repeat and median) and the breakdown of b and c."""
    lines = ["", "wall seconds: " + "; ".join(
        f"r{r['repeat']}: " + ", ".join(f"{s}={r[s]['wall']:.1f}" for s in ("a", "b", "c") if s in r)
        for r in results)]
    for ratio in ("b/a", "c/a"):
        values = [r[ratio] for r in results if ratio in r]
        if values:
            met = "met" if statistics.median(values) <= GOAL_C_OVER_A else "NOT met"
            goal = f" (goal <= {GOAL_C_OVER_A:g}: {met})" if ratio == "c/a" else ""
            lines.append(f"{ratio}: {values}, median {statistics.median(values):.2f}{goal}")
    for s in ("b", "c"):
        for r in results:
            if s not in r:
                continue
            m = r[s]
            lines.append(f"\n{s} r{r['repeat']}: wall {m['wall']:.1f}s = planning {m['planning']:.1f}s + stages "
                         f"{m['stage_spans']:.1f}s + commit {m['commit']:.1f}s + other Airflow overhead "
                         f"{m['airflow_overhead'] - m['planning']:.1f}s")
            for stage, st in m["stages"].items():
                lines.append(f"   {stage:9} planning {st['planning']:5.1f}s  span {st['span']:5.1f}s  "
                             f"{st['attempts']} attempts: start-up mean {st['startup_mean']}s "
                             f"(max {st['startup_max']}s), Spark work mean {st['work_mean']}s  commit {st['commit']}s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
