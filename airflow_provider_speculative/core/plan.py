"""Resolve one stage run's plan: per-subtask inputs, sizes, output partitioning. Pure: I/O is done by the caller."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import (
    ExchangeSpec,
    PipelineGraph,
    SourceSpec,
    split_files,
    subpartition_range,
)

PLAN_VERSION = 1


def plan_stage(
    graph: PipelineGraph,
    stage_name: str,
    config: SpeculativeConfig,
    *,
    source_files: dict[str, list[tuple[str, int]]],
    upstream_committed: dict[str, dict[str, Any]],
    sink: dict[str, Any] | None,
    speculation_blocker: str | None,
    context: dict[str, Any],
) -> dict[str, Any]:
    """Build plan.json for one stage run.

    ``source_files`` maps input name -> listed (path, size) files of that source;
    ``upstream_committed`` maps upstream stage -> its committed.json record.
    ``context`` carries dag_id, run_id, logical_date, store_root, application and the targets' launch
    templates (``hooks/targets.py``).
    """
    stage = graph.stages[stage_name]
    n = stage.parallelism
    subtasks: list[dict[str, Any]] = [{"inputs": {}, "input_bytes": 0} for _ in range(n)]
    for input_name, spec in stage.inputs.items():
        if isinstance(spec, SourceSpec):
            files = source_files[input_name]
            if not files:
                raise FileNotFoundError(f"stage {stage_name!r} input {input_name!r}: no files under {spec.path}")
            for i, split in enumerate(split_files(files, n)):
                subtasks[i]["inputs"][input_name] = {
                    "kind": "source", "format": spec.format, "schema_file": files[0][0],
                    "files": [{"path": p, "size": s} for p, s in split]}
                subtasks[i]["input_bytes"] += sum(s for _, s in split)
        else:
            _plan_exchange(stage_name, input_name, spec, n, graph, upstream_committed[spec.upstream], subtasks)
    key = graph.output_key(stage_name)
    plan = {
        "version": PLAN_VERSION,
        "pipeline": graph.name,
        "stage": stage_name,
        "parallelism": n,
        "max_parallelism": stage.max_parallelism,
        "deterministic": stage.deterministic,
        "application_args": list(stage.application_args),
        "upstreams": graph.upstreams(stage_name),
        "upstream_info": {name: {"parallelism": graph.stages[name].parallelism,
                                 "max_parallelism": graph.stages[name].max_parallelism,
                                 "deterministic": graph.stages[name].deterministic}
                          for name in graph.upstreams(stage_name)},
        "consumers": sorted({c for c, _, _ in graph.consumers(stage_name)}),
        "output": {"key": list(key), "max_parallelism": stage.max_parallelism, "sink": sink},
        "subtasks": subtasks,
        "config": config.to_json(),
        "speculation_blocker": speculation_blocker,
        **context,
    }
    plan["fingerprint"] = fingerprint(plan)
    return plan


def _plan_exchange(stage_name: str, input_name: str, spec: ExchangeSpec, n: int, graph: PipelineGraph,
                   committed: dict[str, Any], subtasks: list[dict[str, Any]]) -> None:
    producer = graph.stages[spec.upstream]
    parts = committed["subtasks"]
    if len(parts) != producer.parallelism:
        raise ValueError(f"stage {stage_name!r} input {input_name!r}: upstream {spec.upstream!r} committed "
                         f"{len(parts)} of {producer.parallelism} subtasks")
    schema = next((p.get("schema") for p in parts.values() if p.get("schema")), None)
    for i in range(n):
        if spec.distribution == "pointwise":
            chosen = {i: parts[str(i)]}
            wanted = None
        else:
            chosen = {int(k): v for k, v in parts.items()}
            wanted = set(subpartition_range(i, n, producer.max_parallelism))
        entry_parts = []
        for producer_index, part in sorted(chosen.items()):
            files = [f for f in part["files"] if wanted is None or f.get("subpartition") in wanted]
            entry_parts.append({"subtask": producer_index, "attempt": part["attempt"], "data": part["data"],
                                "files": files})
            subtasks[i]["input_bytes"] += sum(f["size"] for f in files)
        subtasks[i]["inputs"][input_name] = {
            "kind": "exchange", "upstream": spec.upstream, "distribution": spec.distribution, "mode": spec.mode,
            # The plan that produced the committed result: it changes when the producer was replanned (its
            # sources changed), and so must this consumer's fingerprint then, or its old result is reused.
            "upstream_fingerprint": committed.get("fingerprint"),
            "schema": schema, "parts": entry_parts}


def fingerprint(plan: dict[str, Any]) -> str:
    """Hash of what logically determines a stage run's output; attempts of an equal plan can be reused.

    Exchange inputs count by producer subtask and the producer's plan fingerprint, not by which attempt
    produced them: a partition re-produced by failover (same producer plan) does not make the consumers'
    finished results stale by itself (whether it does is the producer's ``deterministic`` flag, applied by
    the failover rules), but a producer replanned on other inputs does.
    """
    subtasks = []
    for spec in plan["subtasks"]:
        inputs = {}
        for name, entry in spec["inputs"].items():
            if entry["kind"] == "exchange":
                inputs[name] = [entry["upstream"], entry["distribution"], [p["subtask"] for p in entry["parts"]],
                                entry.get("upstream_fingerprint")]
            else:
                inputs[name] = entry["files"]
        subtasks.append(inputs)
    relevant = {k: plan.get(k) for k in ("stage", "parallelism", "max_parallelism", "application",
                                         "application_args", "output", "logical_date")}
    relevant["subtasks"] = subtasks
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]
