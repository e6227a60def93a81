"""The launcher-attempt contract: exit codes and environment names shared by backends, runtime and control.

Dependency-free, so the attempt's runtime (inside the Spark driver), the supervisor that watches it
and the controller that reads its end agree on one definition instead of retyped literals.
"""

from __future__ import annotations

# How an attempt's process exits (runtime/context.py sets them; backends/supervisor.py reads them).
EXIT_FAILED = 1
EXIT_PARTITION = 3  # an input partition is missing or corrupt: the controller reruns its producer
# The store is full / not writable: failure.json may not have been written, the code is the only record.
EXIT_STORE_FULL = 4
EXIT_STORE_NOT_WRITABLE = 5
EXIT_NODE_LOST = 6  # every executor of the attempt is gone (its worker died): the controller blocks the node
STORE_EXIT_CAUSES = {EXIT_STORE_FULL: "store is full", EXIT_STORE_NOT_WRITABLE: "store is not writable"}

# The Spark Connect server an attempt's session connects to (sc://host:port/;token=...).
REMOTE_ENV = "SPECULATIVE_SPARK_REMOTE"
# JSON object of Spark properties the controller adds to every attempt's session (OpenLineage's parent job
# and transport): passed in the environment, never in plan.json, because a transport may carry a credential.
EXTRA_CONF_ENV = "SPECULATIVE_EXTRA_SPARK_CONF"
# When the controller asked for the launch (epoch seconds): fault injection scales the elapsed time from it.
LAUNCHED_AT_ENV = "SPECULATIVE_LAUNCHED_AT"
# Fault injection (core/faults.py): the faults of a test, read by every process that runs a stage.
FAULTS_ENV = "SPECULATIVE_FAULT_INJECTION"
# Fault injection hold_end: the release file whose existence lets a successful end be recorded.
HOLD_END_ENV = "SPECULATIVE_HOLD_END"
