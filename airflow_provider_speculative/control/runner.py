"""Run stages without Airflow: plan, drive the controller to the end and commit (benchmarks, debugging)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.control.controller import StageController, wipe_stage_attempts
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import admitted_results, read_committed, write_committed


def local_spark_submit(master: str = "local[1]") -> list[str]:
    """``spark-submit`` for ``master`` (client mode): the one next to this interpreter if not on PATH."""
    local = Path(sys.executable).parent / "spark-submit"
    return [str(local) if local.exists() else (shutil.which("spark-submit") or "spark-submit"),
            "--master", master, "--conf", "spark.ui.enabled=false"]


def list_parquet(path: str) -> list[tuple[str, int]]:
    """(path, size) of the Parquet files under a directory."""
    return sorted((str(p), p.stat().st_size) for p in Path(path).glob("*.parquet"))


def plan_local_stage(graph: PipelineGraph, stage: str, root: Path, dag_id: str, run_id: str,
                     config: SpeculativeConfig, master: str = "local[1]") -> dict[str, Any]:
    """Plan one stage for spark-submit attempts on ``master`` (sources listed from disk, upstreams committed).

    Each target's ``conf`` is added to its command line, so targets on a cluster master can pin their
    executors to a node (see docs/clusters.md).
    """
    spec = graph.stages[stage]
    sources = {name: list_parquet(src.path) for name, src in spec.inputs.items() if isinstance(src, SourceSpec)}
    upstream = {u: read_committed(StageLayout(root, dag_id, run_id, u)) for u in graph.upstreams(stage)}

    def command(target_conf: dict[str, str]) -> list[str]:
        conf = {**target_conf, **spec.spark_conf}
        return [*local_spark_submit(master), *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
                spec.application]

    targets = {t.name: {"kind": "spark_submit", "conn_id": t.conn_id, "node": t.node_label,
                        "command": command(t.conf), "env": {}, "spark_conf": {}} for t in config.targets}
    return plan_stage(graph, stage, config, source_files=sources, upstream_committed=upstream, sink=None,
                      speculation_blocker=None,
                      context={"dag_id": dag_id, "run_id": run_id, "store_root": str(root), "logical_date": None,
                               "application": spec.application, "targets": targets})


def run_stage(plan: dict[str, Any], timeout: float = 1800.0, fresh: bool = False) -> StageController:
    """Write the plan, step a controller until the stage is decided, commit it; return the controller."""
    layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
    if fresh:
        wipe_stage_attempts(layout)
    atomic_write_json(layout.plan, plan)
    journal.record(layout.journal, "plan_decided", parallelism=plan["parallelism"],
                   decision=plan.get("parallelism_decision"))
    for warning in plan.get("warnings") or []:
        journal.record(layout.journal, "plan_warning", message=warning)
    controller = StageController(plan)
    deadline = time.monotonic() + timeout
    while not controller.done:
        if time.monotonic() > deadline:
            controller.kill_all("standalone run timed out")
            raise TimeoutError(f"stage {plan['stage']!r} did not finish within {timeout}s")
        controller.step()
        time.sleep(controller.config.check_interval)  # the controller's own cadence, as in the trigger
    payload = controller.event_payload()
    if payload["status"] != "success":
        raise RuntimeError(f"stage {plan['stage']!r} failed: {payload['reason']}")
    write_committed(layout, admitted_results(layout, {int(k): v for k, v in payload["admitted"].items()}))
    return controller
