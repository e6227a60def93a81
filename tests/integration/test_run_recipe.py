"""`make run`: a user's own DAG, from its own folder, on the embedded default, as the README tells it.

The DAG file is written here the way a user would write it (absolute paths to their application and
data, no test helper imported); `make run` starts the local Spark Connect pool, runs it with
`airflow dags test`, prints its status and stops the pool. The committed result is checked against DuckDB.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.conftest import DATA, REPO
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.processes import free_port

pytestmark = [pytest.mark.timeout(900)]

USER_DAG = '''
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

with DAG(dag_id="my_daily_q1", schedule="@daily", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
         catchup=False), Pipeline("my_daily_q1", spark_conf={{"spark.sql.shuffle.partitions": "4"}}) as pipeline:
    scan = pipeline.stage("scan", application="{apps}/q1_scan.py", parallelism=2,
                          inputs={{"lineitem": parquet_source("{data}")}})
    pipeline.stage("aggregate", application="{apps}/q1_final.py", parallelism=1,
                   inputs={{"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])}},
                   sink=ParquetSink("{output}/q1/{{{{ ds }}}}"))
'''


def test_make_run_runs_a_users_own_dag_on_the_embedded_default(tmp_path: Path) -> None:
    dags, run, output = tmp_path / "my_dags", tmp_path / "run", tmp_path / "out"
    dags.mkdir()
    (dags / "my_daily_q1.py").write_text(USER_DAG.format(apps=REPO / "dags" / "apps", data=DATA, output=output))
    # Only what a user's shell has: no test session's Airflow home, store or connections leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPECULATIVE_"))}
    # One warm-up round, not four (WARM_UP_ROUNDS, as a user may set it): the pool serves the run either way.
    env.update(RUN=str(run), DEMO_CONNECT_PORT=str(free_port()), DEMO_CONNECT_UI_PORT=str(free_port()),
               WARM_UP_ROUNDS="1")
    result = subprocess.run(["make", "-s", "run", f"DAGS={dags}", "DAG=my_daily_q1", "RUN_DATE=2026-01-05"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "DAG my_daily_q1 run " in result.stdout and "scan" in result.stdout
    assert_q1_equal(read_q1_output(output / "q1" / "2026-01-05"), duckdb_q1(DATA))
    # The pool it started is gone again, and the home it leaves is usable by hand (env.sh).
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(run) in " ".join(p.info["cmdline"] or [])]
    assert f"AIRFLOW_HOME={run / 'airflow'}" in (run / "env.sh").read_text().replace("'", "")

    usage = subprocess.run(["make", "-s", "run", "DAG=my_daily_q1"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
    assert usage.returncode != 0 and "usage: make run DAGS=" in usage.stderr
    # RUN pointing at a directory `make run` did not make: nothing in it is deleted.
    mine = tmp_path / "my_project"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = subprocess.run(["make", "-s", "run", f"DAGS={dags}", "DAG=my_daily_q1", f"RUN={mine}"], cwd=REPO,
                             env={**env, "RUN": str(mine)}, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "was not made by `make run`" in refused.stderr
    assert (mine / "notes.txt").read_text() == "mine"
