"""A stage's controller as a process of its own, as a triggerer on one host of tests/hosts.py runs it.

``python -m tests.integration.hosts_controller <plan.json> <target_env.json>`` rebuilds the controller
from the plan in the store (a restarted triggerer does the same: it reattaches to what the store
records), steps it until the stage is decided and commits it. Exit 0 once committed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from airflow_provider_speculative.core.plan import load_plan
from airflow_provider_speculative.devtools.runner import run_stages


def main() -> None:
    """Run the plan at argv[1] with the target environment (JSON file) at argv[2]."""
    plan_path, env_path = Path(sys.argv[1]), Path(sys.argv[2])
    plan = load_plan(json.loads(plan_path.read_text()), str(plan_path))
    run_stages([plan], target_env=json.loads(env_path.read_text()), timeout=300)


if __name__ == "__main__":
    main()
