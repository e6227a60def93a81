"""Example: downstream of ``tpch_q1``, two ways.

- ``tpch_q1_report`` (``@daily``, like tpch_q1): a deferrable :class:`StageOutputSensor` waits for tpch_q1's
  ``aggregate`` stage to commit for the same logical date (in the triggerer: no worker slot while waiting),
  then a task reads the committed Parquet output and logs its row count and groups.
- ``tpch_q1_on_asset``: scheduled on the asset tpch_q1's ParquetSink publishes (``file://<output>/tpch_q1``);
  it runs after each commit and reads the commit's summary from the asset event's extra.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, task

from airflow_provider_speculative import StageOutputSensor

REPO = Path(__file__).resolve().parent.parent
OUTPUT = os.environ.get("SPECULATIVE_EXAMPLE_OUTPUT", str(REPO / ".demo" / "output"))
Q1_OUTPUT = Asset(uri=Path(OUTPUT, "tpch_q1").as_uri())

with DAG(
    dag_id="tpch_q1_report",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example"],
):
    committed = StageOutputSensor(
        task_id="wait_for_q1",
        external_dag_id="tpch_q1",
        stage="aggregate",
        poke_interval=15,
        deferrable=True,  # wait in the triggerer (unset: [operators] default_deferrable)
        timeout=6 * 3600,
    )

    @task
    def report(found: dict[str, Any]) -> dict[str, Any]:
        """Row count and groups of the committed Q1 result (read from the sink's published directory)."""
        import pyarrow.parquet as pq

        from airflow_provider_speculative.store.files import read_json

        record = read_json(found["committed"])
        path = (record.get("sink") or {}).get("path")
        table = pq.read_table(path)
        groups = sorted(zip(table.column("l_returnflag").to_pylist(), table.column("l_linestatus").to_pylist(),
                            strict=True))
        print(f"tpch_q1 run {found['run_id']}: {table.num_rows} rows at {path}, groups {groups}")
        return {"run_id": found["run_id"], "rows": table.num_rows, "path": path}

    report(committed.output)


with DAG(
    dag_id="tpch_q1_on_asset",
    schedule=[Q1_OUTPUT],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["speculative", "example"],
):

    @task
    def summarize(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Log what each triggering commit says about itself (records, files, speculation)."""
        summaries = []
        for event in triggering_asset_events[Q1_OUTPUT]:
            extra = event.extra
            print(f"{extra.get('dag_id')} {extra.get('run_id')} ({extra.get('logical_date')}): "
                  f"{extra.get('records')} records in {extra.get('files')} files at {extra.get('location')}; "
                  f"{extra.get('numEffectiveSpeculativeExecutions')} effective speculative executions")
            summaries.append(dict(extra))
        return summaries

    summarize()
