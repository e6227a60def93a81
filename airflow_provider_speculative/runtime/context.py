"""StageContext: what a stage's PySpark application uses to read its inputs and write its output.

A facade: the attempt's life cycle (heartbeat, session, exit code), its output and the manifest live
here; reading inputs is ``runtime/inputs.py`` (StageInputs) and fault injection ``runtime/faults.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from airflow_provider_speculative.core.config import AUTO, PACKED, PARTITIONED, SpeculativeConfig
from airflow_provider_speculative.core.contract import (
    EXIT_FAILED,
    EXIT_NODE_LOST,
    EXIT_PARTITION,
    EXIT_STORE_FULL,
    EXIT_STORE_NOT_WRITABLE,
)
from airflow_provider_speculative.core.copartition import exchange_output_problem, key_cast
from airflow_provider_speculative.core.faults import current as current_faults
from airflow_provider_speculative.core.paths import is_object_url, split_object_url
from airflow_provider_speculative.core.plan import StagePlan, load_plan, packed_index
from airflow_provider_speculative.core.states import HeartbeatPhase
from airflow_provider_speculative.exceptions import StoreError, StoreFullError, StoreNotWritableError
from airflow_provider_speculative.runtime.faults import inject_faults
from airflow_provider_speculative.runtime.heartbeat import Heartbeat, current_node
from airflow_provider_speculative.runtime.inputs import StageInputs
from airflow_provider_speculative.runtime.session import attempt_tag, direct_commit, open_session
from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend, StoreNotOwnedError
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout, stage_key
from airflow_provider_speculative.store.manifest import (
    SUBPARTITION_COLUMN,
    PartitionError,
    build_manifest_in,
    parquet_data_end,
    tail_digest,
    write_manifest_in,
)
from airflow_provider_speculative.store.roots import is_s3_root, read_plan_url, root_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


class NodeLostError(RuntimeError):
    """The attempt's executors were lost (or never came) for longer than ``executor_loss_timeout``."""

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message)
        self.node = node


