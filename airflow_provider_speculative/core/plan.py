"""Resolve one stage run's plan: per-subtask inputs, sizes, output partitioning. Pure: I/O is done by the caller."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, TypedDict, cast

from airflow_provider_speculative.core.config import AUTO, PACKED, SpeculativeConfig
from airflow_provider_speculative.core.copartition import (
    HASH_SCHEME,
    check_key_types,
    check_partitioning,
    check_time_zones,
)
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, split_files
from airflow_provider_speculative.core.parallelism import decide_parallelism, exchange_ranges, skew_message
from airflow_provider_speculative.core.paths import is_object_url
from airflow_provider_speculative.core.priority import priority_slots, stage_priorities
from airflow_provider_speculative.exceptions import PlanError

# 2: exchanges by producer and subpartition range; shared input descriptions under plan["inputs"].
# Broadcast sources (files listed once under plan["inputs"]) and exchanges are additions readers of
# version 2 ignore only if the stage has none, so the version stays.
PLAN_VERSION = 2


class _PlanKeys(TypedDict):
    """The keys every plan of :data:`PLAN_VERSION` has (:class:`StagePlan` adds the optional ones)."""

    version: int
    pipeline: str
    stage: str
    parallelism: int
    max_parallelism: int
    deterministic: bool
    application_args: list[str]
    upstreams: list[str]
    parallelism_decision: dict[str, Any]
    exchange_skew: list[dict[str, Any]]
    warnings: list[str]
    upstream_info: dict[str, dict[str, Any]]
    consumers: list[str]
    output: dict[str, Any]
    inputs: dict[str, dict[str, Any]]
    subtasks: list[dict[str, Any]]
    config: dict[str, Any]
    speculation_blocker: str | None
    fingerprint: str
    # From the planning context (control/planning.py): the DAG run, the store and the targets.
    dag_id: str
    run_id: str
    store_root: str
    logical_date: str | None
    application: str
    targets: dict[str, dict[str, Any]]


class StagePlan(_PlanKeys, total=False):
    """plan.json of one stage run: what :func:`plan_stage` decided; every reader of a plan sees this type.

    Nested entries (inputs, subtasks, output, targets) stay plain JSON objects: their shapes are
    documented in docs/store.md and built in this module only. A plan in a store is read back through
    :func:`load_plan`, which refuses a version this provider does not read. (Optional keys are declared
    with ``total=False``, not ``NotRequired``: under postponed annotations only the former is seen at run time.)
    """

    # The Airflow task try that planned it; absent from plans written before they were recorded.
    try_number: int
    clear_number: int
    # The task instance and its run's run_after (what OpenLineage names a task run by when there is no
    # logical date); absent from older plans.
    task_id: str
    run_after: str | None
    # Every stage of the pipeline -> its slot claim priority (core/priority.py); absent from older plans.
    priorities: dict[str, int]


def load_plan(raw: Any, where: str) -> StagePlan:
    """A plan read from a store, checked to be one this provider reads; raise PlanError naming ``where``.

    A plan of another version is refused, not guessed at: its attempts would read inputs, or the
    controller admit outputs, under rules they were not planned for.
    """
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: not a stage plan (expected a JSON object, got {type(raw).__name__})")
    version = raw.get("version")
    if version != PLAN_VERSION:
        newer = isinstance(version, int) and version > PLAN_VERSION
        raise PlanError(f"{where}: plan version {version!r}, this provider reads version {PLAN_VERSION}; "
                        + ("it was written by a newer provider: upgrade this one, or finish the run with the "
                           "provider that planned it" if newer else
                           "it was written by an older provider: clear the stage's task to plan it again "
                           "(its committed results are reused only if the new plan equals the old one)"))
    missing = sorted(k for k in ("stage", "dag_id", "run_id", "store_root", "parallelism", "subtasks", "config",
                                 "targets", "fingerprint") if k not in raw)
    if missing:
        raise PlanError(f"{where}: plan version {PLAN_VERSION} without {', '.join(missing)}: not written by "
                        "this provider, or damaged")
    return cast(StagePlan, raw)


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
) -> StagePlan:
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
    producers = {spec.upstream: _producer_parallelism(graph, stage_name, input_name, spec.upstream,
                                                      upstream_committed[spec.upstream])
                 for input_name, spec in stage.inputs.items() if isinstance(spec, ExchangeSpec)}
    decision = decide_stage_parallelism(graph, stage_name, config, source_files, upstream_committed, producers)
    n = decision["chosen"]
    where = f"pipeline {graph.name!r}, stage {stage_name!r}"
    check_copartitioned(graph, stage_name, upstream_committed)
    subtasks: list[dict[str, Any]] = [{"inputs": {}, "input_bytes": 0} for _ in range(n)]
    inputs: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for input_name, spec in stage.inputs.items():
        if isinstance(spec, SourceSpec):
            files = source_files[input_name]
            if not files:
                raise PlanError(f"{where}, input {input_name!r}: no files under {spec.path}")
            inputs[input_name] = {"kind": "source", "format": spec.format, "path": spec.path,
                                  "schema_file": files[0][0]}
            if spec.broadcast:
                total = sum(s for _, s in files)
                _check_broadcast_size(where, input_name, total, config)
                # Listed once, not once per subtask: a plan stays O(subtasks + files).
                inputs[input_name].update(broadcast=True, files=[{"path": p, "size": s} for p, s in files])
                for sub in subtasks:
                    sub["inputs"][input_name] = {"broadcast": True}
                    sub["input_bytes"] += total
                continue
            if len(files) < n:
                warnings.append(f"input {input_name!r}: {len(files)} files for {n} subtasks; subtasks "
                                f"{len(files)}..{n - 1} read no file of it (each subtask reads whole files)")
            for i, split in enumerate(split_files(files, n)):
                subtasks[i]["inputs"][input_name] = {"files": [{"path": p, "size": s} for p, s in split]}
                subtasks[i]["input_bytes"] += sum(s for _, s in split)
        else:
            inputs[input_name] = _exchange_entry(graph, spec, upstream_committed[spec.upstream],
                                                 producers[spec.upstream])
            if spec.distribution == "pointwise":
                _plan_pointwise(graph, stage_name, input_name, n, upstream_committed[spec.upstream], subtasks)
            elif spec.distribution == "broadcast":
                parts = upstream_committed[spec.upstream]["subtasks"]
                total = sum(_producer_bytes(part) for part in parts.values())
                _check_broadcast_size(where, input_name, total, config)
                for sub in subtasks:
                    sub["inputs"][input_name] = {"producers": [0, producers[spec.upstream]], "subpartitions": None}
                    sub["input_bytes"] += total
    skew = _plan_all_to_all(graph, stage_name, config, n, upstream_committed, producers, subtasks)
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
        "parallelism_decision": decision,
        "exchange_skew": skew,
        "warnings": [*warnings, *(f"input {e['input']!r}: {skew_message(e)}" for e in skew if e["split"] == 1)],
        "upstream_info": {name: {"parallelism": producers[name],
                                 "max_parallelism": graph.stages[name].max_parallelism,
                                 "deterministic": graph.stages[name].deterministic}
                          for name in graph.upstreams(stage_name)},
        "consumers": sorted({c for c, _, _ in graph.consumers(stage_name)}),
        "output": {"key": list(key), "max_parallelism": stage.max_parallelism, "sink": sink,
                   "commit": config.exchange_commit,
                   **({"hash": HASH_SCHEME, "layout": exchange_layout(config)}
                      if key else {})},
        "inputs": inputs,
        "subtasks": subtasks,
        "config": config.to_json(),
        "speculation_blocker": speculation_blocker,
        "priorities": stage_priorities(graph, priority_slots(config)),
        **context,
    }
    plan["fingerprint"] = fingerprint(plan)
    return cast(StagePlan, plan)


def _check_broadcast_size(where: str, input_name: str, total: int, config: SpeculativeConfig) -> None:
    if total > config.broadcast_max_bytes:
        raise PlanError(f"{where}, input {input_name!r}: broadcast input is {total} bytes, above broadcast_max_bytes "
                        f"({config.broadcast_max_bytes}); every subtask would read all of it. Hash-partition it with "
                        f"all_to_all(..., key=...) instead, or raise broadcast_max_bytes")


def check_copartitioned(graph: PipelineGraph, stage_name: str, upstream_committed: dict[str, Any]) -> None:
    """Refuse all_to_all inputs whose committed results cannot meet key by key (core/copartition.py).

    Hybrid producers have no committed schema yet when the consumer is planned; they are checked from
    what is committed (nothing), and their attempts hash with the same scheme.
    """
    stage = graph.stages[stage_name]
    where = f"pipeline {graph.name!r}, stage {stage_name!r}"
    partitioned = {name: spec for name, spec in stage.inputs.items()
                   if isinstance(spec, ExchangeSpec) and spec.distribution == "all_to_all"}
    if not partitioned:
        return
    counts = {graph.stages[spec.upstream].max_parallelism for spec in partitioned.values()}
    if len(counts) > 1:
        described = ", ".join(f"{name!r} ({graph.stages[spec.upstream].max_parallelism})"
                              for name, spec in partitioned.items())
        raise PlanError(f"{where}: all_to_all inputs are not co-partitioned (subpartitions: {described})")
    parts = {name: list((upstream_committed[spec.upstream].get("subtasks") or {}).values())
             for name, spec in partitioned.items()}
    check_key_types(where, {name: (spec.key, [p.get("schema") for p in parts[name]])
                            for name, spec in partitioned.items()})
    check_time_zones(where, {name: (spec.key, [(p.get("schema"), p.get("partitioning")) for p in parts[name]])
                             for name, spec in partitioned.items()})
    check_partitioning(where, {name: (graph.stages[spec.upstream].max_parallelism,
                                      [p.get("partitioning") for p in parts[name]])
                               for name, spec in partitioned.items()
                               if not upstream_committed[spec.upstream].get("hybrid")})


def _producer_parallelism(graph: PipelineGraph, stage_name: str, input_name: str, upstream: str,
                          committed: dict[str, Any]) -> int:
    """How many subtasks the producer committed: its declared parallelism, or the one decided for 'auto'."""
    producer = graph.stages[upstream]
    count = len(committed["subtasks"])
    expected = committed.get("parallelism", count) if producer.auto else producer.parallelism
    if count != expected or count < 1:
        raise PlanError(f"pipeline {graph.name!r}, stage {stage_name!r}, input {input_name!r}: upstream "
                        f"{upstream!r} committed {count} of {expected} subtasks")
    return count


def _producer_bytes(part: dict[str, Any]) -> int:
    if part.get("bytes") is not None:
        return int(part["bytes"])
    return sum(int(f["size"]) for f in part.get("files") or [])


def decide_stage_parallelism(graph: PipelineGraph, stage_name: str, config: SpeculativeConfig,
                             source_files: dict[str, list[tuple[str, int]]], upstream_committed: dict[str, Any],
                             producers: dict[str, int]) -> dict[str, Any]:
    """The stage's parallelism and why: declared, inherited through a pointwise input, or from bytes."""
    stage = graph.stages[stage_name]
    where = f"pipeline {graph.name!r}, stage {stage_name!r}"
    if not stage.auto:
        return {"mode": "fixed", "chosen": stage.parallelism}
    minimum = stage.min_parallelism or 1
    pointwise = {spec.upstream: producers[spec.upstream] for spec in stage.inputs.values()
                 if isinstance(spec, ExchangeSpec) and spec.distribution == "pointwise"}
    if pointwise:
        counts = set(pointwise.values())
        if len(counts) > 1:
            raise PlanError(f"{where}: pointwise inputs committed different parallelism {pointwise}; "
                            "a pointwise stage needs one")
        chosen = counts.pop()
        if chosen > stage.max_parallelism:
            raise PlanError(f"{where}: inherits parallelism {chosen} through a pointwise input but "
                            f"max_parallelism is {stage.max_parallelism}")
        return {"mode": "auto", "inherited_from": sorted(pointwise), "min": minimum, "max": stage.max_parallelism,
                "chosen": chosen, "bounded_by": "pointwise input"}
    total, bounds, files = 0, {}, None
    for input_name, spec in stage.inputs.items():
        if (isinstance(spec, SourceSpec) and spec.broadcast) or \
                (isinstance(spec, ExchangeSpec) and spec.distribution == "broadcast"):
            continue  # read whole by every subtask: it neither divides nor bounds the work
        if isinstance(spec, SourceSpec):
            listed = source_files[input_name]
            total += sum(size for _, size in listed)
            files = len(listed) if files is None else min(files, len(listed))
            bounds["files"] = files
        else:
            committed = upstream_committed[spec.upstream]
            total += sum(_producer_bytes(part) for part in committed["subtasks"].values())
            subpartitions = graph.stages[spec.upstream].max_parallelism
            bounds[f"subpartitions of {spec.upstream}"] = (
                subpartitions * producers[spec.upstream] if stage.splittable_skew else subpartitions)
    return decide_parallelism(total_bytes=total, per_subtask=config.data_volume_per_subtask, minimum=minimum,
                              maximum=stage.max_parallelism, bounds=bounds, files=files, slots=wave_slots(config))


