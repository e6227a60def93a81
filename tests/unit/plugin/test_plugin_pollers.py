"""45 browsers polling a stage whose running attempt's log is a FIFO do not hold up the plugin's other routes.

A stage application can leave a FIFO where its log belongs (SECURITY.md): an open() for reading would
block its api-server thread until a writer came, and with enough pollers every thread of the pool, so
Airflow's own routes would stop answering too. The plugin's app is served by uvicorn on a real socket
(threads as in the api-server); while 45 clients poll ``/api/stage`` and ``/api/log`` at the stage page's
cadence, the other routes must keep answering, and no thread may be left reading the FIFO.
"""

from __future__ import annotations

import errno
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_provider_speculative.store.layout import StageLayout
from tests.plugin_app import served_plugin
from tests.unit.plugin.test_plugin_hostile import DAG, PARAMS, RUN, hostile_store

POLLERS = 45
# Seconds for each request to another route while the pollers run. A route held up by threads blocked on
# the FIFO never answers at all, so this tells a hang from a busy machine (a 0.5 s bound failed under the
# suite's own load); how fast the routes answer is not this test's to judge.
BOUND = 10.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(URL, FIFO): the plugin app on a store whose running attempt (subtask 1) has a FIFO as its log."""


    root = hostile_store(tmp_path / "store", history="", log_host="10.1.2.3")
    fifo = StageLayout(root, DAG, RUN, "scan").log(1, 0)
    fifo.unlink()
    os.mkfifo(fifo)
    with served_plugin(root, backlog=128) as url:
        yield url, fifo


def _has_reader(fifo: Path) -> bool:
    """Whether some thread holds the FIFO open for reading (a non-blocking open for writing then succeeds)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        assert exc.errno == errno.ENXIO, exc
        return False
    os.close(fd)
    return True


def test_pollers_of_a_fifo_log_never_hold_up_other_routes(served: tuple[str, Path]) -> None:
    from airflow_provider_speculative.plugin.app import REFRESH_SECONDS

    url, fifo = served
    stop = threading.Event()
    done = [0] * POLLERS
    bad: list[Any] = []

    def poller(i: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                stage = client.get("/api/stage", params=PARAMS)
                log = client.get("/api/log", params={**PARAMS, "subtask": 1, "attempt": 0})
                live = stage.status_code == 200 and stage.json()["subtasks"][1]["attempts"][0]["live"] is True
                if not live or log.status_code != 404:
                    bad.append((stage.status_code, log.status_code, stage.text[:200]))
                done[i] += 1
                stop.wait(REFRESH_SECONDS)  # the stage page's cadence: it fetches again 2 s after an answer

    threads = [threading.Thread(target=poller, args=(i,), daemon=True) for i in range(POLLERS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while min(done) < 1:  # every poller has been answered at least once: all of them are polling
            assert time.monotonic() < deadline, f"pollers answered: {sum(1 for d in done if d)}/{POLLERS}"
            time.sleep(0.05)
        timings: dict[str, list[float]] = {"/ui/run": [], "/ui/stage": [], "/api/run": []}
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(10):
                for route, samples in timings.items():
                    started = time.monotonic()
                    response = client.get(route, params=PARAMS)
                    samples.append(time.monotonic() - started)
                    assert response.status_code == 200, (route, response.status_code)
        assert _has_reader(fifo) is False, "a request holds the FIFO open"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not [t for t in threads if t.is_alive()], "a poller is still blocked"
    assert not bad, bad[:3]
    slowest = {route: max(samples) for route, samples in timings.items()}
    medians = {route: round(statistics.median(samples), 3) for route, samples in timings.items()}
    assert all(s < BOUND for s in slowest.values()), (slowest, medians, sum(done))
