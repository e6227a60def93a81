"""Is a stage's committed output there for a consumer? Pure matching logic of StageOutputSensor.

A stage run commits all of its subtasks at once (``committed.json`` is written atomically by
finalize), so "subtask k is committed" means: the stage run committed and its record has subtask k.
A subpartition is *available* when at least one committed subtask wrote data for it (its key is in
that subtask's ``subpartition_bytes``): a consumer reading subpartition j finds rows there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# Airflow's CronPartitionTimetable and temporal partition mappers read keys in this format.
PARTITION_KEY_FORMAT = "%Y-%m-%dT%H:%M:%S"


def parse_instant(value: Any) -> datetime | None:
    """A logical date (datetime or ISO-8601 string) as an aware UTC datetime; naive means UTC; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"logical date {value!r} is not an ISO-8601 date-time") from None
    else:
        raise ValueError(f"logical date {value!r} must be a datetime or an ISO-8601 string, "
                         f"got {type(value).__name__}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def same_instant(a: Any, b: Any) -> bool:
    """True if two logical dates name the same instant (whatever their time zone or string form)."""
    first, second = parse_instant(a), parse_instant(b)
    return first is not None and second is not None and first == second


def partition_key(logical_date: Any) -> str | None:
    """The asset partition key of a logical date (UTC, ``%Y-%m-%dT%H:%M:%S``); None without a date."""
    moment = parse_instant(logical_date)
    return moment.strftime(PARTITION_KEY_FORMAT) if moment is not None else None


@dataclass(frozen=True)
class Readiness:
    """What a consumer still waits for in one stage run's committed output (empty tuples: all there)."""

    committed: bool
    missing_subtasks: tuple[int, ...] = ()
    missing_subpartitions: tuple[int, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """The stage committed and has every requested subtask and subpartition."""
        return self.committed and not self.missing_subtasks and not self.missing_subpartitions


def check_committed(record: dict[str, Any] | None, subtasks: Iterable[int] | None = None,
                    subpartitions: Iterable[int] | None = None) -> Readiness:
    """Match a committed record (None: not committed) against the requested subtasks and subpartitions.

    Costs linear in the committed subtasks and their subpartitions.
    """
    wanted_subtasks = sorted({int(s) for s in subtasks}) if subtasks is not None else []
    wanted_sps = sorted({int(s) for s in subpartitions}) if subpartitions is not None else []
    if record is None:
        return Readiness(committed=False, missing_subtasks=tuple(wanted_subtasks),
                         missing_subpartitions=tuple(wanted_sps))
    entries = record.get("subtasks") or {}
    present = {int(k) for k in entries}
    available: set[int] = set()
    if wanted_sps:
        for entry in entries.values():
            for key, size in (entry.get("subpartition_bytes") or {}).items():
                if size is None or int(size) > 0:
                    available.add(int(key))
    return Readiness(
        committed=True,
        missing_subtasks=tuple(s for s in wanted_subtasks if s not in present),
        missing_subpartitions=tuple(s for s in wanted_sps if s not in available),
        details={"parallelism": record.get("parallelism", len(present)),
                 "committed_at": record.get("committed_at")})


def describe_wait(dag_id: str, stage: str, logical_date: Any, run_id: str | None, readiness: Readiness | None,
                  subtasks: Iterable[int] | None = None, subpartitions: Iterable[int] | None = None) -> str:
    """One sentence naming what is not committed yet: DAG, stage, logical date or run, subtasks, subpartitions."""
    moment = parse_instant(logical_date)
    where = f"DAG {dag_id!r}, stage {stage!r}, " + (f"run {run_id!r}" if run_id and moment is None else
                                                    f"logical date {moment.isoformat() if moment else None}")
    if readiness is None:
        return f"{where}: no run of that DAG with this logical date in the store yet"
    if not readiness.committed:
        parts = [f"{where}: stage not committed yet"]
        if subtasks is not None:
            parts.append(f"waiting for subtasks {list(readiness.missing_subtasks)}")
        if subpartitions is not None:
            parts.append(f"waiting for subpartitions {list(readiness.missing_subpartitions)}")
        return "; ".join(parts)
    parts = [f"{where}: stage committed (parallelism {readiness.details.get('parallelism')})"]
    if readiness.missing_subtasks:
        parts.append(f"the commit has no subtasks {list(readiness.missing_subtasks)}")
    if readiness.missing_subpartitions:
        parts.append(f"no committed subtask wrote subpartitions {list(readiness.missing_subpartitions)}")
    return "; ".join(parts)
