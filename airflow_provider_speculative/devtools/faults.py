"""Inject faults into stages for tests, demos and benchmarks: the ``SPECULATIVE_FAULT_INJECTION`` variable.

Production code asks the fault hook (``core/faults.py``), which every process that runs a stage fills in
from this variable; these helpers build its value from ``{"<dag_id>/<stage>": faults}`` rules (shell
wildcards allowed, first match wins) so that a test names the faults of the DAGs it runs next to them::

    with injected({"spec_q1/*": {"targets": {"local-b": {"factor": 4}}}}):
        dag.test()                            # this process, and the attempts it starts, inject them

    AirflowCluster(..., extra_env=fault_env({"e2e_q1_barrier/scan": {"barrier": True}}))   # subprocesses
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from airflow_provider_speculative.core.contract import FAULTS_ENV
from airflow_provider_speculative.core.faults import Faults, parse_faults


def fault_value(rules: Mapping[str, Mapping[str, Any]]) -> str:
    """The variable's JSON for ``rules`` (``{"<dag_id>/<stage>": faults}``), checked as every process parses it."""
    value = json.dumps({"stages": {pattern: dict(faults) for pattern, faults in rules.items()}})
    parse_faults(value, "fault rules")
    return value


def fault_env(rules: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The environment a subprocess (an Airflow component, a controller) needs to inject ``rules``."""
    return {FAULTS_ENV: fault_value(rules)}


@contextlib.contextmanager
def injected(rules: Mapping[str, Mapping[str, Any]]) -> Iterator[Faults]:
    """Inject ``rules`` in this process and every process it starts until the block ends; yield the hook."""
    before = os.environ.get(FAULTS_ENV)
    value = fault_value(rules)
    os.environ[FAULTS_ENV] = value
    try:
        yield parse_faults(value)
    finally:
        if before is None:
            os.environ.pop(FAULTS_ENV, None)
        else:
            os.environ[FAULTS_ENV] = before