class StageContext:
    """One attempt of one subtask, built from the submission's arguments (``--plan --subtask --attempt``)."""

    def __init__(self, plan: StagePlan, subtask: int, attempt: int, target: str) -> None:
        self.plan = plan
        self.stage: str = plan["stage"]
        self.subtask = subtask
        self.attempt = attempt
        self.target = target
        self.parallelism: int = plan["parallelism"]
        self.layout = StageLayout.of_plan(plan)
        self._node_label = current_node()
        self.node = self._node_label
        self.config = SpeculativeConfig.from_json(plan["config"])
        self._spec = plan["subtasks"][subtask]
        self._spark: SparkSession | None = None
        self._entered_at: float | None = None
        self._written = False
        self._remote = False
        self._session_info: dict[str, Any] = {}
        # Spark Connect progress, per operation (the server reports it with every result batch).
        self._remote_progress: dict[str, tuple[int, int, int]] = {}
        # Hosts that ran this attempt's executors (cluster masters), in the order they appeared.
        self._executor_hosts: list[str] = []
        self._executors_missing_since: float | None = None
        self._node_lost: NodeLostError | None = None
        self._heartbeat = Heartbeat(self.layout.name(self.layout.heartbeat(subtask, attempt)), self._progress,
                                    store=self.layout.store)
        self._inputs = StageInputs(plan, subtask, self.layout, self.config, self._heartbeat, self._notify,
                                   lambda: self.spark)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_argv(cls, argv: list[str] | None = None) -> StageContext:
        """Parse the arguments the controller passes to every attempt."""
        parser = argparse.ArgumentParser(description="airflow-provider-speculative stage attempt")
        parser.add_argument("--plan", required=True, help="the stage's plan.json: a path, or its s3:// URL")
        parser.add_argument("--subtask", required=True, type=int)
        parser.add_argument("--attempt", required=True, type=int)
        parser.add_argument("--target", default="")
        args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
        plan = load_plan(read_attempt_plan(args.plan), f"plan {args.plan}")
        if not 0 <= args.subtask < plan["parallelism"]:
            raise ValueError(f"subtask {args.subtask} out of range for parallelism {plan['parallelism']}")
        return cls(plan, args.subtask, args.attempt, args.target)

    @property
    def application_args(self) -> list[str]:
        """The stage's own application arguments (declared on the stage)."""
        return list(self.plan.get("application_args") or [])

    @property
    def logical_date(self) -> str | None:
        """The DAG run's logical date (ISO), if it has one."""
        return self.plan.get("logical_date")

    @property
    def input_bytes(self) -> int:
        """Bytes this subtask reads, as planned."""
        return int(self._spec.get("input_bytes") or 0)

    @property
    def spark(self) -> SparkSession:
        """The attempt's SparkSession (created on first use)."""
        if self._spark is None:
            target = (self.plan.get("targets") or {}).get(self.target) or {}
            # By store key: two grouped pipelines of a DAG may both have this stage name.
            key = self.layout.stage
            opened = open_session(f"{self.plan['dag_id']}.{key}[{self.subtask}]#{self.attempt}",
                                  target.get("spark_conf") or {},
                                  attempt_tag(self.plan["dag_id"], key, self.subtask, self.attempt),
                                  local_store=isinstance(self.layout.store, PosixBackend))
            self._spark, self._remote = opened.spark, opened.remote
            if opened.remote:
                self._spark.registerProgressHandler(self._on_remote_progress)  # type: ignore[arg-type]
            self._session_info = {"app_id": opened.app_id, "session_ready_at": time.time(),
                                  "remote": opened.remote}
            self._heartbeat.beat(self._heartbeat.phase)
            self._notify()  # the session is ready: app id and start-up time are known
        return self._spark

    # -- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> StageContext:
        self._entered_at = time.time()
        self._heartbeat.start()
        self._notify()  # now RUNNING
        try:
            # The session first: an application may build column expressions (F.col) before its first
            # read, and pyspark needs an active session for them (a bare AssertionError otherwise).
            _ = self.spark
        except BaseException as exc:
            # Raised in __enter__, __exit__ would not run: record the failure and exit as it would.
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def _notify(self) -> None:
        # By name: on a store without paths the stage directory is a StorePath no file-system call takes.
        changes.post(self.layout.store, self.layout.name(self.layout.dir), self.subtask, self.attempt)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None and not self._written:
            exc = RuntimeError(f"stage {self.stage!r} application returned without calling ctx.write()")
        if exc is not None and self._node_lost is not None:
            # The job failed because the watchdog cancelled it: the cause is the lost node.
            exc = self._node_lost
        elif exc is not None and not isinstance(exc, PartitionError):
            # Spark failed reading a producer's file (a page CRC, a truncated file): that partition is lost.
            exc = self._inputs.read_failure(exc) or exc
        if exc is not None:
            code = _exit_code(exc)
            kept = None
            if code == EXIT_STORE_FULL:
                # The partial output is useless without a manifest: free it so the failure can be
                # recorded. Files Spark's JVM still holds open are only freed when the attempt exits,
                # so the exit code carries the cause to the supervisor too.
                kept = self._free_output()
            # On a full or read-only store these writes fail too; the attempt must still exit FAILED.
            with contextlib.suppress(StoreError):
                self._record_failure(exc, kept)
            with contextlib.suppress(StoreError):
                self._heartbeat.stop(HeartbeatPhase.FAILED)
            self._stop_spark()
            print(f"[speculative] attempt failed: {exc}" + (f" ({kept})" if kept else ""), file=sys.stderr)
            os._exit(code)  # do not let Spark's shutdown hooks turn a failure into exit 0
        self._heartbeat.stop(HeartbeatPhase.FINISHED)
        self._stop_spark()

    def _stop_spark(self) -> None:
        if self._spark is not None:
            self._spark.stop()

    def _free_output(self) -> str | None:
        """Delete this attempt's partial output by an owned delete; None, or why (some of) it was kept.

        Runs in the Spark driver, which may serve a run this store does not own (planned by an older
        version): then the output stays, and the attempt's error says so rather than failing otherwise.
        """
        data = self.layout.data(self.subtask, self.attempt)
        try:
            if not self.layout.store.children(self.layout.name(data)):
                return None  # nothing written: nothing to free, whoever owns the run
            self.layout.delete_tree(data)
        except StoreNotOwnedError as exc:
            return f"its partial output was kept: {exc}"
        except (StoreError, OSError) as exc:
            return f"its partial output {data} was not all deleted: {exc}"
        return None

    def _record_failure(self, exc: BaseException, note: str | None = None) -> None:
        error = f"{type(exc).__name__}: {exc}" + (f" ({note})" if note else "")
        record = {"error": error, "traceback": traceback.format_exception(exc)[-5:], "at": time.time()}
        if isinstance(exc, PartitionError):
            # The controller names producers by stage name; a store read names them by store key.
            by_key = {stage_key(self.plan, str(u)): str(u) for u in self.plan.get("upstreams") or []}
            stage = by_key.get(exc.stage, exc.stage) if exc.stage is not None else None
            record.update(kind="partition", stage=stage, subtask=exc.subtask, attempt=exc.attempt)
        elif isinstance(exc, NodeLostError):
            record.update(kind="node_lost", node=exc.node)
        self.layout.replace_json(self.layout.failure(self.subtask, self.attempt), record)

    def _on_remote_progress(self, stages: Any = None, inflight_tasks: int = 0, operation_id: str | None = None,
                            done: bool = False, **_: Any) -> None:
        # Called by the Connect client (keyword arguments) with the operation's stages so far.
        stages = list(stages or [])
        self._remote_progress[operation_id or ""] = (sum(s.num_completed_tasks for s in stages),
                                                      sum(s.num_tasks for s in stages),
                                                      sum(s.num_bytes_read for s in stages))

    def _progress(self) -> dict[str, Any]:
        progress: dict[str, Any] = {"input_bytes": self.input_bytes, **self._session_info}
        if self._inputs.reads:
            progress["reads"] = {stage: dict(per) for stage, per in self._inputs.reads.items()}
        if self._remote and self._remote_progress:
            # Summed over the attempt's operations: the heartbeat shows the attempt's whole work so far.
            values = list(self._remote_progress.values())
            progress.update(tasks_done=sum(v[0] for v in values), tasks_total=sum(v[1] for v in values),
                            bytes_read=sum(v[2] for v in values))
        elif self._spark is not None and not self._remote and _running_context(self._spark) is not None:
            tracker = self._spark.sparkContext.statusTracker()
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info:
                    done += info.numCompletedTasks
                    total += info.numTasks
            progress.update(tasks_done=done, tasks_total=total)
            progress.update(self._executor_progress())
        return progress

    def _executor_progress(self) -> dict[str, Any]:
        """Where this attempt's executors run (its node), and the watchdog for executors lost with their node."""
        assert self._spark is not None
        sc = self._spark.sparkContext
        if (sc.master or "").startswith("local"):
            return {}  # the driver is the only executor: the node is the target's label
        hosts = executor_hosts(sc)
        for host in hosts:
            if host not in self._executor_hosts:
                self._executor_hosts.append(host)
        self.node = node_of(self._executor_hosts, self._node_label)
        out: dict[str, Any] = {"nodes": list(self._executor_hosts), "node": self.node, "executors": len(hosts)}
        now = time.time()
        if hosts:
            self._executors_missing_since = None
            return out
        if self._executors_missing_since is None:
            self._executors_missing_since = now
        timeout = self.config.executor_loss_timeout
        if timeout > 0 and now - self._executors_missing_since >= timeout and self._node_lost is None:
            what = (f"every executor of the attempt was lost (last on {', '.join(self._executor_hosts)})"
                    if self._executor_hosts else "no executor was granted to the attempt")
            self._node_lost = NodeLostError(
                f"node lost: {what} for {timeout:g}s (executor_loss_timeout); node {self.node}", self.node)
            print(f"[speculative] {self._node_lost}", file=sys.stderr)
        if self._node_lost is not None:
            # Unblock the main thread: its job fails, __exit__ records the lost node as the cause.
            sc.cancelAllJobs()
        return out

    # -- inputs -----------------------------------------------------------------------------

    @property
    def inputs(self) -> StageInputs:
        """How this attempt reads its inputs (``runtime/inputs.py``)."""
        return self._inputs

    def read(self, name: str) -> DataFrame:
        """Read input ``name``: this subtask's split of a source, or its range of an upstream stage."""
        return self._inputs.read(name)

    def read_incremental(self, name: str) -> Iterator[DataFrame]:
        """Yield input ``name`` piece by piece: one DataFrame per batch of newly admitted producers.

        For a hybrid exchange each batch holds the admitted producer partitions not read before
        (this subtask's subpartition range of them); it ends when every producer of the range was
        read. Any other input is yielded once, whole. The application combines the pieces (e.g. a
        partial aggregate per piece, merged at the end), so it starts before the slowest producer ends.
        """
        return self._inputs.read_incremental(name)

    def exchange_files(self, name: str) -> list[str]:
        """The verified producer files this subtask reads for exchange input ``name``."""
        return self._inputs.exchange_files(name)

    # -- output -----------------------------------------------------------------------------

    def write(self, df: DataFrame) -> None:
        """Write this attempt's output: hash-partitioned for the consumers, then the manifest last."""
        from pyspark.sql import functions as F

        if self._written:
            raise RuntimeError(f"stage {self.stage!r}: ctx.write() may be called once per attempt")
        store: StoreBackend = self.layout.store
        data_dir = self.layout.data(self.subtask, self.attempt)
        data = self.layout.name(data_dir)
        output = self.plan["output"]
        key = output.get("key") or []
        # An exchange's schema is read back from the files Spark wrote (their footers carry it): asking the
        # server for df.schema first is one more analysis of the whole plan, ~0.5 s per attempt on Connect.
        schema_json = df.schema.jsonValue() if output.get("sink") else None
        sink_info: dict[str, Any] | None = None
        packed = bool(key) and not output.get("sink") and output.get("layout") == PACKED
        write_started = time.time()
        # A session-wide setting, so set for this write alone: an application's own writes keep their committer.
        commit = (direct_commit(self.spark.conf) if not output.get("sink") and output.get("commit", AUTO) == AUTO
                  else contextlib.nullcontext())
        try:
            with commit:
                if output.get("sink"):
                    sink_info = self._sink_writer(output["sink"], data_dir).write(df)
                elif key:
                    sp = F.pmod(F.xxhash64(*self._hashed_key(df, key, output.get("hash"))),
                                F.lit(int(output["max_parallelism"])))
                    # No repartition: Spark's writer sorts each task's rows by subpartition and writes one file per
                    # subpartition it holds, so the output is not shuffled once more before it is written.
                    partitioned = df.withColumn(SUBPARTITION_COLUMN, sp)
                    if packed:
                        # One file per Spark task, sorted so that each subpartition is a run of rows: a reader's
                        # filter on _sp skips the others' row groups and pages by their statistics.
                        partitioned.sortWithinPartitions(SUBPARTITION_COLUMN).write \
                            .options(**EXCHANGE_WRITE_OPTIONS, **PACKED_WRITE_OPTIONS).parquet(store.spark_url(data))
                    else:
                        partitioned.write.options(**EXCHANGE_WRITE_OPTIONS).partitionBy(SUBPARTITION_COLUMN) \
                            .parquet(store.spark_url(data))
                else:
                    df.coalesce(1).write.options(**EXCHANGE_WRITE_OPTIONS).parquet(store.spark_url(data))
        except Exception as exc:
            # Spark reports a full disk as a long Java trace; name the store and the cause instead.
            store_error = store_write_error(store.spark_url(data), exc)
            if store_error is None:
                raise
            raise store_error from exc
        self._inject_faults()
        spark_done = time.time()
        manifest = build_manifest_in(store, data, stage=self.stage, subtask=self.subtask, attempt=self.attempt,
                                     node=self.node, schema=schema_json, input_bytes=self.input_bytes,
                                     written_at=time.time(), sink=sink_info)
        if key and not output.get("sink"):
            # A timestamp key hashes as its text in the session time zone: the consumer's plan compares the
            # zones its producers wrote in (core/copartition.py) and refuses a mix.
            manifest["partitioning"] = {"key": list(key), "max_parallelism": int(output["max_parallelism"]),
                                        "hash": output.get("hash") or "legacy",
                                        "session_time_zone": self.spark.conf.get("spark.sql.session.timeZone"),
                                        "layout": PACKED if packed else PARTITIONED}
        manifest["records"], written_schema = _read_footers(store, data, manifest["files"], packed=packed)
        if manifest["schema"] is None:
            # No file (an empty output) has no footer: only then ask the server.
            manifest["schema"] = written_schema if written_schema is not None else df.schema.jsonValue()
        if sink_info and sink_info.get("records") is not None and not manifest["files"]:
            manifest["records"] = sink_info["records"]
        manifest["timings"] = self._timings(write_started, spark_done)
        self._written = True
        write_manifest_in(store, self.layout.name(self.layout.manifest(self.subtask, self.attempt)), manifest)

    def _hashed_key(self, df: DataFrame, key: list[str], scheme: str | None) -> list[Column]:
        """The key columns as the plan's hash scheme hashes them (core/copartition.py ``key_cast``).

        Choosing by type costs one analysis of the query (``df.schema``); formatting every integer key
        as text would cost more on any but the smallest outputs.
        """
        from pyspark.sql import functions as F

        types = {field.name: field.dataType.jsonValue() for field in df.schema.fields}
        problem = exchange_output_problem(list(types), key, SUBPARTITION_COLUMN)
        if problem:
            raise ValueError(f"pipeline {self.plan.get('pipeline')!r}, stage {self.stage!r}: {problem}")
        columns = []
        for k in key:
            to, lenient = key_cast(types[k], scheme)
            columns.append(F.col(k).try_cast(to) if lenient else F.col(k).cast(to))
        return columns

    def _timings(self, write_started: float, spark_done: float) -> dict[str, float | None]:
        """Where this attempt's time went, as epoch times and seconds (core/breakdown.py reads them).

        Spark evaluates lazily: the application's reads and transformations run inside the write's job,
        so ``write_s`` is compute and exchange write together; ``app_s`` is the application's own Python
        before it called ``ctx.write`` (planning its query, verifying inputs: ``verify_s``).
        """
        now = time.time()
        ready = self._session_info.get("session_ready_at")
        return {"entered_at": self._entered_at, "session_ready_at": ready, "write_started_at": write_started,
                "verify_s": round(self._inputs.verify_seconds, 4),
                "write_s": round(spark_done - write_started, 4), "manifest_s": round(now - spark_done, 4)}

    def _sink_writer(self, sink_json: dict[str, Any], data_dir: Path) -> Any:
        from airflow_provider_speculative.sinks.base import InitializationContext, Sink

        context = InitializationContext(
            task_number=self.subtask, num_tasks=self.parallelism, attempt_number=self.attempt,
            dag_id=self.plan["dag_id"], run_id=self.plan["run_id"], stage=self.layout.stage, data_dir=data_dir,
            logical_date=self.logical_date, data_url=self.layout.store.spark_url(self.layout.name(data_dir)))
        return Sink.from_json(sink_json).create_writer(context)

    def _inject_faults(self) -> None:
        faults = current_faults().of_stage(self.layout.dag_id, self.layout.stage)
        inject_faults(faults, self.target, self.subtask, self.attempt, self._heartbeat, self.layout,
                      lambda: self._node_lost)


