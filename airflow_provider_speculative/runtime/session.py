"""Open the attempt's Spark session: a classic driver (spark-submit) or a Spark Connect client.

The same stage application runs on either kind of target: the backend says which by setting
``SPECULATIVE_SPARK_REMOTE`` (a full ``sc://`` URL with this attempt's own ``session_id``) for
Connect targets. On Connect every operation of the attempt also carries a tag naming the attempt,
so a cancel can interrupt exactly its work on the shared server.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_speculative.core.contract import EXTRA_CONF_ENV, REMOTE_ENV
from airflow_provider_speculative.store.manifest import COMMIT_JAR_PREFIX, DIRECT_COMMIT_CLASS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Session settings every attempt gets unless the stage's spark_conf sets them (measured on one warm
# local[1] Connect server, bench/README.md):
# - Spark lists more than 32 explicitly named paths with a distributed job (0.3-0.4 s per read); an
#   exchange read names its files (producers x subpartitions: tens to thousands), which the driver
#   lists faster itself.
# - Hadoop's default local filesystem writes a .crc file beside every file, and an exchange write is
#   one file per subpartition: the raw local filesystem cut a 32-way write by 20-25 %. Integrity does not
#   depend on it: the manifest records every file's size and sha256, checked before it is read.
SESSION_DEFAULTS = {"spark.sql.sources.parallelPartitionDiscovery.threshold": "4096",
                    "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
                    "fs.file.impl.disable.cache": "true"}
# An attempt whose store is an object store: Hadoop's file output committer v2 moves each task's files into the
# output once, at task commit, where v1 moves them twice (task, then job commit); on S3 a move is a copy and a
# delete per file. v2's job commit is not atomic, which costs nothing here: the attempt's data prefix is its own,
# and its output counts only once its manifest, written after Spark's job succeeded, names the files.
OBJECT_STORE_DEFAULTS = {"mapreduce.fileoutputcommitter.algorithm.version": "2"}
# The session setting that names a write's commit protocol (backends/jvm/DirectCommitProtocol.java).
COMMIT_PROTOCOL_CONF = "spark.sql.sources.commitProtocolClass"


def attempt_tag(dag_id: str, stage: str, subtask: int, attempt: int) -> str:
    """The Spark operation tag of one attempt (Spark forbids commas in tags; keep it readable)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"speculative-{dag_id}-{stage}-{subtask}-{attempt}")


@dataclass
class OpenedSession:
    """A ready session and what the heartbeat reports about it."""

    spark: SparkSession
    app_id: str | None
    remote: bool


def session_defaults(local_store: bool) -> dict[str, str]:
    """:data:`SESSION_DEFAULTS` for an attempt whose store is local (a path) or not (an object store).

    s3a buffers an upload in a local file it creates through Hadoop's ``FileSystem.getLocal``, which
    casts the ``file`` filesystem to ``LocalFileSystem``: the raw one fails every s3a write there.
    """
    if local_store:
        return dict(SESSION_DEFAULTS)
    return {**{k: v for k, v in SESSION_DEFAULTS.items() if not k.startswith("fs.file.")}, **OBJECT_STORE_DEFAULTS}


def s3a_defaults(environ: Mapping[str, str], local_store: bool) -> dict[str, str]:
    """s3a's endpoint settings from the AWS environment (no secret), as Hadoop keys a classic driver's session sets.

    A spark-submit driver inherits the attempt's environment, where the stage's S3 credentials are
    (``[speculative] s3_conn_id`` or the launcher's own): s3a's default chain reads the keys from it, but not the
    endpoint, which a private S3 service (MinIO, Ceph, the suite's) needs. Only for a store on S3 or an endpoint
    in the environment; a ``--conf`` of the target or stage for the same key wins (the caller skips those).
    """
    from airflow_provider_speculative.store.roots import settings_from_environment, spark_s3_conf

    settings = settings_from_environment(environ)
    if local_store and not settings.endpoint_url:
        return {}
    prefix = "spark.hadoop."
    return {key.removeprefix(prefix): value for key, value in spark_s3_conf(settings).items()}


