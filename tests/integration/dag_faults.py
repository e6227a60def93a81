"""The faults the test DAGs run with: ``SPECULATIVE_FAULT_INJECTION`` rules (CONTRIBUTING.md, "Injecting faults").

A test that runs one of these DAGs injects its rules: ``with injected(SPEC_Q1): dag.test(...)`` in the
test's process, or ``fault_env(E2E_Q1)`` in the environment of the Airflow deployment it starts. Rules are
keyed by DAG id, so the rules of a DAG a test does not run change nothing.
"""

from __future__ import annotations

from typing import Any

Rules = dict[str, dict[str, Any]]

# dags/spec_q1.py: local-b is 4x slower plus a fixed delay, so the copy wins with a margin even on a loaded machine.
SPEC_Q1: Rules = {"spec_q1/*": {"targets": {"local-b": {"factor": 4, "delay": "60s"}}}}
# dags/connect_q1.py's connect_cancel: a copy of its only subtask runs at once; the original must be cancelled.
CONNECT_CANCEL: Rules = {"connect_cancel/*": {"force_speculation": [0]}}
# dags/race_sinks.py: every subtask (PARALLELISM = 2) runs two attempts. The controller steps within ~0.1 s of
# an attempt's end, and drivers' JVMs exit up to seconds apart under load: both attempts of a subtask end
# together only if their supervisors hold the ends (hold_end) until the test releases the pair. Then the
# discard path runs, not a cancel. race_unmarked's sink lacks the concurrency marker: forced copies must not run.
_RACE = {"force_speculation": [0, 1], "hold_end": True}
RACE_SINKS: Rules = {"race_parquet/*": _RACE, "race_postgres/*": _RACE, "race_connect/*": _RACE,
                     "race_unmarked/*": {"force_speculation": [0, 1]}}
# e2e_dags/e2e_q1.py: the scan attempts of e2e_q1_barrier wait at the barrier; the triggers of e2e_q1_commit's
# scan and e2e_q1_publish's aggregate hold after their commit.
E2E_Q1: Rules = {"e2e_q1_barrier/scan": {"barrier": True}, "e2e_q1_commit/scan": {"hold_commit": True},
                 "e2e_q1_publish/aggregate": {"hold_commit": True}}


def cluster_q1(slow_target: str) -> Rules:
    """dags/cluster_q1.py: the target of the second worker is slowed down, as spec_q1's local-b."""
    return {"cluster_q1/*": {"targets": {slow_target: {"factor": 4, "delay": "60s"}}}}