def read_attempt_plan(location: str) -> Any:
    """The plan.json an attempt is started with: a local path (a POSIX store), or an ``s3://`` URL read by name.

    An attempt runs without Airflow: a store on S3 is opened with the AWS environment's credentials
    (``store/roots.py``), never a connection. The plan must name the store it was read from (its ``store_root``),
    so the attempt writes where its plan is. FileNotFoundError naming ``location`` when there is no plan there.
    """
    if not is_s3_root(location):
        plan = read_json(location)
        if plan is None:
            raise FileNotFoundError(f"plan not found: {location}")
        return plan
    store, _, plan = read_plan_url(location)
    if plan is None:
        raise FileNotFoundError(f"plan not found: {location}")
    recorded = plan.get("store_root") if isinstance(plan, dict) else None
    if not isinstance(recorded, str) or not is_s3_root(recorded) or root_url(recorded) != root_url(store.url):
        raise StoreError(f"plan {location} names another store ({recorded!r}): an attempt writes where its plan is")
    return plan


# An exchange is written once and read once, like a Spark shuffle file, which has no dictionaries. Its
# columns are mostly join keys and measures with few repeats, so Parquet's dictionary is built for every
# file and column chunk and then abandoned (bench/README.md, exchange_write.py). Sinks keep the defaults.
EXCHANGE_WRITE_OPTIONS = {"parquet.enable.dictionary": "false"}
# A packed file's subpartition column is sorted: as a dictionary it is a few bytes per page.
# Its pages carry CRC32s (parquet-mr's default, stated so that no session setting turns them off): a reader
# of part of a packed file checks the pages it reads by them, and only the file's tail by SHA-256.
PACKED_WRITE_OPTIONS = {f"parquet.enable.dictionary#{SUBPARTITION_COLUMN}": "true",
                        "parquet.page.write-checksum.enabled": "true"}

