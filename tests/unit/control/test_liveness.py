"""TargetWatcher: live targets and slots from probes (faked here) and the store's claims; the probe cache."""

from __future__ import annotations

import socket

from airflow_provider_speculative.control.liveness import ProbeCache, TargetWatcher, connect_address, tcp_probe
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.store.slots import TargetSlots
from tests.factories import Clock


def watcher(tmp_path, targets, plan_targets=None, target_env=None, master=None, tcp=None, clock=None):
    config = SpeculativeConfig().with_overrides({"targets": targets, "check_interval": 1}, "test")
    slots = {t.name: TargetSlots(tmp_path, t.name) for t in config.targets}
    calls = {"master": 0, "tcp": 0}

    def fetch(url):
        calls["master"] += 1
        return master(url) if callable(master) else master

    def probe(host, port):
        calls["tcp"] += 1
        return tcp(host, port) if tcp else None

    return TargetWatcher(config, plan_targets or {}, target_env or {}, slots, cache=ProbeCache(clock or Clock(0.0)),
                         fetch_master=fetch, probe_tcp=probe), calls, slots


def status(*workers):
    return {"workers": [{"id": f"w{i}", "host": h, "state": st, "cores": c, "coresfree": f}
                        for i, (h, st, c, f) in enumerate(workers)]}


def test_reactive_target_follows_the_masters_workers(tmp_path):
    state = {"doc": status(("h1", "ALIVE", 1, 0))}
    clock = Clock(0.0)
    w, calls, slots = watcher(tmp_path, [{"name": "c", "slots": "auto", "master_ui": "http://m:1"}],
                              master=lambda url: state["doc"], clock=clock)
    slots["c"].claim(1, {"who": "x"})
    view = w.observe(0.0)["c"]
    assert (view.live, view.capacity, view.held, view.free) == (True, 1, 1, 0)
    # A worker joins: seen at the next check interval (the cache keeps one master request per interval).
    state["doc"] = status(("h1", "ALIVE", 1, 0), ("h2", "ALIVE", 1, 1))
    assert w.observe(0.5)["c"].capacity == 1 and calls["master"] == 1
    clock.now = 1.0
    view = w.observe(1.0)["c"]
    assert (view.capacity, view.free, view.nodes) == (2, 1, {"h1", "h2"}) and calls["master"] == 2
    # It leaves: a lost node (named with why), then it comes back and is not lost any more.
    state["doc"] = status(("h1", "ALIVE", 1, 0), ("h2", "DEAD", 1, 1))
    clock.now = 2.0
    assert w.observe(2.0)["c"].capacity == 1
    assert w.lost_nodes == {"h2": "worker left the master's alive list (state DEAD)"}
    state["doc"] = status(("h1", "ALIVE", 1, 0))
    clock.now = 3.0
    w.observe(3.0)
    assert "h2" in w.lost_nodes  # dropped from the list: still lost
    state["doc"] = status(("h1", "ALIVE", 1, 0), ("h2", "ALIVE", 1, 1))
    clock.now = 4.0
    w.observe(4.0)
    assert w.lost_nodes == {}


def test_unreachable_master_or_connect_server_makes_the_target_lost(tmp_path):
    # A refused port has no server behind it: lost at the first probe (silence needs several: below).
    w, _calls, _ = watcher(
        tmp_path, [{"name": "c", "slots": "auto", "master_ui": "http://m:1"}, {"name": "sc", "slots": 3},
                   {"name": "local", "slots": 2}],
        plan_targets={"sc": {"kind": "spark_connect", "env": {}}, "local": {"kind": "spark_submit"}},
        target_env={"sc": {"SPECULATIVE_SPARK_REMOTE": "sc://10.0.0.5:15010/;token=secret"}},
        master="master web UI http://m:1 does not answer",
        tcp=lambda h, p: f"{h}:{p} does not answer (ConnectionRefusedError: [Errno 111] Connection refused)")
    views = w.observe(0.0)
    assert not views["c"].live and views["c"].capacity == 0 and "does not answer" in views["c"].reason
    assert not views["sc"].live and views["sc"].reason.startswith("Spark Connect server 10.0.0.5:15010 does not answer")
    assert views["local"].live and views["local"].capacity == 2


def test_probe_cache_is_shared_and_expires():
    clock = Clock(0.0)
    cache = ProbeCache(clock)
    calls = []
    assert cache.get("k", 1.0, lambda: calls.append(1) or "a") == "a"
    assert cache.get("k", 1.0, lambda: calls.append(1) or "b") == "a"
    clock.now = 1.0
    assert cache.get("k", 1.0, lambda: calls.append(1) or "c") == "c" and len(calls) == 2


def test_connect_address_and_a_real_tcp_probe():
    assert connect_address("sc://h:1234/;token=x") == ("h", 1234)
    assert connect_address("sc://h") == ("h", 15002)
    assert connect_address(None) is None
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert tcp_probe("127.0.0.1", port) is None
    assert "does not answer" in tcp_probe("127.0.0.1", port, timeout=0.2)


def test_a_silent_connect_server_is_lost_only_after_consecutive_unanswered_probes(tmp_path):
    from airflow_provider_speculative.control.liveness import SILENT_PROBES

    answers: list[str | None] = []
    clock = Clock(0.0)
    w, calls, _ = watcher(tmp_path, [{"name": "sc", "slots": 2}], plan_targets={"sc": {"kind": "spark_connect"}},
                          target_env={"sc": {"SPECULATIVE_SPARK_REMOTE": "sc://10.0.0.5:15010/"}},
                          tcp=lambda h, p: answers.pop(0), clock=clock)

    def check(answer: str | None, at: float) -> bool:
        answers.append(answer)
        clock.now = at
        return w.observe(at)["sc"].live

    silent = "10.0.0.5:15010 does not answer (TimeoutError: timed out)"
    # One lost SYN on a lossy link: still live; an answer resets the count.
    assert check(silent, 0.0) and check(None, 1.0)
    for i in range(SILENT_PROBES - 1):
        assert check(silent, 2.0 + i)
    # A cached result is one probe, however often the controller looks.
    assert w.observe(2.0 + SILENT_PROBES - 2 + 0.5)["sc"].live and calls["tcp"] == 1 + SILENT_PROBES
    assert not check(silent, 2.0 + SILENT_PROBES - 1)
    assert check(None, 10.0)  # back: live again at once
