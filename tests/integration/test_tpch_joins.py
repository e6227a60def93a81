"""The TPC-H join examples (dags/tpch_q10.py, tpch_q18.py, tpch_q9.py) commit exactly DuckDB's answer.

Each DAG file builds its pipeline with a function; the test calls it on a scale factor 0.01 copy of
the tables (8 Parquet parts each, like ``make data-tpch``), runs the stages through devtools/runner.py on
the session's Connect pool, and compares the last stage's committed rows with the official query run
by DuckDB on the same files (exact decimals and dates, in the query's order). A one-subtask stage
joining the 1-file sources nation and region in itself is accepted and equal to DuckDB as well.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative import Pipeline, parquet_source
from airflow_provider_speculative.exceptions import PipelineError
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.integration.connect_runner import ConnectPool, committed_table, run_pipeline
from tests.integration.tpch_sql import Q9_SQL, Q10_SQL, Q18_SQL, TABLES, duckdb_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

DAGS = Path(__file__).resolve().parents[2] / "dags"
APPS = Path(__file__).resolve().parent / "apps"
@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tables Q9, Q10 and Q18 read, and region, at scale factor 0.01: 8 Parquet parts each (nation, region: one)."""
    root = tmp_path_factory.mktemp("tpch-joins-sf0.01")
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", "0.01", "--tables",
                    ",".join(TABLES), "--parts", "8", "--output-dir", str(root)], check=True, capture_output=True)
    return root


def _builder(dag_file: str, function: str) -> Callable[..., Any]:
    """The pipeline-building function of an example DAG file (loading it also builds its DAG)."""
    spec = importlib.util.spec_from_file_location(f"example_{Path(dag_file).stem}", DAGS / dag_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def _run(pool: ConnectPool, tpch: Path, tmp_path: Path, dag_file: str, function: str, final: str,
         sql: str, order: Callable[[tuple], Any]) -> tuple[list[tuple], list[tuple]]:
    """Run the example's pipeline; return (committed rows, DuckDB rows), both in the query's order."""
    graph = _builder(dag_file, function)(str(tpch)).graph()
    root = tmp_path / "store"
    run_pipeline(pool, graph, root, "r1")
    columns, want = duckdb_rows(sql, tpch)
    table = committed_table(root, graph.name, "r1", final)
    assert table.column_names == columns, (table.column_names, columns)
    got = [tuple(row[c] for c in columns) for row in table.to_pylist()]
    return sorted(got, key=order), want


def _copartitioned(root: Path, dag_id: str, stage: str, sides: tuple[str, ...]) -> None:
    """Every input of ``sides`` of every subtask reads the same subpartition range."""
    plan = read_json(StageLayout(root, dag_id, "r1", stage).plan)
    for subtask in plan["subtasks"]:
        assert len({tuple(subtask["inputs"][side]["subpartitions"]) for side in sides}) == 1, (stage, subtask)


def test_q10_equals_duckdb(shared_connect_pool: ConnectPool, tpch: Path, tmp_path: Path) -> None:
    got, want = _run(shared_connect_pool, tpch, tmp_path, "tpch_q10.py", "q10_pipeline", "top", Q10_SQL,
                     lambda r: (-r[2], r[0]))
    assert len(want) == 20 and got == want
    _copartitioned(tmp_path / "store", "tpch_q10", "join_customer", ("revenue", "customer"))
    plan = read_json(StageLayout(tmp_path / "store", "tpch_q10", "r1", "join_customer").plan)
    assert all(s["inputs"]["nation"] == {"broadcast": True} for s in plan["subtasks"])


def test_q18_equals_duckdb(shared_connect_pool: ConnectPool, tpch: Path, tmp_path: Path) -> None:
    got, want = _run(shared_connect_pool, tpch, tmp_path, "tpch_q18.py", "q18_pipeline", "top", Q18_SQL,
                     lambda r: (-r[4], r[3], r[2]))
    assert want and got == want  # 2 orders above 300 units at this scale factor
    _copartitioned(tmp_path / "store", "tpch_q18", "big_orders", ("quantities", "orders"))


def test_q9_equals_duckdb(shared_connect_pool: ConnectPool, tpch: Path, tmp_path: Path) -> None:
    got, want = _run(shared_connect_pool, tpch, tmp_path, "tpch_q9.py", "q9_pipeline", "final", Q9_SQL,
                     lambda r: (r[0], -r[1]))
    assert len(want) > 100 and got == want  # 25 nations x 7 years
    _copartitioned(tmp_path / "store", "tpch_q9", "join_partsupp", ("lineitem", "partsupp"))


def _nation_region(tpch: Path, name: str, parallelism: int) -> Pipeline:
    """One stage joining the two 1-file sources nation and region in itself (no exchange)."""
    p = Pipeline(name, spark_conf={"spark.sql.shuffle.partitions": "2"})
    p.stage("nation_region", application=str(APPS / "join_inputs.py"), parallelism=parallelism,
            inputs={"nation": parquet_source(str(tpch / "nation")), "region": parquet_source(str(tpch / "region"))},
            application_args=[json.dumps({"left": "nation", "right": "region", "left_on": ["n_regionkey"],
                                          "right_on": ["r_regionkey"], "how": "inner", "keep": ["r_name"]})])
    return p


def test_one_subtask_joining_two_one_file_sources_is_accepted_and_equals_duckdb(
        shared_connect_pool: ConnectPool, tpch: Path, tmp_path: Path) -> None:
    # One subtask reads every split input whole, so two sources may meet in it (issue 38's false refusal).
    assert [len(list((tpch / t).glob("*.parquet"))) for t in ("nation", "region")] == [1, 1]
    with pytest.raises(PipelineError, match="split independently"):
        _nation_region(tpch, "nation_region_2", 2).graph()  # two subtasks would see unrelated parts
    graph = _nation_region(tpch, "nation_region", 1).graph()
    run_pipeline(shared_connect_pool, graph, tmp_path / "store", "r1")
    columns, want = duckdb_rows("SELECT n.*, r_name FROM nation AS n JOIN region ON n_regionkey = r_regionkey "
                            "ORDER BY n_nationkey", tpch)
    table = committed_table(tmp_path / "store", "nation_region", "r1", "nation_region")
    assert table.column_names == columns, (table.column_names, columns)
    got = sorted(tuple(row[c] for c in columns) for row in table.to_pylist())
    assert len(want) == 25 and got == want