def wave_slots(config: SpeculativeConfig) -> int | None:
    """The attempts the stage's targets run at once, for ``full_waves``; None when off or not known at plan.

    A reactive target (``"slots": "auto"``) learns its capacity from its master while the stage runs, so
    a plan cannot round to it.
    """
    if not config.full_waves or any(t.auto_slots for t in config.targets):
        return None
    return sum(t.slots for t in config.targets)


def _exchange_entry(graph: PipelineGraph, spec: ExchangeSpec, committed: dict[str, Any],
                    producer_parallelism: int) -> dict[str, Any]:
    """The input's shared description (the same for every consumer subtask)."""
    producer = graph.stages[spec.upstream]
    schema = next((p.get("schema") for p in committed["subtasks"].values() if p.get("schema")), None)
    return {"kind": "exchange", "upstream": spec.upstream, "distribution": spec.distribution, "mode": spec.mode,
            "producer_parallelism": producer_parallelism, "max_parallelism": producer.max_parallelism,
            # The plan that produced the committed result: it changes when the producer was replanned (its
            # sources changed), and so must this consumer's fingerprint then, or its old result is reused.
            "upstream_fingerprint": committed.get("fingerprint"), "schema": schema}


def _plan_pointwise(graph: PipelineGraph, stage_name: str, input_name: str, n: int, committed: dict[str, Any],
                    subtasks: list[dict[str, Any]]) -> None:
    parts = committed["subtasks"]
    if len(parts) != n:
        raise PlanError(f"pipeline {graph.name!r}, stage {stage_name!r}, input {input_name!r}: pointwise input "
                        f"has {len(parts)} producer subtasks for {n} consumers")
    for i in range(n):
        subtasks[i]["inputs"][input_name] = {"producers": [i, i + 1], "subpartitions": None}
        subtasks[i]["input_bytes"] += _producer_bytes(parts[str(i)])


