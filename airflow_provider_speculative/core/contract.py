"""The launcher-attempt contract: exit codes and environment names shared by backends, runtime and control.

Dependency-free, so the attempt's runtime (inside the Spark driver), the supervisor that watches it
and the controller that reads its end agree on one definition instead of retyped literals.
"""

from __future__ import annotations

from collections.abc import Mapping

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

# The standard AWS environment an attempt, its supervisor and its Spark driver open an S3 store and S3 sources
# with (store/roots.py ``settings_from_environment`` reads them; s3a's default chain reads the keys). They come as
# one set: credentials from two sources are never mixed (a connection's keys with another session's token).
S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
          "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")


def attempt_env(template: Mapping[str, str], target: Mapping[str, str], extra: Mapping[str, str],
                faults: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the controller adds to an attempt's environment: the target's, then the stage run's, then faults.

    ``template`` is the plan's launch template ``env``, ``target`` what the trigger resolved for the target
    (a Connect URL), ``extra`` the stage run's (sink connections, OpenLineage, the S3 credentials of
    ``[speculative] s3_conn_id``). A target whose own environment names any of :data:`S3_ENV` keeps its whole
    set: the connection's S3 variables are then left out, never mixed in.
    """
    own = {**template, **target}
    if any(name in own for name in S3_ENV):
        extra = {k: v for k, v in extra.items() if k not in S3_ENV}
    return {**own, **extra, **(faults or {})}


# pyspark's switches of a process into Spark Connect mode. Its session builder sets them in ``os.environ`` when the
# process opens a Connect session, and a child that inherits them opens a Connect session where it asks for a
# classic one (a spark-submit attempt then fails with CONNECT_URL_NOT_SET). An attempt learns its kind from
# REMOTE_ENV alone, so a launcher's switches are never passed on.
SPARK_CONNECT_MODE_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


def inherited_env(environ: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """The launcher's ``environ`` under an attempt's ``env``, whose :data:`S3_ENV` replaces the inherited set.

    The launcher's :data:`SPARK_CONNECT_MODE_ENV` is left out; ``env`` may still set them.
    """
    dropped = set(SPARK_CONNECT_MODE_ENV)
    if any(name in env for name in S3_ENV):
        dropped.update(S3_ENV)
    return {**{k: v for k, v in environ.items() if k not in dropped}, **env}
