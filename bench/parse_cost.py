"""Benchmark: what parsing the example DAG files costs a real dag-processor, in CPU seconds.

A dag-processor parses every DAG file in a process of its own every ``min_file_process_interval``
(30 s by default), so what the provider imports at parse time is paid per file and per interval, on
the machine that also runs the scheduler and, in small deployments, Spark. This runs ``airflow
dag-processor --num-runs N`` over ``dags/`` on a fresh SQLite home (the metadata database does not
matter for parsing) and reports the CPU seconds of the whole process tree per parse loop, next to a
loop over an empty DAG folder: the difference is what the DAG files cost.

    .venv/bin/python bench/parse_cost.py --runs 3 --repeat 3

Run it from each of two checkouts to compare code; results are printed as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _env(home: Path, dags: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "0",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        # The examples read their data location at parse; nothing is read from it.
        "SPECULATIVE_EXAMPLE_TPCH": str(home / "tpch"), "SPECULATIVE_EXAMPLE_DATA": str(home / "tpch" / "lineitem"),
    })
    return env


def _airflow() -> str:
    return str(Path(sys.executable).with_name("airflow"))


def _loop_cpu(env: dict[str, str], runs: int) -> tuple[float, float]:
    """CPU and wall seconds of one ``airflow dag-processor --num-runs runs`` (its whole process tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    subprocess.run([_airflow(), "dag-processor", "--num-runs", str(runs)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, time.time() - started


def main() -> int:
    """Parse the example DAG folder and an empty one, alternating; print CPU seconds per file and loop."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="parse loops per dag-processor start")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dags", type=Path, default=REPO / "dags")
    args = parser.parse_args()
    files = sorted(p for p in args.dags.glob("*.py"))
    with tempfile.TemporaryDirectory(prefix="parse-cost-") as tmp:
        home = Path(tmp)
        empty = home / "empty-dags"
        empty.mkdir()
        subprocess.run([_airflow(), "db", "migrate"], env=_env(home, empty), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        rows = []
        for repeat in range(args.repeat):
            full, full_wall = _loop_cpu(_env(home, args.dags), args.runs)
            none, none_wall = _loop_cpu(_env(home, empty), args.runs)
            row = {"repeat": repeat, "files": len(files), "runs": args.runs, "cpu": round(full, 2),
                   "cpu_empty": round(none, 2), "wall": round(full_wall, 1), "wall_empty": round(none_wall, 1),
                   "cpu_per_file_parse": round((full - none) / (len(files) * args.runs), 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        print(json.dumps({"median_cpu_per_file_parse": statistics.median(r["cpu_per_file_parse"] for r in rows),
                          "code": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                                                 capture_output=True).stdout.strip()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
