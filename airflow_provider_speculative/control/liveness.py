"""What each target offers now (FLIP-159 reactive mode): probes, the probe cache and slot counts.

Per check interval and target, one of:

- a ``spark_connect`` target: its server's gRPC port answers a TCP connect (0.5 s timeout), or the
  target is lost: at once when the port refuses (nothing listens: the server is gone), after
  :data:`SILENT_PROBES` consecutive probes that get no answer (a lossy link drops a SYN now and
  then, and a lost SYN is retried after 1 s: with 5 % loss one probe in twenty would otherwise
  cancel every attempt of a healthy server); capacity is its ``slots``;
- a reactive standalone target (``"slots": "auto"``): the master's ``<master_ui>/json/`` (1 s
  timeout) gives the alive workers and their cores; capacity is the alive workers' cores divided by
  the cores one attempt takes, the offer their free cores likewise; a worker that was alive and is not
  any more is a lost node;
- any other target: always live, capacity its ``slots``.

Probe results are cached per process for one check interval (:class:`ProbeCache`), so every stage
controller of a triggerer shares one master request per interval, and a dead server costs at most
one short timeout per interval. The held count comes from the store (``store/slots.py``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.core.slots import TargetView, cores_per_attempt, parse_workers, standalone_view
from airflow_provider_speculative.store.slots import TargetSlots

CONNECT_TIMEOUT = 0.5
# Consecutive unanswered probes (distinct ones: a cached result counts once) before a target is lost.
SILENT_PROBES = 3
MASTER_TIMEOUT = 1.0


class ProbeCache:
    """Probe results by key, reused for ``max_age`` seconds; thread-safe (controllers step in threads)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, max_age: float, probe: Callable[[], Any]) -> Any:
        """The cached value of ``key`` if younger than ``max_age``, else ``probe()`` (cached)."""
        now = self.clock()
        with self._lock:
            hit = self._values.get(key)
            if hit is not None and now - hit[0] < max_age:
                return hit[1]
        value = probe()
        with self._lock:
            self._values[key] = (self.clock(), value)
        return value


PROBES = ProbeCache()


def tcp_probe(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None if ``host:port`` accepts a connection, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} does not answer ({type(exc).__name__}: {exc})"


def master_status(url: str, timeout: float = MASTER_TIMEOUT) -> dict[str, Any] | str:
    """The master's ``/json/`` document, or why it could not be read."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/json/", timeout=timeout) as response:
            document: dict[str, Any] = json.loads(response.read())
            return document
    except (OSError, ValueError) as exc:
        return f"master web UI {url} does not answer ({type(exc).__name__}: {exc})"


def connect_address(url: str | None) -> tuple[str, int] | None:
    """(host, port) of an ``sc://host:port/;...`` URL (Spark Connect's default port 15002)."""
    if not url:
        return None
    parsed = urlparse(url.replace("sc://", "http://", 1))
    if not parsed.hostname:
        return None
    return parsed.hostname, parsed.port or 15002


class TargetWatcher:
    """Observes a stage's targets each check: live or lost, capacity, claims held in the store, lost nodes."""

    def __init__(self, config: SpeculativeConfig, plan_targets: dict[str, dict[str, Any]],
                 target_env: dict[str, dict[str, str]], slots: dict[str, TargetSlots],
                 cache: ProbeCache | None = None,
                 fetch_master: Callable[[str], dict[str, Any] | str] = master_status,
                 probe_tcp: Callable[[str, int], str | None] = tcp_probe) -> None:
        self.config = config
        self.plan_targets = plan_targets
        self.target_env = target_env
        self.slots = slots
        self.cache = cache or PROBES
        self.fetch_master = fetch_master
        self.probe_tcp = probe_tcp
        # Workers seen alive per reactive target: one that leaves the alive list is a lost node.
        self.seen_alive: dict[str, set[str]] = {}
        self.lost_nodes: dict[str, str] = {}
        # Per Connect target: (when its last counted probe ran, how many in a row got no answer).
        self.silent: dict[str, tuple[float, int]] = {}

    def observe(self, now: float) -> dict[str, TargetView]:
        """One view per target (probes cached for one check interval)."""
        return {t.name: self._view(t, now) for t in self.config.targets}

    def _view(self, target: Target, now: float) -> TargetView:
        held = self.slots[target.name].count()
        max_age = self.config.check_interval
        master_ui = target.master_ui or (self.plan_targets.get(target.name) or {}).get("master_ui")
        if target.auto_slots and not master_ui:
            return TargetView(target.name, live=False, capacity=0, held=held, checked_at=now,
                              reason="slots 'auto' without a master web UI URL (target or connection 'master_ui')")
        if target.auto_slots and master_ui:
            status = self.cache.get(("master", master_ui), max_age, lambda: self.fetch_master(master_ui))
            if isinstance(status, str):
                return TargetView(target.name, live=False, capacity=0, held=held, reason=status, checked_at=now)
            workers = parse_workers(status)
            view = standalone_view(target.name, workers, cores_per_attempt(target.conf), held, now)
            alive = set(view.nodes or ())
            seen = self.seen_alive.setdefault(target.name, set())
            for host in alive:
                self.lost_nodes.pop(host, None)
            for worker in workers:
                if worker.host in seen and worker.host not in alive:
                    self.lost_nodes[worker.host] = f"worker left the master's alive list (state {worker.state})"
            for host in seen - alive - {w.host for w in workers}:
                self.lost_nodes[host] = "worker left the master's alive list (no longer listed)"
            seen |= alive
            return view
        if self._kind(target.name) == "spark_connect":
            address = connect_address(self._remote(target.name))
            if address is not None:
                why, probed_at = self.cache.get(("tcp", *address), max_age,
                                                lambda: (self.probe_tcp(*address), time.monotonic()))
                if not why:
                    self.silent.pop(target.name, None)
                elif self._silent_long_enough(target.name, why, probed_at):
                    return TargetView(target.name, live=False, capacity=0, held=held,
                                      reason=f"Spark Connect server {why}", checked_at=now)
        return TargetView(target.name, live=True, capacity=target.slots, held=held, checked_at=now)

    def _silent_long_enough(self, name: str, why: str, probed_at: float) -> bool:
        """Whether a failed probe makes ``name`` lost: a refused port at once, silence after a few probes."""
        if "ConnectionRefusedError" in why:
            return True
        last, count = self.silent.get(name, (None, 0))
        if last != probed_at:
            count += 1
            self.silent[name] = (probed_at, count)
        return count >= SILENT_PROBES

    def _kind(self, name: str) -> str:
        return str((self.plan_targets.get(name) or {}).get("kind", "spark_submit"))

    def _remote(self, name: str) -> str | None:
        return (self.target_env.get(name) or {}).get(REMOTE_ENV) or \
            ((self.plan_targets.get(name) or {}).get("env") or {}).get(REMOTE_ENV)
