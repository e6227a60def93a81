"""Run a pipeline's stages without Airflow on a pool of Connect servers, and read what they committed.

Used with the session-scoped ``shared_connect_pool`` fixture (tests/integration/conftest.py): stages
are planned level by level (a level's producers are all committed before it is planned, as the
operator plans after its upstream tasks) and each level's stages run together through
devtools/runner.py, as concurrent Airflow tasks would.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.devtools.localcluster import ServerInfo
from airflow_provider_speculative.devtools.runner import plan_connect_stage, run_stages, write_plan
from airflow_provider_speculative.hooks.targets import REMOTE_ENV
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import SUBPARTITION_COLUMN


@dataclass(frozen=True)
class ConnectPool:
    """Running Connect servers, one target each (target name = server name)."""

    servers: tuple[ServerInfo, ...]
    slots: int = 2
    # The s3:// store root the servers' warm-up wrote to and cleaned (devtools/warmup.py), if any.
    warm_up_store: str | None = None

    @property
    def urls(self) -> dict[str, str]:
        """{target name: sc:// URL}."""
        return {s.name: s.url + "/" for s in self.servers}

    def config(self, **overrides: Any) -> SpeculativeConfig:
        """A configuration whose targets are the pool's servers; speculation off unless overridden."""
        # A server on its own host is that node (blocklist, speed history); loopback servers go by name.
        targets = [{"name": s.name, "conn_id": s.conn_id, "slots": self.slots, **({"node": s.node} if s.node else {})}
                   for s in self.servers]
        # A differential test checks results, not speed: no speculative copies competing for 2 cores, and
        # no speed check whose noise on a loaded machine could steer placement (tests that need one ask).
        values = {"enabled": False, "check_interval": "200ms", "speed_check_age": 0, "targets": targets, **overrides}
        return SpeculativeConfig().with_overrides(values, "test")

    def target_env(self) -> dict[str, dict[str, str]]:
        """What run_stages gives each target's attempts: the server to connect to."""
        return {name: {REMOTE_ENV: url} for name, url in self.urls.items()}


def stage_levels(graph: PipelineGraph) -> list[list[str]]:
    """Stages grouped by depth: every producer of a stage is in an earlier level."""
    depth: dict[str, int] = {}
    for name in graph.topological_order():
        depth[name] = 1 + max((depth[u] for u in graph.upstreams(name)), default=-1)
    levels: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name, level in depth.items():
        levels[level].append(name)
    return levels


def run_pipeline(pool: ConnectPool, graph: PipelineGraph, root: Path | StoreBackend, run_id: str,
                 timeout: float = 300.0, **config: Any) -> None:
    """Plan and run every stage of ``graph`` on the pool (dag id = pipeline name); raise if one fails.

    Planning errors (PlanError) propagate from the stage that raised them, as the operator would fail
    that stage's task.
    """
    for level in stage_levels(graph):
        plans = []
        for stage in level:
            stage_config = pool.config(**{**graph.config, **config, **graph.stages[stage].config})
            plan = plan_connect_stage(graph, stage, root, graph.name, run_id, stage_config)
            write_plan(plan)
            plans.append(plan)
        run_stages(plans, target_env=pool.target_env(), timeout=timeout)


def committed_table(root: Path | StoreBackend, dag_id: str, run_id: str, stage: str) -> pa.Table:
    """Every row a stage committed (its admitted attempts' manifest files), as one Arrow table; read by name."""
    layout = StageLayout.at(root, dag_id, run_id, stage)
    store = layout.store
    committed = store.read_json(layout.name(layout.committed))
    if committed is None:
        raise AssertionError(f"stage {stage!r} has no committed.json under {layout.store_root}")
    tables = []
    for subtask, part in sorted(committed["subtasks"].items(), key=lambda item: int(item[0])):
        manifest = store.read_json(layout.name(layout.manifest(int(subtask), part["attempt"])))
        data = layout.name(layout.data(int(subtask), part["attempt"]))
        # Read file by file: the exchange's _sp=<p> directories are not a column of the result, nor is a packed
        # file's _sp column.
        for entry in manifest["files"]:
            table = pq.read_table(pa.BufferReader(store.read(f"{data}/{entry['path']}")), partitioning=None)
            tables.append(table.drop_columns([SUBPARTITION_COLUMN]) if SUBPARTITION_COLUMN in table.column_names
                          else table)
    non_empty = [t for t in tables if t.num_rows]
    if not non_empty:
        return tables[0].slice(0, 0) if tables else pa.table({})
    return pa.concat_tables(non_empty, promote_options="default")