_FULL_MESSAGES = ("No space left on device", "Disk quota exceeded")
_DENIED_MESSAGES = ("Permission denied", "Read-only file system", "Mkdirs failed to create")
# What s3a (AWS SDK) and S3-compatible services put in a failed write's message.
_S3_DENIED = ("AccessDenied", "Access Denied", "Status Code: 403", "403 Forbidden")
_S3_QUOTA = ("QuotaExceeded", "XMinioStorageFull", "Storage backend has reached its minimum free drive threshold")
_S3_THROTTLED = ("SlowDown", "Slow Down", "Status Code: 503")


def _running_context(spark: Any) -> Any:
    """The session's SparkContext, or None once stopped (an unmodified script's ``spark.stop()``).

    Then the heartbeat keeps the session's app id and start-up time without the live task counts.
    """
    sc = spark.sparkContext
    return sc if sc is not None and getattr(sc, "_jsc", None) is not None else None


def executor_hosts(sc: Any) -> list[str]:
    """Hosts of the application's live executors, driver excluded (sorted, distinct)."""
    hosts: set[str] = set()
    # statusStore lists executors with their ids, so the driver can be told apart even on a shared host.
    executors = sc._jsc.sc().statusStore().executorList(True).iterator()
    while executors.hasNext():
        executor = executors.next()
        if executor.id() != "driver":
            hosts.add(executor.hostPort().rsplit(":", 1)[0])
    return sorted(hosts)


