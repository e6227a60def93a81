"""Speed check: time one tiny query on every Spark Connect target at once, before a stage's first wave.

Speed-aware placement (core/speed.py) only knows a slow server once an attempt on it overran the
others, or from an earlier DAG run's record. On a slow node's first run that is too late: the first
wave has put originals there already. A warm Connect server answers a tiny query in about 0.2 s, so
timing one on every server at once tells a server throttled to a quarter of a core (2.9-6.2x as long,
measured) from a healthy one (mostly within 1.4x) before anything is placed. The query runs in one session
per server and process (``backends/spark_connect.py``), so only the first check pays its set-up.

The wait is bounded: it ends when every server answered, or :data:`CHECK_WAIT_FACTOR` times the fastest
server's whole check after the start (a server still busy then is at least that much slower), or after
:data:`CHECK_TIMEOUT` without any answer (no result: placement goes on as without the check). A check
still running when the wait ends finishes in its thread; its result is not waited for. Which targets are
checked and when is decided in ``control/controller.py``; what a ratio means in ``core/speed.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_speculative.core.speed import CHECK_WAIT_FACTOR, check_slowness, check_wanted
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.speeds import SpeedRecord, read_records

# No server answered the check within this: give up waiting (the stage must not stall on a dead pool).
CHECK_TIMEOUT = 3.0


@dataclass(frozen=True)
class CheckResult:
    """What one speed check measured: seconds per target (None: still running), the wait, and failures."""

    durations: dict[str, float | None]
    waited: float
    failed: dict[str, str] = field(default_factory=dict)
    # Seconds from the start to each answer (the session's set-up included).
    totals: dict[str, float] = field(default_factory=dict)

    @property
    def slowness(self) -> dict[str, float]:
        """Slowness per answering or still-running target (core/speed.py); {} if nothing can be compared."""
        return check_slowness(self.durations, self.waited, min(self.totals.values(), default=None))


def check_needed(urls: Mapping[str, str], records: Mapping[str, SpeedRecord], run_key: str, now: float,
                 max_age: float) -> bool:
    """Whether a stage of DAG run ``run_key`` should check these Connect targets, given the stored records."""
    return check_wanted(urls, {t: r.slowness for t, r in records.items()}, {t: now - r.at for t, r in records.items()},
                        [t for t, r in records.items() if r.of_run(run_key)], max_age)


def prepare_checks(urls: Mapping[str, str]) -> threading.Thread | None:
    """Warm a check session on every server in one background thread; the thread, or None without servers.

    Started while a stage is still being planned, so the check that follows finds its sessions ready and
    pays only its timed queries. Nothing here waits or raises: a failed warm-up leaves the check to
    start its own session.
    """
    if not urls:
        return None

    def run() -> None:
        # Import the client here too: check_speeds imports it on the stage's path otherwise.
        import pyspark.sql.connect.client.core  # noqa: F401

        from airflow_provider_speculative.backends.registry import prepare_connect_speed_check

        for url in urls.values():
            prepare_connect_speed_check(url)

    thread = threading.Thread(target=run, name="speed-check-prepare", daemon=True)
    thread.start()
    return thread


def prepare_if_needed(root: Path | StoreBackend, urls: Mapping[str, str], run_key: str, max_age: float) -> bool:
    """Start warming the check sessions (:func:`prepare_checks`) if a stage of this DAG run will check.

    ``root``: the store (a planner's ``store``), whose speed records are read by name; or a POSIX root.
    """
    records = read_records(root, list(urls), time.time())
    if not check_needed(urls, records, run_key, time.time(), max_age):
        return False
    prepare_checks(urls)
    return True


def _default_check(url: str) -> float:
    from airflow_provider_speculative.backends.registry import connect_speed_check

    return connect_speed_check(url)


def check_speeds(urls: Mapping[str, str], check: Callable[[str], float] | None = None,
                 timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Run ``check`` (a server's answer time for the check query) on every target's URL at once.

    Returns once every check ended or the bounded wait above is over; threads of unfinished checks
    are left to end on their own (each has its RPC deadline).
    """
    run = check or _default_check
    if check is None:
        # Import pyspark's Connect client once, here: an import inside the timed threads would be
        # paid by whichever thread came first and read as that server's slowness.
        import pyspark.sql.connect.client.core  # noqa: F401
    pool = ThreadPoolExecutor(max_workers=max(1, len(urls)), thread_name_prefix="speed-check")
    started = time.monotonic()
    futures: dict[Future[float], str] = {pool.submit(run, url): name for name, url in urls.items()}
    durations: dict[str, float | None] = {}
    totals: dict[str, float] = {}
    failed: dict[str, str] = {}
    deadline = started + timeout
    pending = set(futures)
    try:
        while pending and (left := deadline - time.monotonic()) > 0:
            done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            for future in done:
                name = futures[future]
                try:
                    seconds = durations[name] = future.result()
                    totals[name] = max(seconds, time.monotonic() - started)
                except Exception as exc:  # an unreachable or refusing server is not a slow one
                    failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if totals:
                # Compared whole check with whole check: a server still busy then is slow. Not capped by
                # the timeout, which is for no answer at all: a first answer late in it (a slow machine,
                # a cold session) must still leave the others CHECK_WAIT_FACTOR times as long, else a
                # throttled server still busy would read as a healthy one. Bounded by the factor x timeout.
                deadline = started + CHECK_WAIT_FACTOR * min(totals.values())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    waited = time.monotonic() - started
    for name in urls:
        if name not in durations and name not in failed:
            durations[name] = None
    return CheckResult(durations=durations, waited=waited, failed=failed, totals=totals)
