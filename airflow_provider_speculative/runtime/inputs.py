"""How one attempt reads its inputs: its split of a source, its range of an upstream stage's exchange.

Blocking exchanges are read from the producers' commits; hybrid ones (FLIP-235) from the producers'
admitted attempts as they are admitted, recorded in the heartbeat before they are read so that a
withdrawn partition restarts exactly the attempts that read it. :class:`StageContext`
(``runtime/context.py``) is the application's facade over this, the output and fault injection.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.failover import failed_read, files_in_range, read_failure_reason
from airflow_provider_speculative.core.paths import is_object_url
from airflow_provider_speculative.core.plan import StagePlan, file_subpartitions, is_packed
from airflow_provider_speculative.core.states import HeartbeatPhase
from airflow_provider_speculative.runtime.heartbeat import Heartbeat
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import SUBPARTITION_COLUMN, PartitionError, verify_files_in
from airflow_provider_speculative.store.results import committed_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


class ExchangeFile(NamedTuple):
    """A verified exchange file to read: its URL for Spark, whether it is packed, and if so whether all its rows
    are in the reader's subpartition range (else they are filtered by ``_sp``)."""

    url: str
    packed: bool
    whole: bool


class StageInputs:
    """The inputs of one attempt of one subtask, read through its Spark session."""

    def __init__(self, plan: StagePlan, subtask: int, layout: StageLayout, config: SpeculativeConfig,
                 heartbeat: Heartbeat, notify: Callable[[], None], spark: Callable[[], SparkSession]) -> None:
        self.plan = plan
        self.stage = plan["stage"]
        self.spec: dict[str, Any] = plan["subtasks"][subtask]
        self.layout = layout
        self.config = config
        self.heartbeat = heartbeat
        self.notify = notify
        self.spark = spark
        # Seconds spent checking producer files against their manifests (the attempt's time breakdown).
        self.verify_seconds = 0.0
        # Hybrid inputs: producer stage -> {producer subtask: admitted attempt read}; in every heartbeat,
        # so the controller restarts exactly the attempts that read a partition later withdrawn (FLIP-1).
        self.reads: dict[str, dict[str, int]] = {}
        # Every exchange file handed to Spark, by its name (unique: Spark names it by its write job's UUID):
        # the producer stage, subtask and attempt a failed read of it is blamed on.
        self.opened: dict[str, tuple[str, int, int]] = {}

    def read(self, name: str) -> DataFrame:
        """Read input ``name``: this subtask's split of a source, or its range of an upstream stage."""
        inputs = self.spec["inputs"]
        if name not in inputs:
            raise KeyError(f"stage {self.stage!r} has no input {name!r} (inputs: {', '.join(sorted(inputs))})")
        shared = self.plan["inputs"][name]
        if shared["kind"] == "source":
            return self._read_source(name, shared, inputs[name])
        return self._read_exchange(name, shared, inputs[name])

    def _read_source(self, name: str, shared: dict[str, Any], mine: dict[str, Any]) -> DataFrame:
        # A broadcast source lists its files once, for every subtask.
        paths = [f["path"] for f in (shared["files"] if mine.get("broadcast") else mine["files"])]
        for path in paths:
            # An object-store file is checked by Spark's own read (its credentials, not this driver's).
            if not is_object_url(path) and not os.path.exists(path):
                raise FileNotFoundError(f"stage {self.stage!r} input {name!r}: source file {path} is missing")
        reader = self.spark().read.format(shared.get("format", "parquet"))
        if not paths:
            # An empty split still needs the dataset's schema.
            return reader.load(shared["schema_file"]).limit(0)
        return reader.load(paths)

    def _hybrid(self, name: str) -> bool:
        return self.plan["inputs"][name].get("mode") == "hybrid"

    def _upstream(self, name: str) -> StageLayout:
        return StageLayout.of_plan(self.plan, self.plan["inputs"][name]["upstream"], root=self.layout.store)

    def _admitted_producers(self, name: str, producers: Iterable[int]) -> dict[int, int]:
        """Hybrid input: the admitted attempt of each producer in ``producers`` that has one now.

        The producer's commit, once it is there for the plan this stage was planned on, is final;
        before it, the exclusive ``admitted.json`` markers: only a first finisher is ever read.
        """
        shared = self.plan["inputs"][name]
        upstream = self._upstream(name)
        committed = upstream.read_json(upstream.committed)
        if committed is not None and committed.get("fingerprint") == shared.get("upstream_fingerprint"):
            return {p: int(committed["subtasks"][str(p)]["attempt"]) for p in producers}
        found = {}
        for p in producers:
            marker = upstream.read_json(upstream.admitted(p))
            if marker is not None:
                found[p] = int(marker["attempt"])
        return found

    def _claim_reads(self, name: str, chosen: dict[int, int]) -> dict[int, int]:
        """Record (heartbeat first) that this attempt reads ``chosen``, then keep those still admitted.

        Recorded before reading and re-checked after: a withdrawal the controller saw before the beat
        is seen here, one after it restarts this attempt (core/hybrid.py ``restarts_on_withdrawal``).
        """
        stage = self.plan["inputs"][name]["upstream"]
        self.reads.setdefault(stage, {}).update({str(p): a for p, a in chosen.items()})
        self.heartbeat.beat(self.heartbeat.phase)
        still = self._admitted_producers(name, sorted(chosen))
        return {p: a for p, a in chosen.items() if still.get(p) == a}

    def wait_admitted(self, name: str, producers: range, have: set[int]) -> dict[int, int]:
        """Hybrid input: poll (up to ``hybrid_input_timeout``) until producers not in ``have`` are admitted."""
        deadline = time.time() + self.config.hybrid_input_timeout
        delay = 0.05
        while True:
            found = {p: a for p, a in self._admitted_producers(name, producers).items() if p not in have}
            if found:
                claimed = self._claim_reads(name, found)
                if claimed:
                    return claimed
            if time.time() > deadline:
                missing = sorted(set(producers) - have)
                raise TimeoutError(
                    f"pipeline {self.plan.get('pipeline')!r}, stage {self.stage!r}, input {name!r}: producer "
                    f"partitions {missing[:10]} of {self.plan['inputs'][name]['upstream']!r} not admitted within "
                    f"{self.config.hybrid_input_timeout:g}s (hybrid_input_timeout)")
            if self.heartbeat.phase != HeartbeatPhase.WAITING_FOR_INPUT:
                self.heartbeat.set_phase(HeartbeatPhase.WAITING_FOR_INPUT)
                self.notify()  # the controller stops this attempt's execution clock while it waits
            time.sleep(delay)
            delay = min(1.0, delay * 2)

    def _verified_urls(self, upstream: StageLayout, producer: int, attempt: int, files: list[dict[str, Any]],
                       stage: str, span: list[int] | None) -> list[ExchangeFile]:
        """Check a producer attempt's ``files`` by name against its manifest; their URLs for Spark.

        ``span`` is the reader's subpartition range (None: all), which tells whether a packed file is read whole.
        """
        store = self.layout.store
        data = upstream.name(upstream.data(producer, attempt))
        whole = [span is None or all(span[0] <= sp < span[1] for sp in file_subpartitions(f)) for f in files]
        # A packed file read in part is shared with other readers: its tail here, its pages' CRCs in Spark.
        shared = {f["path"] for f, w in zip(files, whole, strict=True) if is_packed(f) and not w}
        started = time.monotonic()
        try:
            verify_files_in(store, data, files, stage=stage, subtask=producer, attempt=attempt, by_tail=shared)
        finally:
            self.verify_seconds += time.monotonic() - started
        for f in files:
            self.opened[f["path"].rsplit("/", 1)[-1]] = (stage, producer, attempt)
        return [ExchangeFile(store.spark_url(f"{data}/{f['path']}"), is_packed(f), w)
                for f, w in zip(files, whole, strict=True)]

    def read_failure(self, exc: BaseException) -> PartitionError | None:
        """A :class:`PartitionError` blaming the producer whose file Spark failed to read in ``exc``; else None."""
        found = failed_read(str(exc), self.opened)
        if found is None:
            return None
        stage, producer, attempt = self.opened[found]
        return PartitionError(
            f"pipeline {self.plan.get('pipeline')!r}, stage {self.stage!r}: cannot read exchange file {found} of "
            f"stage {stage!r} subtask {producer} attempt {attempt}: {read_failure_reason(str(exc))}",
            stage=stage, subtask=producer, attempt=attempt)

    def _files_of(self, name: str, attempts: dict[int, int]) -> list[ExchangeFile]:
        """Verified files of these producer attempts with rows in this subtask's subpartition range."""
        shared, mine = self.plan["inputs"][name], self.spec["inputs"][name]
        upstream = self._upstream(name)
        paths: list[ExchangeFile] = []
        for producer, attempt in sorted(attempts.items()):
            files = files_in_range(committed_files(upstream, producer, attempt), mine["subpartitions"])
            paths += self._verified_urls(upstream, producer, attempt, files, shared["upstream"], mine["subpartitions"])
        return paths

    def _hybrid_files(self, name: str) -> list[ExchangeFile]:
        """Hybrid input read whole: wait until every producer of the range is admitted, then its files."""
        producers = range(*self.spec["inputs"][name]["producers"])
        chosen: dict[int, int] = {}
        while len(chosen) < len(producers):
            chosen.update(self.wait_admitted(name, producers, set(chosen)))
        if self.heartbeat.phase == HeartbeatPhase.WAITING_FOR_INPUT:
            self.heartbeat.set_phase(HeartbeatPhase.RUNNING)
            self.notify()
        return self._files_of(name, chosen)

    def read_incremental(self, name: str) -> Iterator[DataFrame]:
        """Yield input ``name`` piece by piece: one DataFrame per batch of newly admitted producers.

        For a hybrid exchange each batch holds the admitted producer partitions not read before
        (this subtask's subpartition range of them); it ends when every producer of the range was
        read. Any other input is yielded once, whole. The application combines the pieces (e.g. a
        partial aggregate per piece, merged at the end), so it starts before the slowest producer ends.
        """
        if name not in self.spec["inputs"] or self.plan["inputs"][name]["kind"] != "exchange" \
                or not self._hybrid(name):
            yield self.read(name)
            return
        from pyspark.sql.types import StructType

        producers = range(*self.spec["inputs"][name]["producers"])
        done: set[int] = set()
        while len(done) < len(producers):
            batch = self.wait_admitted(name, producers, done)
            done |= set(batch)
            if self.heartbeat.phase == HeartbeatPhase.WAITING_FOR_INPUT:
                self.heartbeat.set_phase(HeartbeatPhase.RUNNING)
                self.notify()
            paths = self._files_of(name, batch)
            if paths:
                schema = self._exchange_schema(name, batch)
                yield self._load(name, paths, StructType.fromJson(schema) if schema else None)

    def _exchange_schema(self, name: str, attempts: dict[int, int]) -> dict[str, Any] | None:
        """The input's schema: planned (blocking), else from an admitted producer's manifest (hybrid)."""
        shared = self.plan["inputs"][name]
        if shared.get("schema"):
            return shared["schema"]
        upstream = self._upstream(name)
        for producer, attempt in sorted(attempts.items()):
            manifest = upstream.read_json(upstream.manifest(producer, attempt))
            if manifest and manifest.get("schema"):
                return manifest["schema"]
        return None

    def exchange_files(self, name: str) -> list[str]:
        """The verified producer files this subtask reads for exchange input ``name``.

        Resolved from the producers' commits when the attempt starts (the plan names only producer and
        subpartition ranges): a partition re-produced by failover is read from its new attempt. A hybrid
        input waits until every producer of its range is admitted and reads the admitted attempts.
        A packed file carries its subpartition as a column ``_sp``; one that holds rows outside this subtask's
        range is refused (:class:`PartitionError`): its rows are not all this subtask's to read.
        """
        found = self._exchange_files(name)
        if not all(f.whole for f in found):
            raise PartitionError(
                f"pipeline {self.plan.get('pipeline')!r}, stage {self.stage!r}, input {name!r}: upstream "
                f"{self.plan['inputs'][name]['upstream']!r} wrote packed files (exchange_layout) that hold other "
                "subtasks' subpartitions too; read the input with ctx.read(), or set exchange_layout = partitioned",
                stage=self.plan["inputs"][name]["upstream"])
        return [f.url for f in found]

    def _exchange_files(self, name: str) -> list[ExchangeFile]:
        """:meth:`exchange_files` with each file's layout."""
        if self._hybrid(name):
            return self._hybrid_files(name)
        shared, mine = self.plan["inputs"][name], self.spec["inputs"][name]
        upstream = StageLayout.of_plan(self.plan, shared["upstream"], root=self.layout.store)
        committed = upstream.read_json(upstream.committed)
        if committed is None:
            raise PartitionError(f"stage {self.stage!r} input {name!r}: upstream {shared['upstream']!r} has no "
                                 f"committed result at {upstream.committed}", stage=shared["upstream"])
        paths: list[ExchangeFile] = []
        for producer in range(*mine["producers"]):
            part = committed["subtasks"][str(producer)]
            files = files_in_range(committed_files(upstream, producer, part["attempt"]), mine["subpartitions"])
            paths += self._verified_urls(upstream, producer, part["attempt"], files, shared["upstream"],
                                         mine["subpartitions"])
        return paths

    def _read_exchange(self, name: str, shared: dict[str, Any], mine: dict[str, Any]) -> DataFrame:
        from pyspark.sql.types import StructType

        paths = self._exchange_files(name)
        if not shared.get("schema") and self._hybrid(name):
            found = self._exchange_schema(name, {int(p): a for p, a in self.reads.get(shared["upstream"], {}).items()})
            shared = {**shared, "schema": found}
        schema = StructType.fromJson(shared["schema"]) if shared.get("schema") else None
        if not paths:
            if schema is None:
                raise PartitionError(f"stage {self.stage!r} input {name!r}: upstream {shared['upstream']!r} "
                                     "committed no schema", stage=shared["upstream"])
            return self.spark().createDataFrame([], schema)
        return self._load(name, paths, schema)

    def _load(self, name: str, files: list[ExchangeFile], schema: StructType | None) -> DataFrame:
        """One DataFrame of exchange ``files``: a packed file's rows filtered to this subtask's range.

        The filter on the sorted subpartition column lets Parquet's statistics skip the other subtasks'
        row groups and pages; the column itself is dropped, so both layouts read the same rows and columns.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.types import LongType, StructField, StructType

        def reader(fields: StructType | None) -> Any:
            read = self.spark().read.options(**EXCHANGE_READ_OPTIONS)
            return read.schema(fields) if fields is not None else read

        frames = []
        plain = [f.url for f in files if not f.packed]
        if plain:
            frames.append(reader(schema).parquet(*plain))
        whole = [f.url for f in files if f.packed and f.whole]
        if whole:
            frames.append(reader(schema).parquet(*whole).drop(SUBPARTITION_COLUMN))
        part = [f.url for f in files if f.packed and not f.whole]
        if part:
            start, stop = self.spec["inputs"][name]["subpartitions"]
            with_sp = StructType([*schema.fields, StructField(SUBPARTITION_COLUMN, LongType())]) \
                if schema is not None else None
            sp = F.col(SUBPARTITION_COLUMN)
            frames.append(reader(with_sp).parquet(*part).where((sp >= start) & (sp < stop)).drop(SUBPARTITION_COLUMN))
        result = frames[0]
        for frame in frames[1:]:
            result = result.unionByName(frame)
        return result


# Parquet's page CRC32s, checked as each page is read (off by default in parquet-mr): the pages of a packed file
# that a reader shares with others are checked only here.
EXCHANGE_READ_OPTIONS = {"parquet.page.verify-checksum.enabled": "true"}