def node_of(hosts: list[str], label: str) -> str:
    """The attempt's node: the one host that ran its executors, else the target's node label."""
    return hosts[0] if len(hosts) == 1 else label


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, NodeLostError):
        return EXIT_NODE_LOST
    if isinstance(exc, PartitionError):
        return EXIT_PARTITION
    if isinstance(exc, StoreFullError):
        return EXIT_STORE_FULL
    if isinstance(exc, StoreNotWritableError):
        return EXIT_STORE_NOT_WRITABLE
    return EXIT_FAILED


def store_write_error(path: str | Path, exc: BaseException) -> StoreError | None:
    """A :class:`StoreError` naming ``path`` if writing it failed because the store is full or not writable.

    ``path`` may be an ``s3a://`` URL (a store on S3): then S3's refusals count, access denied (403), a quota
    or throttling (SlowDown, 503), and only when the message names that output (not a source read in the job).
    """
    if isinstance(exc, StoreError):
        return exc
    text = str(exc)
    if is_object_url(str(path)):
        return _object_store_write_error(str(path), text)
    code = getattr(exc, "errno", None)
    full = code in (errno.ENOSPC, errno.EDQUOT) or any(m in text for m in _FULL_MESSAGES)
    denied = code in (errno.EACCES, errno.EROFS, errno.EPERM) or any(m in text for m in _DENIED_MESSAGES)
    if not (full or denied):
        return None
    # Spark names the output path it failed on ("Task failed while writing rows to file:/..."); a full
    # spill directory elsewhere must not be blamed on the store, so without the path look at the store.
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    names_store = str(path) in text
    if full and (names_store or shutil.disk_usage(probe).free == 0):
        return StoreFullError(f"store is full: cannot write {path}: No space left on device")
    if denied and (names_store or not os.access(probe, os.W_OK)):
        return StoreNotWritableError(
            f"store is not writable: cannot write {path}: permission denied or read-only file system")
    return None


