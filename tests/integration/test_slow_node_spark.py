"""Speculation on a real slow node with default settings: a Connect server throttled by the kernel.

One server of the shared pool has its process tree limited to 1/8 of a CPU (cgroup cpu quota, or a
SIGSTOP duty cycle where cgroups are not writable: tests/slownode.py); nothing is injected into any
attempt. TPC-H Q1 runs with ``enabled=true`` and every other option at its default; the tests assert
on the stages' events, not on time, and the result equals DuckDB's:

- without the speed check (``speed_check_age=0``, as for targets the check cannot ask: the first wave
  knows nothing of the slow server), a speculative copy of an attempt on the throttled server is
  launched on the fast one, says why, and is the attempt committed;
- with it (the default), the check calls the throttled server slow before anything is placed, and
  the first wave gives it fewer originals than the fast one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.core.speed import CHECK_SLOW_FACTOR
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, parquet_source
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests import slownode
from tests.integration.connect_runner import ConnectPool, committed_table, run_pipeline
from tests.integration.q1 import assert_q1_equal, duckdb_q1

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

APPS = Path(__file__).resolve().parents[2] / "dags" / "apps"
SHARE = 1 / 8


def _q1_graph(data: Path, **config: object):
    pipeline = Pipeline("slow_node_q1", config={"enabled": True, **config},
                        spark_conf={"spark.sql.shuffle.partitions": "4"})
    scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=8,
                          inputs={"lineitem": parquet_source(str(data))})
    pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                   inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])})
    return pipeline.graph()  # the stage graph only: no Airflow tasks, the runner plays their part


@pytest.mark.skipif(slownode.unavailable_reason() is not None, reason=str(slownode.unavailable_reason()))
def test_copy_on_the_fast_server_beats_a_throttled_server_with_default_detection(
        shared_connect_pool: ConnectPool, tpch_data: Path, tmp_path: Path) -> None:
    fast, slow = run_throttled(shared_connect_pool, tpch_data, tmp_path, speed_check_age=0)

    report = run_report(tmp_path, "slow_node_q1", "run1")
    scan = next(s for s in report["stages"] if s["stage"] == "scan")
    copies = [a for sub in scan["subtasks"] for a in sub["attempts"] if a["speculative"]]
    winners = [a for a in copies if a["admitted"]]
    assert copies, f"no speculative copy launched; attempts: {scan['subtasks']}"
    assert all(a["target"] == fast.name for a in copies)
    assert winners, f"no copy won: {copies}"
    # Every copy beat an original on the throttled server, which was cancelled or discarded.
    for copy in winners:
        sub = next(s for s in scan["subtasks"] if copy in s["attempts"])
        originals = [a for a in sub["attempts"] if not a["speculative"]]
        assert [a["target"] for a in originals] == [slow.name]
        assert all(not a["admitted"] for a in originals)

    layout = StageLayout(tmp_path, "slow_node_q1", "run1", "scan")
    journal = read_jsonl(layout.journal)
    launches = [e for e in journal if e.get("event") == "launch" and e.get("speculative")]
    assert launches and all("speculative copy of a slow attempt: " in (e.get("reason") or "") for e in launches)
    summary = read_json(layout.summary)
    # The defaults decided it: the derived floor, from this run's attempts (no fixed 60 s bound).
    assert summary["baseline_floor_source"] == "startup"
    assert summary["baseline_source"] in ("early", "run")
    assert summary["numEffectiveSpeculativeExecutions"] >= 1

    assert_result(tmp_path, tpch_data)


@pytest.mark.skipif(slownode.unavailable_reason() is not None, reason=str(slownode.unavailable_reason()))
def test_the_speed_check_keeps_the_first_wave_off_a_throttled_server(
        shared_connect_pool: ConnectPool, tpch_data: Path, tmp_path: Path) -> None:
    fast, slow = run_throttled(shared_connect_pool, tpch_data, tmp_path, speed_check_age="1h")

    journal = read_jsonl(StageLayout(tmp_path, "slow_node_q1", "run1", "scan").journal)
    checks = [e for e in journal if e.get("event") == "speed_check"]
    assert len(checks) == 1, journal[:5]
    assert checks[0]["slowness"][slow.name] >= CHECK_SLOW_FACTOR and checks[0]["slowness"][fast.name] == 1.0, checks
    # The check came before the first launch. The first wave (originals launched before the first
    # admission) gave the throttled server no more originals than the fast one, and the originals held
    # for the fast server say the check is why.
    launches = [e for e in journal if e.get("event") == "launch"]
    first_admit = min(e["at"] for e in journal if e.get("event") == "admit")
    assert checks[0]["started"] <= launches[0]["at"]
    first_wave = [e for e in launches if e["at"] < first_admit and not e.get("speculative")]
    on_slow = sum(e.get("target") == slow.name for e in first_wave)
    assert on_slow <= sum(e.get("target") == fast.name for e in first_wave), first_wave
    assert any("slower, speed check" in (e.get("reason") or "") for e in launches), [e.get("reason") for e in launches]
    # The aggregate stage needed no check of its own: the scan's record is this run's.
    aggregate = read_jsonl(StageLayout(tmp_path, "slow_node_q1", "run1", "aggregate").journal)
    assert not [e for e in aggregate if e.get("event") == "speed_check"]
    assert_result(tmp_path, tpch_data)


def assert_result(tmp_path: Path, tpch_data: Path) -> None:
    """The committed Q1 equals DuckDB's on the same data."""
    result = committed_table(tmp_path, "slow_node_q1", "run1", "aggregate").to_pylist()
    actual = {(r["l_returnflag"], r["l_linestatus"]): {k: float(v) for k, v in r.items()
                                                       if k not in ("l_returnflag", "l_linestatus")}
              for r in result}
    assert_q1_equal(actual, duckdb_q1(tpch_data))


def run_throttled(pool: ConnectPool, data: Path, root: Path, **config: object):
    """Q1 on the pool with its second server throttled to SHARE for the whole run; (fast, slow) servers."""
    fast, slow = pool.servers
    with slownode.throttle(shared_connect_pool_process(slow).pid, SHARE):
        run_pipeline(pool, _q1_graph(data, **config), root, "run1", timeout=400)
    return fast, slow


def shared_connect_pool_process(info):
    """The live server process of a pool member (its tree is what the kernel throttles)."""
    from airflow_provider_speculative.devtools.localcluster import LocalCluster

    proc = LocalCluster.process(info)
    assert proc is not None, f"server {info.name} is not running"
    return proc


def test_a_check_session_the_server_closed_is_replaced_and_the_check_answers(shared_connect_pool: ConnectPool) -> None:
    from airflow_provider_speculative.backends import spark_connect as sc

    url = shared_connect_pool.servers[0].url + "/"
    assert sc.speed_check(url) > 0
    closed = sc._CHECK_SESSIONS[url].session_id
    with sc.ConnectSession(sc.compose_url(url, session_id=closed, user_id=sc.DEFAULT_USER_ID)) as session:
        session.release()  # as the server's idle timeout would
    assert sc.speed_check(url) > 0  # SESSION_CLOSED on the old session, answered in a new one
    assert sc._CHECK_SESSIONS[url].session_id != closed
