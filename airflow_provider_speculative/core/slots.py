"""Slots of targets (FLIP-159 reactive mode): pure arithmetic over what is live and what is held.

A **slot** is room for one live attempt on a target. Slots belong to the target, not to a stage:
every stage and DAG run using a target claims them in the store (``store/slots.py``), so the free
count a stage sees is the target's *capacity* minus the claims of every holder. Capacity is the
target's configured ``slots`` for a fixed target, or what the cluster offers now for a reactive one
(``"slots": "auto"``: the alive workers' cores of a standalone master). A target whose server stops
answering, or whose alive-worker list is empty, has no capacity and is *lost*.

Everything here is a pure function of observations (no I/O), so rules other features add (e.g. "a
hybrid consumer never takes slots its own producers still need") compose with :func:`free_slots` by
lowering the offer per target before it reaches the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_speculative.core.states import TERMINAL

# A holder whose attempt never wrote claim.json nor status.json for this long was never launched
# (its controller died between the slot claim and the launch): its slot may be reclaimed.
UNLAUNCHED_GRACE = 30.0
# A supervisor on any host refreshes alive_at every 5 s; after this long it is presumed gone
# (the same bound backends/supervised.py uses for remote supervisors).
HOLDER_ALIVE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Worker:
    """One worker of a standalone master's ``/json`` status."""

    host: str
    state: str
    cores: int
    coresfree: int
    memoryfree: int = 0
    lastheartbeat: float = 0.0


@dataclass(frozen=True)
class TargetView:
    """What a target offers now: live or not (and why), capacity, held claims and the nodes it runs on."""

    name: str
    live: bool
    capacity: int
    held: int = 0
    reason: str = ""
    # Reactive targets: the alive workers' hosts (an attempt whose node leaves this set lost its node).
    nodes: frozenset[str] | None = None
    # Reactive targets: free cores the master reports, in attempts (others' applications count too).
    offered: int | None = None
    checked_at: float = 0.0

    @property
    def free(self) -> int:
        """Slots a new attempt may claim now: capacity minus every holder's claim, bounded by the offer."""
        return free_slots({self.name: self.capacity}, {self.name: self.held},
                          None if self.offered is None else {self.name: self.offered})[self.name]

    def to_json(self) -> dict[str, Any]:
        """The form summary.json, the status CLI and the UI show."""
        return {"live": self.live, "capacity": self.capacity, "held": self.held, "free": self.free,
                "reason": self.reason, "nodes": sorted(self.nodes) if self.nodes is not None else None,
                "checked_at": self.checked_at}


def free_slots(capacity: Mapping[str, int], held: Mapping[str, int],
               offered: Mapping[str, int] | None = None) -> dict[str, int]:
    """Per target: ``capacity - held`` (never negative), and never more than ``offered`` where given.

    ``held`` counts every holder in the store, this stage's attempts included; ``offered`` is what the
    cluster itself says is free (a master's free cores), which also reflects other applications.
    """
    out = {}
    for name, cap in capacity.items():
        free = max(0, cap - held.get(name, 0))
        if offered is not None and name in offered:
            free = min(free, max(0, offered[name]))
        out[name] = free
    return out


def cores_per_attempt(conf: Mapping[str, str]) -> int:
    """Cores one attempt takes on a standalone cluster: ``spark.cores.max``, else executor cores, else 1."""
    for key in ("spark.cores.max", "spark.executor.cores"):
        value = conf.get(key)
        if value is not None:
            try:
                return max(1, int(value))
            except ValueError:
                continue
    return 1


def parse_workers(status: Mapping[str, Any]) -> list[Worker]:
    """The workers of a master's ``/json`` document; a restarted worker's newest registration wins."""
    newest: dict[str, Worker] = {}
    for raw in sorted(status.get("workers") or [], key=lambda w: str(w.get("id", ""))):
        host = str(raw.get("host") or "")
        if not host:
            continue
        newest[host] = Worker(host=host, state=str(raw.get("state", "")), cores=int(raw.get("cores") or 0),
                              coresfree=int(raw.get("coresfree") or 0), memoryfree=int(raw.get("memoryfree") or 0),
                              lastheartbeat=float(raw.get("lastheartbeat") or 0))
    return list(newest.values())


def standalone_view(name: str, workers: Iterable[Worker], per_attempt: int, held: int, now: float) -> TargetView:
    """A reactive standalone target: capacity from the alive workers' cores, the offer from their free cores."""
    alive = [w for w in workers if w.state == "ALIVE"]
    capacity = sum(w.cores // per_attempt for w in alive)
    offered = sum(w.coresfree // per_attempt for w in alive)
    reason = "" if alive else "no ALIVE worker in the master's status"
    return TargetView(name=name, live=bool(alive), capacity=capacity, held=held, reason=reason,
                      nodes=frozenset(w.host for w in alive), offered=offered, checked_at=now)


def holder_gone(holder: Mapping[str, Any], status: Mapping[str, Any] | None, claimed: bool,
                now: float) -> str | None:
    """Why a slot's holder is provably gone (its slot may be reclaimed), or None while it may be live.

    Gone: its attempt is terminal, or its supervisor stopped refreshing ``alive_at``, or it was never
    launched (no claim.json and no status.json long after the slot claim). Never a live holder.
    """
    if status:
        state = str(status.get("state") or "")
        if state in TERMINAL:
            return f"attempt {state}"
        seen = max(float(status.get("alive_at") or 0), float(status.get("deploying_at") or 0),
                   float(status.get("launched_at") or 0))
        if seen and now - seen > HOLDER_ALIVE_TIMEOUT:
            return f"supervisor silent for {now - seen:.0f}s"
        return None
    if not claimed and now - float(holder.get("claimed_at") or 0) > UNLAUNCHED_GRACE:
        return "attempt never launched"
    return None