def _object_store_write_error(url: str, text: str) -> StoreError | None:
    """:func:`store_write_error` for an output on S3: what the service refused, without the Java trace."""
    bucket, key = split_object_url(url)
    if f"{bucket}/{key}" not in text:
        return None
    # Quota first: Ceph's RGW answers an exceeded quota with a 403 too.
    if any(m in text for m in _S3_QUOTA):
        return StoreFullError(f"store is full: cannot write {url}: the bucket's quota is exceeded")
    if any(m in text for m in _S3_DENIED):
        return StoreNotWritableError(f"store is not writable: cannot write {url}: access denied (HTTP 403)")
    if any(m in text for m in _S3_THROTTLED):
        return StoreError(f"cannot write {url}: S3 throttled the writes (SlowDown, HTTP 503)")
    return None


# Where Spark keeps the DataFrame schema (StructType JSON) in the key-value metadata of a Parquet file it wrote.
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def _read_footers(store: StoreBackend, data: str, files: list[dict[str, Any]], *,
                  packed: bool = False) -> tuple[int, dict[str, Any] | None]:
    """Count each Parquet file's records (into its entry) and return the total and the Spark schema of the first.

    ``files`` are the manifest's, below prefix ``data``; footers are read through the store's pyarrow file system.
    A ``packed`` file's entry gets its subpartition index too (:func:`packed_index`), and the schema returned
    is the rows' own, without the subpartition column. A packed entry checked by SHA-256 (a POSIX store) also
    records its ``tail``: where its pages end and the SHA-256 of the bytes after, which readers of a part of
    it check instead of the whole file (their Spark reads verify the pages' CRCs).
    """
    import json

    total = 0
    schema: dict[str, Any] | None = None
    for entry in files:
        name = f"{data}/{entry['path']}"
        if packed:
            metadata, counts = store.parquet_value_counts(name, SUBPARTITION_COLUMN)
            entry["subpartitions"] = packed_index(int(entry["size"]), counts)
            if entry.get("sha256"):
                offset = parquet_data_end(metadata)
                digest = tail_digest(store, name, offset, int(entry["size"])) if offset < entry["size"] else None
                if digest is None:
                    raise StoreError(f"{store.describe(name)}: its Parquet pages end at byte {offset} of "
                                     f"{entry['size']}; it changed while its manifest was written")
                entry["tail"] = {"offset": offset, "sha256": digest}
        else:
            metadata = store.parquet_metadata(name)
        entry["records"] = metadata.num_rows
        total += metadata.num_rows
        if schema is None and SPARK_SCHEMA_KEY in (metadata.metadata or {}):
            schema = json.loads(metadata.metadata[SPARK_SCHEMA_KEY])
    if packed and schema is not None:
        schema = {**schema, "fields": [f for f in schema["fields"] if f.get("name") != SUBPARTITION_COLUMN]}
    return total, schema
