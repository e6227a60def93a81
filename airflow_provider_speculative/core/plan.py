"""Resolve one stage run's plan: per-subtask inputs, sizes, output partitioning. Pure: I/O is done by the caller."""

from __future__ import annotations

import hashlib
import json
from itertools import accumulate
from typing import Any

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import (
    ExchangeSpec,
    PipelineGraph,
    SourceSpec,
    split_files,
    subpartition_range,
)
from airflow_provider_speculative.exceptions import PlanError

# 2: exchanges by producer and subpartition range; shared input descriptions under plan["inputs"].
PLAN_VERSION = 2


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

    Exchanges are described by producer range and subpartition range only: an attempt resolves its
    files from the producers' commits when it starts, so a plan stays O(subtasks + source files)
    however many files the producers wrote.
    """
    stage = graph.stages[stage_name]
    n = stage.parallelism
    subtasks: list[dict[str, Any]] = [{"inputs": {}, "input_bytes": 0} for _ in range(n)]
    inputs: dict[str, dict[str, Any]] = {}
    for input_name, spec in stage.inputs.items():
        if isinstance(spec, SourceSpec):
            files = source_files[input_name]
            if not files:
                raise PlanError(f"pipeline {graph.name!r}, stage {stage_name!r}, input {input_name!r}: "
                                f"no files under {spec.path}")
            inputs[input_name] = {"kind": "source", "format": spec.format, "path": spec.path,
                                  "schema_file": files[0][0]}
            for i, split in enumerate(split_files(files, n)):
                subtasks[i]["inputs"][input_name] = {"files": [{"path": p, "size": s} for p, s in split]}
                subtasks[i]["input_bytes"] += sum(s for _, s in split)
        else:
            inputs[input_name] = _plan_exchange(graph, stage_name, input_name, spec, n,
                                                upstream_committed[spec.upstream], subtasks)
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
        "inputs": inputs,
        "subtasks": subtasks,
        "config": config.to_json(),
        "speculation_blocker": speculation_blocker,
        **context,
    }
    plan["fingerprint"] = fingerprint(plan)
    return plan


def _plan_exchange(graph: PipelineGraph, stage_name: str, input_name: str, spec: ExchangeSpec, n: int,
                   committed: dict[str, Any], subtasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The input's shared description; each subtask gets its producer range and subpartition range."""
    producer = graph.stages[spec.upstream]
    parts = committed["subtasks"]
    if len(parts) != producer.parallelism:
        raise PlanError(f"pipeline {graph.name!r}, stage {stage_name!r}, input {input_name!r}: upstream "
                        f"{spec.upstream!r} committed {len(parts)} of {producer.parallelism} subtasks")
    schema = next((p.get("schema") for p in parts.values() if p.get("schema")), None)
    if spec.distribution == "pointwise":
        for i in range(n):
            subtasks[i]["inputs"][input_name] = {"producers": [i, i + 1], "subpartitions": None}
            part = parts[str(i)]
            subtasks[i]["input_bytes"] += int(part["bytes"]) if part.get("bytes") is not None else sum(
                int(f["size"]) for f in part.get("files") or [])
    else:
        # Bytes per subpartition over all producers, then one prefix sum: O(producers x subpartitions + n).
        per_sp = [0] * producer.max_parallelism
        for part in parts.values():
            for sp, size in subpartition_bytes(part).items():
                per_sp[sp] += size
        prefix = list(accumulate(per_sp, initial=0))
        for i in range(n):
            sp_range = subpartition_range(i, n, producer.max_parallelism)
            subtasks[i]["inputs"][input_name] = {"producers": [0, producer.parallelism],
                                                 "subpartitions": [sp_range.start, sp_range.stop]}
            subtasks[i]["input_bytes"] += prefix[sp_range.stop] - prefix[sp_range.start]
    return {"kind": "exchange", "upstream": spec.upstream, "distribution": spec.distribution, "mode": spec.mode,
            "producer_parallelism": producer.parallelism, "max_parallelism": producer.max_parallelism,
            # The plan that produced the committed result: it changes when the producer was replanned (its
            # sources changed), and so must this consumer's fingerprint then, or its old result is reused.
            "upstream_fingerprint": committed.get("fingerprint"), "schema": schema}


def subpartition_bytes(part: dict[str, Any]) -> dict[int, int]:
    """Bytes per subpartition of one committed producer subtask (compact record or full file list)."""
    if "subpartition_bytes" in part:
        return {int(sp): int(size) for sp, size in part["subpartition_bytes"].items()}
    out: dict[int, int] = {}
    for f in part.get("files") or []:
        if f.get("subpartition") is not None:
            out[int(f["subpartition"])] = out.get(int(f["subpartition"]), 0) + int(f["size"])
    return out


def fingerprint(plan: dict[str, Any]) -> str:
    """Hash of what logically determines a stage run's output; attempts of an equal plan can be reused.

    Exchange inputs count by producer range, subpartition range and the producer's plan fingerprint,
    not by which attempt produced them: a partition re-produced by failover (same producer plan) does
    not make the consumers' finished results stale by itself (whether it does is the producer's
    ``deterministic`` flag, applied by the failover rules), but a producer replanned on other inputs does.
    """
    digest = hashlib.sha256()
    relevant = {k: plan.get(k) for k in ("stage", "parallelism", "max_parallelism", "application",
                                         "application_args", "output", "logical_date")}
    relevant["inputs"] = {name: {k: v for k, v in entry.items() if k != "schema"}
                          for name, entry in (plan.get("inputs") or {}).items()}
    digest.update(json.dumps(relevant, sort_keys=True, default=str).encode())
    for spec in plan["subtasks"]:
        digest.update(json.dumps(spec["inputs"], sort_keys=True).encode())
    return digest.hexdigest()[:16]
