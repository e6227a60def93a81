"""What a stage reads and writes, as OpenLineage datasets (namespace and name, per OpenLineage's naming spec).

Pure: built from the stage run's plans. A source is the ``file`` dataset of its (rendered) path; an
exchange between stages is the dataset ``speculative`` / ``<dag_id>/<stage>``, stable across runs, so a
lineage backend draws one graph per pipeline rather than one per run; a sink is the dataset of its asset
URI (``file:///out/q1``, ``postgres://host:port/db/schema/table``).

A stage that commits a sink also lists every source its producers read, transitively, so the sink's
event carries the pipeline's lineage end to end.

Who reports a stage task's run (:func:`provider_events`): Airflow's OpenLineage listener reports every
run of the task on a worker; this provider reports what ends in the triggerer. No dataset name carries a
URL's userinfo, and an error text in an event is bounded and printable (:func:`error_text`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

# An error message in an event is cut here: a FAIL event stays small, whatever a failure printed.
ERROR_TEXT_LIMIT = 4000
# ``scheme://user:password@`` anywhere in a text: the userinfo part is replaced.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/@]*@")


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
    return LineageDataset(f"{parsed.scheme}://{_host_port(parsed.netloc)}", parsed.path.lstrip("/"))


def _host_port(netloc: str) -> str:
    """A URL's authority without its userinfo (a credential never names a dataset)."""
    return netloc.rsplit("@", 1)[-1]


def source_dataset(path: str) -> LineageDataset:
    """A source path as a dataset: a local path is (file, path); ``s3://b/k`` (or s3a) is (s3://b, k)."""
    parsed = urlsplit(path)
    if parsed.scheme.lower() in ("s3", "s3a") and "://" in path:
        # OpenLineage's naming spec: namespace s3://{bucket}, name {key}; s3a is the same object.
        return LineageDataset(f"s3://{_host_port(parsed.netloc)}", parsed.path.strip("/"))
    if parsed.scheme and "://" in path:  # any other URL: its scheme and host, never its userinfo
        return LineageDataset(f"{parsed.scheme.lower()}://{_host_port(parsed.netloc)}", parsed.path.strip("/"))
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


class LineageEvent(StrEnum):
    """The OpenLineage run event types of a stage task run."""

    START = "START"
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"


def provider_events(*, ran_on_worker: bool, ended_in_triggerer: bool, succeeded: bool) -> tuple[LineageEvent, ...]:
    """The events this provider emits for one stage task try; Airflow's OpenLineage listener emits the others.

    The listener runs only on workers: every worker run of the task emits START, and the worker run that
    ends the task emits COMPLETE or FAIL. A task that resumes on a worker (to commit, publish an asset
    event, or fail) is reported there in full, so the provider emits nothing for it. A task that ends in
    the triggerer gets its terminal event from the provider, and its START too when no worker ran it
    (started in the triggerer): one START and one terminal event per task try, whichever process ends it.
    """
    if not ended_in_triggerer:
        return ()
    terminal = LineageEvent.COMPLETE if succeeded else LineageEvent.FAIL
    return (terminal,) if ran_on_worker else (LineageEvent.START, terminal)


@dataclass(frozen=True)
class OutputStats:
    """What a committed stage wrote, from its committed record: rows, bytes, files and its columns."""

    rows: int | None
    bytes: int | None
    files: int | None
    fields: tuple[tuple[str, str], ...]


def output_stats(committed: Mapping[str, Any]) -> OutputStats:
    """Totals over the admitted attempts of a committed.json record; a total a manifest lacks is None.

    ``fields`` is (name, type) per column of the first recorded schema (Spark's StructType JSON); a
    complex type is named by its ``type`` (``struct``, ``array``, ``map``).
    """
    subtasks = [s for s in (committed.get("subtasks") or {}).values() if isinstance(s, Mapping)]
    counted = [{**s, "file_count": len(s["files"])} if isinstance(s.get("files"), list) else s for s in subtasks]
    return OutputStats(rows=_total(subtasks, "records"), bytes=_total(subtasks, "bytes"),
                       files=_total(counted, "file_count"),
                       fields=next((f for f in (_schema_fields(s.get("schema")) for s in subtasks) if f), ()))


def _total(subtasks: list[Mapping[str, Any]], key: str) -> int | None:
    """The sum of ``key`` over the subtasks; None when one of them does not record it."""
    values = [s.get(key) for s in subtasks]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    return sum(int(v) for v in values if v is not None)


def _schema_fields(schema: Any) -> tuple[tuple[str, str], ...]:
    """(name, type) of each field of a Spark StructType JSON; () for anything else."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("fields"), list):
        return ()
    out = []
    for field in schema["fields"]:
        if isinstance(field, Mapping) and isinstance(field.get("name"), str):
            out.append((field["name"], _type_name(field.get("type"))))
    return tuple(out)


def _type_name(kind: Any) -> str:
    """A Spark JSON type's name: ``long``, ``decimal(15,2)``; a complex type by its kind (``struct``, ``array``)."""
    if isinstance(kind, str):
        return kind
    if isinstance(kind, Mapping) and isinstance(kind.get("type"), str):
        return str(kind["type"])
    return "unknown"


def error_text(message: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    """``message`` for an event: URL userinfo as ``***@``, control characters as ``\\xNN``, cut at ``limit``."""
    text = _USERINFO.sub(r"\1***@", message)
    text = "".join(c if c == "\n" or c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100
                   else f"\\u{ord(c):04x}" for c in text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"