def _plan_all_to_all(graph: PipelineGraph, stage_name: str, config: SpeculativeConfig, n: int,
                     upstream_committed: dict[str, Any], producers: dict[str, int],
                     subtasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every consumer its producer and subpartition range of each all_to_all input; return the skew.

    Inputs with the same number of subpartitions share ranges (a join reads the same keys from both
    sides), balanced on their summed bytes. Cost O(producers x subpartitions + consumers log subpartitions).
    """
    stage = graph.stages[stage_name]
    groups: dict[int, list[tuple[str, ExchangeSpec]]] = {}
    for input_name, spec in stage.inputs.items():
        if isinstance(spec, ExchangeSpec) and spec.distribution == "all_to_all":
            groups.setdefault(graph.stages[spec.upstream].max_parallelism, []).append((input_name, spec))
    skew: list[dict[str, Any]] = []
    for m, members in groups.items():
        matrices = {}
        for input_name, spec in members:
            rows = [[0] * m for _ in range(producers[spec.upstream])]
            for p, part in upstream_committed[spec.upstream]["subtasks"].items():
                for sp, size in subpartition_bytes(part).items():
                    rows[int(p)][sp] += size
            matrices[input_name] = rows
        combined = [row for rows in matrices.values() for row in rows]
        # A hybrid producer has not written its bytes yet when this stage is planned: equal-count ranges.
        hybrid = any(upstream_committed[spec.upstream].get("hybrid") for _, spec in members)
        ranges = exchange_ranges(combined, n, balanced=config.balanced_exchange_ranges and not hybrid,
                                 splittable_skew=stage.splittable_skew and len(members) == 1 and not hybrid)
        for input_name, _spec in members:
            rows = matrices[input_name]
            prefix = list(accumulate((sum(col) for col in zip(*rows, strict=True)), initial=0))
            for i, ((lo, hi), (start, stop)) in enumerate(ranges.reads):
                full = (lo, hi) == (0, len(combined))
                lo, hi = (0, len(rows)) if full else (lo, hi)
                subtasks[i]["inputs"][input_name] = {"producers": [lo, hi], "subpartitions": [start, stop]}
                subtasks[i]["input_bytes"] += (prefix[stop] - prefix[start] if full else
                                               sum(rows[p][sp] for p in range(lo, hi) for sp in range(start, stop)))
        names = ", ".join(name for name, _ in members)
        skew += [{"input": names, **entry} for entry in ranges.skew]
    return skew


def exchange_layout(config: SpeculativeConfig) -> str:
    """The layout a keyed exchange is written in: ``exchange_layout``, with ``auto`` resolved.

    ``auto`` is ``packed`` on every store: fewer objects on an object store, and on a file system a reader of
    part of a packed file checks only its tail and the pages it reads (``store/manifest.py``), so each byte
    read is checked once as with partitioned files.
    """
    return PACKED if config.exchange_layout == AUTO else config.exchange_layout


def file_subpartitions(entry: dict[str, Any]) -> dict[int, int]:
    """Bytes per subpartition of one manifest entry: a partitioned file's one, or a packed file's index.

    A packed file (one per Spark task, rows sorted by subpartition) carries ``subpartitions``: its bytes
    apportioned to each subpartition it holds rows of, by row count. A file of neither kind holds none.
    """
    packed = entry.get("subpartitions")
    if packed is not None:
        return {int(sp): int(size) for sp, size in packed.items()}
    if entry.get("subpartition") is not None:
        return {int(entry["subpartition"]): int(entry["size"])}
    return {}


def is_packed(entry: dict[str, Any]) -> bool:
    """True for a packed exchange file: a reader of a subpartition range filters its rows by ``_sp``."""
    return entry.get("subpartitions") is not None


def packed_index(size: int, rows: dict[int, int]) -> dict[str, int]:
    """A packed file's index: its ``size`` in bytes apportioned to each subpartition by its ``rows``.

    Planning balances consumers' ranges on these bytes, as on a partitioned file's sizes; they add up to
    ``size``. Keys are strings, as JSON keeps them.
    """
    total = sum(rows.values())
    if total <= 0:
        return {}
    shares = {sp: size * n // total for sp, n in sorted(rows.items()) if n > 0}
    # The bytes the floors dropped go to the largest subpartition, so the index adds up to the file.
    if shares:
        shares[max(shares, key=lambda sp: (rows[sp], -sp))] += size - sum(shares.values())
    return {str(sp): b for sp, b in shares.items()}


def subpartition_bytes(part: dict[str, Any]) -> dict[int, int]:
    """Bytes per subpartition of one committed producer subtask (compact record or full file list)."""
    if "subpartition_bytes" in part:
        return {int(sp): int(size) for sp, size in part["subpartition_bytes"].items()}
    out: dict[int, int] = {}
    for f in part.get("files") or []:
        for sp, size in file_subpartitions(f).items():
            out[sp] = out.get(sp, 0) + size
    return out


def fingerprint(plan: Mapping[str, Any]) -> str:
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


def plan_uses_s3(plan: Mapping[str, Any]) -> bool:
    """True if the stage's attempts open S3: its store root, or a source file it reads, is an ``s3://`` URL."""
    def has_url(value: Any, depth: int) -> bool:
        if depth > 8:
            return False
        if isinstance(value, Mapping):
            path = value.get("path")
            if isinstance(path, str) and is_object_url(path):
                return True
            return any(has_url(v, depth + 1) for v in value.values() if isinstance(v, Mapping | list))
        if isinstance(value, list):
            return any(has_url(v, depth + 1) for v in value)
        return False

    root = plan.get("store_root")
    return (isinstance(root, str) and is_object_url(root)) or has_url(plan.get("inputs"), 0) \
        or has_url(plan.get("subtasks"), 0)
