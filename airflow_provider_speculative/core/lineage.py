"""What a stage reads and writes, as OpenLineage datasets (namespace and name, per OpenLineage's naming spec).

Pure: built from the stage run's plans. A source is the ``file`` dataset of its (rendered) path; an
exchange between stages is the dataset ``speculative`` / ``<dag_id>/<stage>``, stable across runs, so a
lineage backend draws one graph per pipeline rather than one per run; a sink is the dataset of its asset
URI (``file:///out/q1``, ``postgres://host:port/db/schema/table``).

A stage that commits a sink also lists every source its producers read, transitively: stages that end
in the triggerer never run on a worker, where Airflow's OpenLineage listener runs, so the sink's event
is the one that must carry the pipeline's lineage end to end.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True, order=True)
class LineageDataset:
    """An OpenLineage dataset identity."""

    namespace: str
    name: str


def dataset_of_uri(uri: str | None) -> LineageDataset | None:
    """An asset URI as a dataset: ``file:///p`` is (file, /p), ``postgres://h:p/db/s/t`` is (postgres://h:p, db.s.t)."""
    if not uri:
        return None
    parsed = urlsplit(uri)
    if parsed.scheme == "file":
        return LineageDataset("file", posixpath.normpath(parsed.path or "/"))
    if parsed.scheme in ("postgres", "postgresql") and parsed.hostname:
        parts = [p for p in parsed.path.split("/") if p]
        port = parsed.port or 5432
        return LineageDataset(f"postgres://{parsed.hostname}:{port}", ".".join(parts))
    return LineageDataset(f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/"))


def source_dataset(path: str) -> LineageDataset:
    """A source path as a dataset: a local path is (file, path); ``s3://b/k`` (or s3a) is (s3://b, k)."""
    parsed = urlsplit(path)
    if parsed.scheme.lower() in ("s3", "s3a") and "://" in path:
        # OpenLineage's naming spec: namespace s3://{bucket}, name {key}; s3a is the same object.
        return LineageDataset(f"s3://{parsed.netloc.rsplit('@', 1)[-1]}", parsed.path.strip("/"))
    return LineageDataset("file", posixpath.normpath(path))


def exchange_dataset(dag_id: str, stage: str) -> LineageDataset:
    """The dataset standing for ``stage``'s exchange output in every run of the DAG."""
    return LineageDataset("speculative", f"{dag_id}/{stage}")


def stage_lineage(plans: Mapping[str, Mapping[str, Any]], stage: str,
                  sink: LineageDataset | None) -> tuple[list[LineageDataset], list[LineageDataset]]:
    """(inputs, outputs) of ``stage`` given every planned stage of the run (``plans``) and its sink's dataset.

    ``stage`` and the keys of ``plans`` are store keys (the task id in a pipeline compiled as a TaskGroup),
    so two pipelines of one DAG with a stage of the same name stand for two datasets.
    """
    plan = plans[stage]
    dag_id = str(plan.get("dag_id", ""))
    prefix = str(plan.get("store_prefix") or "")  # a stage reads only stages of its own pipeline
    inputs: set[LineageDataset] = set()
    for entry in (plan.get("inputs") or {}).values():
        if entry.get("kind") == "source" and entry.get("path"):
            inputs.add(source_dataset(str(entry["path"])))
        elif entry.get("kind") == "exchange" and entry.get("upstream"):
            inputs.add(exchange_dataset(dag_id, prefix + str(entry["upstream"])))
    if sink is None:
        return sorted(inputs), [exchange_dataset(dag_id, stage)]
    seen: set[str] = set()
    pending = [prefix + str(e["upstream"]) for e in (plan.get("inputs") or {}).values()
               if e.get("kind") == "exchange"]
    while pending:  # every producer upstream, once each: a diamond is walked once
        upstream = pending.pop()
        if upstream in seen or upstream not in plans:
            continue
        seen.add(upstream)
        for entry in (plans[upstream].get("inputs") or {}).values():
            if entry.get("kind") == "source" and entry.get("path"):
                inputs.add(source_dataset(str(entry["path"])))
            elif entry.get("kind") == "exchange" and entry.get("upstream"):
                pending.append(prefix + str(entry["upstream"]))
    return sorted(inputs), [sink]
