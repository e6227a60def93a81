"""`airflow speculative status` shows live slots per target, lost nodes and a stage waiting for a slot."""

from __future__ import annotations

from airflow_provider_speculative.cli.commands import slot_lines
from airflow_provider_speculative.core.slots import TargetView


def test_slot_lines_show_live_and_lost_targets_and_the_wait():
    stage = {
        "slots": {"cluster": TargetView("cluster", True, 2, held=1, nodes=frozenset({"h1", "h2"})).to_json(),
                  "connect": TargetView("connect", False, 0,
                                        reason="Spark Connect server h:1 does not answer").to_json()},
        "lost_nodes": {"h3": "worker left the master's alive list (state DEAD)"},
        "target_lost_attempts": 1,
        "slot_status": "waiting for a free slot on targets cluster, connect (held by running attempts)",
    }
    lines = [
        "cluster live: 1 free of 2 (held by any stage: 1), workers h1, h2",
        "connect LOST (Spark Connect server h:1 does not answer): 0 free of 0 (held by any stage: 0)",
        "node h3 lost: worker left the master's alive list (state DEAD)",
        "1 attempt(s) rerun after their target or node was lost (not counted as failures)",
        "waiting for a free slot on targets cluster, connect (held by running attempts)",
    ]
    assert slot_lines(stage) == lines
    # With the summary's time, the views are dated: they are the controller's last look, not a live probe.
    assert slot_lines({**stage, "slots_observed_at": 1000.0}, now=1042.0) == [
        "as of the controller's last check, 42s ago:", *lines]
    assert slot_lines({**stage, "slots_observed_at": 1000.0, "committed": True}, now=1300.0)[0] == (
        "as of the controller's last check, 5m 00s ago; the stage is over:")
    assert slot_lines({}) == []