def open_session(app_name: str, spark_conf: dict[str, str], tag: str, local_store: bool = True) -> OpenedSession:
    """Open the session this process is meant to use (Connect if ``SPECULATIVE_SPARK_REMOTE`` is set)."""
    from pyspark.sql import SparkSession

    remote = os.environ.get(REMOTE_ENV)
    extra = controller_conf()
    defaults = session_defaults(local_store)
    if not remote:
        # spark-submit already passed the stage's spark_conf as --conf; the controller's go in before the
        # context starts, where listeners (OpenLineage's) read them.
        builder = SparkSession.builder.appName(app_name)
        for key, value in extra.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        submitted = spark.sparkContext.getConf()
        for key, value in defaults.items():
            if not submitted.contains(key):  # a --conf of the stage or target wins
                spark.conf.set(key, value)
        for key, value in s3a_defaults(os.environ, local_store).items():
            # Session settings reach the Hadoop configuration of every read and write (as fs.file.impl above).
            if not submitted.contains(f"spark.hadoop.{key}") and not submitted.contains(key):
                spark.conf.set(key, value)
        return OpenedSession(spark, spark.sparkContext.applicationId, remote=False)
    spark = SparkSession.builder.remote(remote).getOrCreate()
    spark.addTag(tag)
    for key, value in {**defaults, **spark_conf, **extra}.items():
        try:
            spark.conf.set(key, value)
        except Exception as exc:  # static confs (executor memory...) belong to the server, not a session
            # The key only: a conf value may be a credential, and the server's message may quote it.
            reason = str(exc).replace(str(value), "***") if str(value) else str(exc)
            print(f"[speculative] spark_conf {key} ignored on a Spark Connect target: {reason}", file=sys.stderr)
    try:
        app_id = spark.conf.get("spark.app.id")
    except Exception:
        app_id = None
    return OpenedSession(spark, app_id, remote=True)


@contextmanager
def session_setting(conf: Any, key: str, value: str) -> Iterator[None]:
    """Set session setting ``key`` to ``value`` for the ``with`` block, then put back what was there.

    ``conf`` is a session's ``spark.conf``. A value the application or the stage's ``spark_conf`` set is
    restored, not dropped; a setting that was unset is unset again.
    """
    previous = conf.get(key, None)
    conf.set(key, value)
    try:
        yield
    finally:
        # Restoring is best effort: a session that cannot take it back anymore is ending with the attempt.
        with suppress(Exception):
            if previous is None:
                conf.unset(key)
            else:
                conf.set(key, previous)


def direct_commit(conf: Any) -> AbstractContextManager[None]:
    """Exchange writes inside the block go through the provider's commit protocol, if the session has its jar.

    ``conf`` is a session's ``spark.conf``. The jar is looked for in ``spark.jars`` (one configuration read),
    where a failed class lookup would only show when the write fails; without it, Hadoop's committer.
    """
    jars = conf.get("spark.jars", "") or ""
    if not any(Path(jar).name.startswith(COMMIT_JAR_PREFIX) for jar in jars.split(",") if jar.strip()):
        return nullcontext()
    return session_setting(conf, COMMIT_PROTOCOL_CONF, DIRECT_COMMIT_CLASS)


def controller_conf() -> dict[str, str]:
    """The Spark properties the controller passed in the environment (``EXTRA_CONF_ENV``), named in the log.

    Only names and the parent run id are printed: a transport's properties may hold a credential.
    """
    raw = os.environ.get(EXTRA_CONF_ENV)
    if not raw:
        return {}
    try:
        conf = json.loads(raw)
    except ValueError:
        print(f"[speculative] {EXTRA_CONF_ENV} is not JSON; ignored", file=sys.stderr)
        return {}
    if not isinstance(conf, dict):
        return {}
    conf = {str(k): str(v) for k, v in conf.items()}
    parent = conf.get("spark.openlineage.parentRunId")
    print(f"[speculative] Spark properties from the controller: {', '.join(sorted(conf))}"
          + (f" (OpenLineage parent run {parent})" if parent else ""), file=sys.stderr)
    return conf
