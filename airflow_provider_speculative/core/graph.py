"""The stage graph: stages, sources, exchanges, validation, order and exchange ranges."""

from __future__ import annotations

import heapq
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.parallelism import AUTO
from airflow_provider_speculative.core.paths import source_root_problem, source_url_problem, url_scheme
from airflow_provider_speculative.exceptions import ConfigError, PipelineError

Distribution = Literal["all_to_all", "pointwise", "broadcast"]
Mode = Literal["blocking", "hybrid"]

# Flink's upper bound for max parallelism (key groups); more subtasks than this is a typo, not a plan.
MAX_PARALLELISM = 32768


@dataclass(frozen=True)
class SourceSpec:
    """An external dataset read by a stage and split across its subtasks by file."""

    path: str
    format: str = "parquet"
    # Sources only read, so concurrent attempts never interfere with them.
    supports_concurrent_attempts: bool = True
    # Every subtask reads all files (a small dimension table beside a partitioned input), not a split.
    broadcast: bool = False

    def to_json(self) -> dict[str, Any]:
        """Serialise for plan.json."""
        return {"kind": "source", "path": self.path, "format": self.format,
                "supports_concurrent_attempts": self.supports_concurrent_attempts, "broadcast": self.broadcast}


@dataclass(frozen=True)
class ExchangeSpec:
    """An edge from an upstream stage: ``all_to_all`` on a key, ``pointwise`` or ``broadcast``; blocking or hybrid."""

    upstream: str
    distribution: Distribution = "all_to_all"
    key: tuple[str, ...] = ()
    mode: Mode = "blocking"
    # (id, name) of the Pipeline whose stage handle made this edge; not part of the plan (to_json).
    origin: tuple[int, str] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """Serialise for plan.json."""
        return {"kind": "exchange", "upstream": self.upstream, "distribution": self.distribution,
                "key": list(self.key), "mode": self.mode}


@dataclass
class StageSpec:
    """One stage: a PySpark application run as ``parallelism`` subtasks over its inputs."""

    name: str
    application: str
    # An int, or "auto": decided when the stage is planned from the bytes it reads (core/parallelism.py).
    parallelism: int | str
    inputs: dict[str, SourceSpec | ExchangeSpec] = field(default_factory=dict)
    max_parallelism: int = 32
    # False when the pipeline chose max_parallelism (its default): it may then be aligned with the other
    # producers of a join (align_copartitioned); a declared value is never changed, only checked.
    max_parallelism_declared: bool = True
    deterministic: bool = True
    config: dict[str, Any] = field(default_factory=dict)
    application_args: tuple[str, ...] = ()
    spark_conf: dict[str, str] = field(default_factory=dict)
    # Lower bound of an "auto" parallelism (None: 1); max_parallelism is its upper bound.
    min_parallelism: int | None = None
    # The stage merges partial results per key (e.g. an aggregation with a merge step downstream), so
    # one skewed subpartition of an all_to_all input may be split across consumers by producer range.
    splittable_skew: bool = False

    @property
    def auto(self) -> bool:
        """True if the parallelism is decided at plan time."""
        return self.parallelism == AUTO


@dataclass
class PipelineGraph:
    """A validated DAG of stages."""

    name: str
    stages: dict[str, StageSpec]
    config: dict[str, Any] = field(default_factory=dict)
    # Put before a stage's name to make its directory in a DAG run's store: empty, or the task group prefix
    # of a pipeline compiled as a TaskGroup ("p1."), so two pipelines of one DAG may name stages alike.
    store_prefix: str = ""

    def store_key(self, stage: str) -> str:
        """The directory name of ``stage`` in a DAG run's store (its task id in a grouped pipeline)."""
        return self.store_prefix + stage

    def to_json(self) -> dict[str, Any]:
        """The whole graph as JSON values (what a stage started in the triggerer rebuilds it from)."""
        return {"name": self.name, "config": self.config,
                "stages": {name: _stage_to_json(spec) for name, spec in self.stages.items()},
                **({"store_prefix": self.store_prefix} if self.store_prefix else {})}

    @staticmethod
    def from_json(data: dict[str, Any]) -> PipelineGraph:
        """Rebuild a graph serialised by :meth:`to_json` (already validated when it was serialised)."""
        return PipelineGraph(name=data["name"], config=dict(data.get("config") or {}),
                             stages={name: _stage_from_json(spec) for name, spec in data["stages"].items()},
                             store_prefix=str(data.get("store_prefix") or ""))

    def validate(self) -> None:
        """Raise :class:`PipelineError` for unknown inputs, bad parallelism, bad exchanges or cycles."""
        for stage in self.stages.values():
            where = f"pipeline {self.name!r}, stage {stage.name!r}"
            if stage.auto:
                _check_count(where, "max_parallelism", stage.max_parallelism, 1)
                self._validate_auto(where, stage)
            else:
                if isinstance(stage.parallelism, str):
                    raise PipelineError(f"{where}: parallelism must be an integer or 'auto', got {stage.parallelism!r}")
                _check_count(where, "parallelism", stage.parallelism, 1)
                _check_count(where, "max_parallelism", stage.max_parallelism, 1)
                if stage.min_parallelism is not None:
                    raise PipelineError(f"{where}: min_parallelism applies only to parallelism='auto' "
                                        f"(parallelism is {stage.parallelism!r})")
            if not isinstance(stage.splittable_skew, bool):
                raise PipelineError(f"{where}: splittable_skew must be True or False, got {stage.splittable_skew!r}")
            if stage.splittable_skew and sum(1 for s in stage.inputs.values() if isinstance(s, ExchangeSpec)
                                             and s.distribution == "all_to_all") != 1:
                # Splitting one side of a join would need the other side replicated (not supported).
                raise PipelineError(f"{where}: splittable_skew needs exactly one all_to_all input")
            if isinstance(stage.parallelism, int) and stage.max_parallelism < stage.parallelism:
                raise PipelineError(
                    f"{where}: max_parallelism ({stage.max_parallelism!r}) must be >= "
                    f"parallelism ({stage.parallelism})")
            if not isinstance(stage.application, str) or not stage.application.strip() \
                    or stage.application.strip() == "None":
                raise PipelineError(f"{where}: application is required (a path or URL of a PySpark file), "
                                    f"got {stage.application!r}")
            _check_application(where, stage.application)
            for scope, overrides in (("stage", stage.config), ("pipeline", self.config)):
                if "store_path" in (overrides or {}):
                    # status, rerun, gc and the UI find runs through the deployment's store only.
                    raise PipelineError(f"{where}: store_path cannot be set per {scope}; set [speculative] "
                                        "store_path (airflow.cfg or AIRFLOW__SPECULATIVE__STORE_PATH) for the "
                                        "deployment, where the CLI and the UI look")
            for input_name, spec in stage.inputs.items():
                if isinstance(spec, SourceSpec):
                    _check_source(f"{where}, input {input_name!r}", spec)
            for input_name, spec in stage.inputs.items():
                if isinstance(spec, ExchangeSpec):
                    self._validate_exchange(where, input_name, spec, stage)
            self._check_input_layout(where, stage)
            try:
                SpeculativeConfig().with_overrides(stage.config, where)
            except ConfigError as exc:
                raise PipelineError(str(exc)) from None
        try:
            SpeculativeConfig().with_overrides(self.config, f"pipeline {self.name!r}")
        except ConfigError as exc:
            raise PipelineError(str(exc)) from None
        self._check_keys()
        self.topological_order()

    def _validate_auto(self, where: str, stage: StageSpec) -> None:
        minimum = 1 if stage.min_parallelism is None else stage.min_parallelism
        _check_count(where, "min_parallelism", minimum, 1)
        if stage.max_parallelism < minimum:
            raise PipelineError(f"{where}: max_parallelism ({stage.max_parallelism}) must be >= min_parallelism "
                                f"({minimum}) with parallelism='auto'")
        for name, spec in stage.inputs.items():
            if isinstance(spec, ExchangeSpec) and spec.distribution == "all_to_all" and not stage.splittable_skew \
                    and spec.upstream in self.stages and minimum > self.stages[spec.upstream].max_parallelism:
                raise PipelineError(
                    f"{where}: min_parallelism {minimum} exceeds the {self.stages[spec.upstream].max_parallelism} "
                    f"subpartitions of all_to_all input {name!r} ({spec.upstream!r}'s max_parallelism)")
        try:
            SpeculativeConfig().with_overrides(self.config, f"pipeline {self.name!r}").with_overrides(
                stage.config, where)
        except ConfigError as exc:
            raise PipelineError(f"{where}: parallelism='auto': {exc}") from None

    def _validate_exchange(self, where: str, input_name: str, spec: ExchangeSpec, stage: StageSpec) -> None:
        if spec.upstream not in self.stages:
            known = ", ".join(sorted(self.stages)) or "none"
            raise PipelineError(
                f"{where}: input {input_name!r} reads unknown stage {spec.upstream!r} (stages: {known})")
        if spec.upstream == stage.name:
            raise PipelineError(f"{where}: input {input_name!r} reads its own stage (cycle)")
        if spec.distribution not in ("all_to_all", "pointwise", "broadcast"):
            raise PipelineError(f"{where}: input {input_name!r} has unknown distribution {spec.distribution!r}")
        if spec.mode not in ("blocking", "hybrid"):
            raise PipelineError(f"{where}: input {input_name!r} has unknown mode {spec.mode!r}")
        if spec.distribution == "all_to_all":
            key = spec.key
            if not key or not isinstance(key, tuple) \
                    or not all(isinstance(k, str) and k.strip() and k == k.strip() for k in key):
                raise PipelineError(f"{where}: all_to_all input {input_name!r} needs a key: a column name or a "
                                    f"list of column names, none empty or with surrounding spaces; got {key!r}")
            producer = self.stages[spec.upstream]
            if isinstance(stage.parallelism, int) and stage.parallelism > producer.max_parallelism:
                # The producer hash-partitions into max_parallelism subpartitions: a consumer reads at least one.
                raise PipelineError(
                    f"{where}: all_to_all input {input_name!r} has {stage.parallelism} consumers but its producer "
                    f"{spec.upstream!r} writes only max_parallelism={producer.max_parallelism} subpartitions; "
                    f"raise {spec.upstream!r}'s max_parallelism or lower {stage.name!r}'s parallelism")
        if spec.distribution == "pointwise":
            self._validate_pointwise(where, input_name, self.stages[spec.upstream], stage)
        if spec.distribution == "broadcast" and spec.mode != "blocking":
            # A broadcast input is read whole by every subtask: there is no partition to start on early.
            raise PipelineError(f"{where}: broadcast input {input_name!r} must be blocking, got mode {spec.mode!r}")

    def _check_input_layout(self, where: str, stage: StageSpec) -> None:
        """The co-partitioning contract: rows that must meet in one subtask are routed to the same subtask.

        A stage's inputs are hash-partitioned (``all_to_all``), split (a source split by file, or
        ``pointwise``) or broadcast (read whole by every subtask). Hash-partitioned inputs must agree on
        subpartition count and key arity (their keys are compared position by position); a split input
        next to a hash-partitioned one, or two split inputs, would each give a subtask unrelated rows, so
        they are refused with a hint to declare the small side ``broadcast(...)``.
        """
        partitioned = [(n, s) for n, s in stage.inputs.items()
                       if isinstance(s, ExchangeSpec) and s.distribution == "all_to_all"]
        split = [(n, s) for n, s in stage.inputs.items()
                 if (isinstance(s, SourceSpec) and not s.broadcast)
                 or (isinstance(s, ExchangeSpec) and s.distribution == "pointwise")]
        broadcast = [n for n, s in stage.inputs.items() if (isinstance(s, SourceSpec) and s.broadcast)
                     or (isinstance(s, ExchangeSpec) and s.distribution == "broadcast")]
        # One subtask reads every split input whole (all files, every producer): nothing can miss a partner.
        single = not stage.auto and stage.parallelism == 1
        if partitioned and split and not single:
            (name, split_spec), (other, hashed) = split[0], partitioned[0]
            raise PipelineError(
                f"{where}: input {name!r} is {_split_kind(split_spec)} while input {other!r} is hash-partitioned on "
                f"{list(hashed.key)}, so each subtask would see only its own part of {name!r} and rows would "
                f"miss their partners. Declare it broadcast({_broadcast_hint(split_spec)}) to give every subtask "
                f"all of it, or hash-partition it too: all_to_all(<its stage>, key=...)")
        if len(split) > 1 and not single:
            (name, spec), (other, other_spec) = split[0], split[1]
            raise PipelineError(
                f"{where}: inputs {name!r} ({_split_kind(spec)}) and {other!r} ({_split_kind(other_spec)}) are "
                f"split independently, so a subtask would see unrelated parts of each. Declare the smaller one "
                f"broadcast(...), or partition both with all_to_all on the join key (a union of two sources: one "
                f"glob over both, or one stage each)")
        if broadcast and not partitioned and not split and (stage.auto or stage.parallelism != 1):
            raise PipelineError(
                f"{where}: every input ({', '.join(repr(n) for n in broadcast)}) is broadcast, so each of its "
                f"subtasks would read and write the same rows; use parallelism=1")
        if len(partitioned) < 2:
            return
        first, first_spec = partitioned[0]
        first_producer = self.stages.get(first_spec.upstream)
        for name, spec in partitioned[1:]:
            if len(spec.key) != len(first_spec.key):
                raise PipelineError(
                    f"{where}: all_to_all inputs {first!r} (key {list(first_spec.key)}) and {name!r} (key "
                    f"{list(spec.key)}) have keys of different length; co-partitioned inputs are matched key "
                    f"column by key column, in order")
            moved = [column for position, column in enumerate(spec.key)
                     if column in first_spec.key and first_spec.key.index(column) != position]
            if moved:
                raise PipelineError(
                    f"{where}: all_to_all inputs {first!r} (key {list(first_spec.key)}) and {name!r} (key "
                    f"{list(spec.key)}) name column {moved[0]!r} at different positions; co-partitioned inputs are "
                    f"hashed key column by key column in order, so a join by name would miss partners. List the "
                    f"key columns in the same order on both inputs")
            producer = self.stages.get(spec.upstream)
            if first_producer is not None and producer is not None \
                    and producer.max_parallelism != first_producer.max_parallelism:
                raise PipelineError(
                    f"{where}: all_to_all inputs {first!r} and {name!r} are not co-partitioned: their producers "
                    f"write {first_producer.max_parallelism} ({first_spec.upstream!r}) and "
                    f"{producer.max_parallelism} ({spec.upstream!r}) hash subpartitions, so equal keys would land "
                    f"in different subtasks. Give both producers the same max_parallelism, or leave it unset on "
                    f"both (the pipeline then aligns it)")

    def align_copartitioned(self) -> None:
        """Give producers read together by one stage the same max_parallelism where the pipeline chose it.

        Producers joined by any stage form a group (transitively); a group with one declared value takes
        it, one with none takes the largest default. Conflicting declared values are left for
        :meth:`validate` to refuse, naming the stage and both inputs.
        """
        parent = {name: name for name in self.stages}

        def find(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        for stage in self.stages.values():
            upstreams = [s.upstream for s in stage.inputs.values() if isinstance(s, ExchangeSpec)
                         and s.distribution == "all_to_all" and s.upstream in self.stages]
            for other in upstreams[1:]:
                parent[find(other)] = find(upstreams[0])
        groups: dict[str, list[StageSpec]] = {}
        for name, spec in self.stages.items():
            groups.setdefault(find(name), []).append(spec)
        for members in groups.values():
            if len(members) < 2:
                continue
            declared = {m.max_parallelism for m in members if m.max_parallelism_declared}
            if len(declared) > 1:
                continue
            value = declared.pop() if declared else max(m.max_parallelism for m in members)
            for member in members:
                member.max_parallelism = value

    def _validate_pointwise(self, where: str, input_name: str, producer: StageSpec, stage: StageSpec) -> None:
        # A pointwise consumer of an auto stage inherits the producer's decided parallelism at plan time.
        if stage.auto:
            most = producer.max_parallelism if producer.auto else producer.parallelism
            if isinstance(most, int) and most > stage.max_parallelism:
                raise PipelineError(
                    f"{where}: pointwise input {input_name!r} inherits {producer.name!r}'s parallelism (up to "
                    f"{most}) but max_parallelism is {stage.max_parallelism}; raise max_parallelism")
            return
        if producer.auto:
            raise PipelineError(
                f"{where}: pointwise input {input_name!r} reads {producer.name!r}, whose parallelism is 'auto'; "
                f"declare parallelism='auto' on {stage.name!r} to inherit the decided parallelism")
        if producer.parallelism != stage.parallelism:
            raise PipelineError(
                f"{where}: pointwise input {input_name!r} needs equal parallelism "
                f"({producer.name}={producer.parallelism}, {stage.name}={stage.parallelism})")

    def _check_keys(self) -> None:
        # A producer writes its output partitioned once, so all its all_to_all consumers share a key.
        for producer in self.stages:
            keys = {spec.key for _, _, spec in self.consumers(producer) if spec.distribution == "all_to_all"}
            if len(keys) > 1:
                raise PipelineError(
                    f"pipeline {self.name!r}: stage {producer!r} is consumed all_to_all with different keys "
                    f"{sorted(keys)}; use one key per producer")

    def consumers(self, producer: str) -> list[tuple[str, str, ExchangeSpec]]:
        """Return (consumer stage, input name, exchange) for every edge leaving ``producer``."""
        return [(stage.name, input_name, spec) for stage in self.stages.values()
                for input_name, spec in stage.inputs.items()
                if isinstance(spec, ExchangeSpec) and spec.upstream == producer]

    def in_hybrid_exchange(self, stage: str) -> bool:
        """True if ``stage`` reads or feeds a hybrid exchange.

        Such a stage starts on a worker: hybrid consumers fence on the DAG run's clear number (a producer
        plan or failure of an earlier clear is not theirs), which Airflow gives a worker but not a trigger.
        """
        inputs = self.stages[stage].inputs.values()
        return (any(isinstance(entry, ExchangeSpec) and entry.mode == "hybrid" for entry in inputs)
                or any(edge.mode == "hybrid" for _, _, edge in self.consumers(stage)))

    def upstreams(self, stage: str) -> list[str]:
        """Return the stages ``stage`` reads from, in input order."""
        return [spec.upstream for spec in self.stages[stage].inputs.values() if isinstance(spec, ExchangeSpec)]

    def hybrid_only(self, stage: str) -> bool:
        """True if ``stage`` reads at least one exchange and every exchange it reads is hybrid (FLIP-235)."""
        modes = [spec.mode for spec in self.stages[stage].inputs.values() if isinstance(spec, ExchangeSpec)]
        return bool(modes) and all(mode == "hybrid" for mode in modes)

    def output_key(self, producer: str) -> tuple[str, ...]:
        """Return the hash key the producer partitions its output by (empty: not hash-partitioned)."""
        for _, _, spec in self.consumers(producer):
            if spec.distribution == "all_to_all":
                return spec.key
        return ()

    def topological_order(self) -> list[str]:
        """Return stage names producers-first; raise :class:`PipelineError` naming a cycle."""
        return producers_first(list(self.stages), self.upstreams, f"pipeline {self.name!r}")


def producers_first(names: list[str], upstreams: Callable[[str], list[str]], where: str) -> list[str]:
    """``names`` with every one after its upstreams (depth first, in the given order otherwise).

    Upstreams not among ``names`` are skipped; a cycle raises :class:`PipelineError` naming it.
    """
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: placed
    known = set(names)
    # Iterative depth-first search: a chain of thousands of stages must not hit Python's recursion limit.
    for root in names:
        if state.get(root) == 2:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(upstreams(root))]
        while pending:
            upstream = next((u for u in pending[-1] if u in known and state.get(u) != 2), None)
            if upstream is None:
                pending.pop()
                name = path.pop()
                state[name] = 2
                order.append(name)
                continue
            if state.get(upstream) == 1:
                cycle = [*path[path.index(upstream):], upstream]
                raise PipelineError(f"{where}: cyclic stage graph: {' -> '.join(cycle)}")
            state[upstream] = 1
            path.append(upstream)
            pending.append(iter(upstreams(upstream)))
    return order


# Schemes Spark can fetch an application from (spark-submit); a Connect target runs local files only.
APPLICATION_SCHEMES = ("file", "local", "hdfs", "s3", "s3a", "gs", "abfs", "abfss", "wasb", "wasbs", "http", "https")


def _stage_to_json(spec: StageSpec) -> dict[str, Any]:
    return {"name": spec.name, "application": spec.application, "parallelism": spec.parallelism,
            "inputs": {name: entry.to_json() for name, entry in spec.inputs.items()},
            "max_parallelism": spec.max_parallelism, "max_parallelism_declared": spec.max_parallelism_declared,
            "deterministic": spec.deterministic, "config": spec.config,
            "application_args": list(spec.application_args), "spark_conf": spec.spark_conf,
            "min_parallelism": spec.min_parallelism, "splittable_skew": spec.splittable_skew}


def _input_from_json(data: dict[str, Any]) -> SourceSpec | ExchangeSpec:
    if data["kind"] == "source":
        return SourceSpec(path=data["path"], format=data["format"],
                          supports_concurrent_attempts=data["supports_concurrent_attempts"],
                          broadcast=data["broadcast"])
    return ExchangeSpec(upstream=data["upstream"], distribution=data["distribution"], key=tuple(data["key"]),
                        mode=data["mode"])


def _stage_from_json(data: dict[str, Any]) -> StageSpec:
    return StageSpec(name=data["name"], application=data["application"], parallelism=data["parallelism"],
                     inputs={name: _input_from_json(entry) for name, entry in data["inputs"].items()},
                     max_parallelism=data["max_parallelism"],
                     max_parallelism_declared=data["max_parallelism_declared"],
                     deterministic=data["deterministic"], config=dict(data["config"]),
                     application_args=tuple(data["application_args"]), spark_conf=dict(data["spark_conf"]),
                     min_parallelism=data["min_parallelism"], splittable_skew=data["splittable_skew"])


def _check_application(where: str, application: str) -> None:
    """A PySpark application is a .py file: a local path or a URL of a scheme Spark fetches."""
    if "\0" in application:
        raise PipelineError(f"{where}: application {application!r} contains a NUL byte")
    scheme = application.split("://", 1)[0].lower() if "://" in application else ""
    if scheme and scheme not in APPLICATION_SCHEMES:
        raise PipelineError(f"{where}: application {application!r} has scheme {scheme!r}; use a local path or one "
                            f"of {', '.join(APPLICATION_SCHEMES)}")
    # A template ending in an expression ("{{ params.app }}") is judged once rendered (render_stage).
    if not application.rstrip("/").endswith(".py") and not application.rstrip().endswith("}}"):
        raise PipelineError(f"{where}: application {application!r} is not a .py file (a PySpark application "
                            "using StageContext)")


def _split_kind(spec: SourceSpec | ExchangeSpec) -> str:
    """How an input is divided among subtasks, for messages."""
    if isinstance(spec, SourceSpec):
        return f"a source split by file across subtasks ({spec.path})"
    return f"pointwise from {spec.upstream!r} (subtask i reads producer i)"


def _broadcast_hint(spec: SourceSpec | ExchangeSpec) -> str:
    if isinstance(spec, SourceSpec):
        return f"parquet_source({spec.path!r})"
    return repr(spec.upstream)


def _check_count(where: str, name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass: parallelism=True would silently mean 1.
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_PARALLELISM:
        raise PipelineError(f"{where}: {name} must be an integer from {minimum} to {MAX_PARALLELISM}, got {value!r}")


TEMPLATE_START = "{{"


def is_template(value: Any) -> bool:
    """Whether a string holds a Jinja expression (rendered per DAG run by Airflow)."""
    return isinstance(value, str) and TEMPLATE_START in value


def _check_source(where: str, source: SourceSpec) -> None:
    """A source path must be absolute: a relative one would be read against the worker's cwd.

    A templated path (``/data/{{ ds }}``) is judged by the part before its first expression when the DAG
    is parsed (a path that starts with an expression is judged only once rendered: :func:`render_stage`).
    """
    path = source.path
    if not isinstance(path, str) or not path.strip() or path.strip() == "None":
        raise PipelineError(f"{where}: source path is empty; give the absolute path of a Parquet directory, file "
                            "or glob")
    fixed = path.split(TEMPLATE_START, 1)[0]
    if url_scheme(fixed) is not None:
        # s3://bucket/prefix: its own rules (and a message that never repeats credentials in the URL).
        problem = source_url_problem(fixed) if TEMPLATE_START not in path else None
        if problem:
            raise PipelineError(f"{where}: {problem}")
    elif fixed and not posixpath.isabs(fixed):
        raise PipelineError(f"{where}: source path {path!r} is relative; it would be read against the worker's "
                            "current directory. Give an absolute path")
    if source.format != "parquet":
        raise PipelineError(f"{where}: source format {source.format!r} is not supported (only 'parquet')")


def subpartition_range(consumer: int, consumer_parallelism: int, max_parallelism: int) -> range:
    """Return the contiguous subpartitions consumer ``consumer`` of ``consumer_parallelism`` reads."""
    if not 0 <= consumer < consumer_parallelism <= max_parallelism:
        raise ValueError(f"consumer {consumer} of {consumer_parallelism} with max_parallelism {max_parallelism}")
    start = consumer * max_parallelism // consumer_parallelism
    end = (consumer + 1) * max_parallelism // consumer_parallelism
    return range(start, end)


def split_files(files: list[tuple[str, int]], parallelism: int) -> list[list[tuple[str, int]]]:
    """Split (path, size) files over subtasks, largest first onto the lightest subtask (deterministic)."""
    splits: list[list[tuple[str, int]]] = [[] for _ in range(parallelism)]
    # A heap of (load, subtask): O(files log files + files log parallelism), not files x parallelism.
    lightest = [(0, i) for i in range(parallelism)]
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        load, target = heapq.heappop(lightest)
        splits[target].append((path, size))
        heapq.heappush(lightest, (load + size, target))
    for split in splits:
        split.sort()
    return splits


@dataclass(frozen=True)
class RenderedStage:
    """A stage's templated fields as Airflow rendered them for one DAG run (operator ``template_fields``)."""

    application: str
    application_args: list[str] | tuple[str, ...]
    spark_conf: dict[str, str]
    source_paths: dict[str, str]

    @classmethod
    def of(cls, spec: StageSpec) -> RenderedStage:
        """The stage's fields as declared (templates not rendered yet): what the operator hands to Airflow."""
        return cls(application=spec.application, application_args=tuple(spec.application_args),
                   spark_conf=dict(spec.spark_conf),
                   source_paths={n: s.path for n, s in spec.inputs.items() if isinstance(s, SourceSpec)})

    @classmethod
    def rendered(cls, application: Any, application_args: Any, spark_conf: Any, source_paths: Any) -> RenderedStage:
        """The values Airflow rendered, as they are: :func:`render_stage` refuses a wrong type naming it."""
        return cls(application=application, application_args=application_args, spark_conf=spark_conf,
                   source_paths=source_paths)

    def to_json(self) -> dict[str, Any]:
        """JSON for trigger arguments (each key is also an operator template field)."""
        return {"application": self.application, "application_args": list(self.application_args),
                "spark_conf": dict(self.spark_conf), "source_paths": dict(self.source_paths)}


def render_stage(graph: PipelineGraph, stage: str, rendered: RenderedStage) -> PipelineGraph:
    """``graph`` with ``stage``'s templated fields replaced by their rendered values, checked as at parse.

    Raises PipelineError naming pipeline, stage and input (with the template and what it rendered to)
    for a value that renders empty, relative, not a string, or still holding an expression.
    """
    spec = graph.stages[stage]
    where = f"pipeline {graph.name!r}, stage {stage!r}"

    def rendered_text(what: str, template: Any, value: Any) -> str:
        shown = f" (rendered from {template!r})" if template != value else ""
        if not isinstance(value, str) or not value.strip():
            raise PipelineError(f"{where}: {what} is {value!r}{shown}; a template rendered empty or not to a string")
        if is_template(value):
            raise PipelineError(f"{where}: {what} {value!r} still holds a template after rendering{shown}")
        return value

    application = rendered_text("application", spec.application, rendered.application)
    if application.strip() == "None":
        raise PipelineError(f"{where}: application rendered to 'None' (from {spec.application!r})")
    try:
        _check_application(where, application)
    except PipelineError as exc:
        raise PipelineError(f"{exc} (rendered from {spec.application!r})") from None
    if not isinstance(rendered.application_args, list | tuple):
        raise PipelineError(f"{where}: application_args rendered to {rendered.application_args!r}, not a list")
    args = tuple(str(a) for a in rendered.application_args)
    if not isinstance(rendered.spark_conf, dict):
        raise PipelineError(f"{where}: spark_conf rendered to {rendered.spark_conf!r}, not a mapping")
    if not isinstance(rendered.source_paths, dict):
        raise PipelineError(f"{where}: source paths rendered to {rendered.source_paths!r}, not a mapping")
    conf = {str(k): str(v) for k, v in rendered.spark_conf.items()}
    inputs: dict[str, SourceSpec | ExchangeSpec] = dict(spec.inputs)
    for name, source in spec.inputs.items():
        if not isinstance(source, SourceSpec) or name not in rendered.source_paths:
            continue
        path = rendered_text(f"input {name!r}: source path", source.path, rendered.source_paths[name])
        replaced = replace(source, path=path)
        try:
            _check_source(f"{where}, input {name!r}", replaced)
            problem = source_root_problem(path)
            if problem:
                raise PipelineError(f"{where}, input {name!r}: {problem}")
        except PipelineError as exc:
            raise PipelineError(f"{exc} (rendered from {source.path!r})") from None
        inputs[name] = replaced
    stages = dict(graph.stages)
    stages[stage] = replace(spec, application=application, inputs=inputs, application_args=args, spark_conf=conf)
    return replace(graph, stages=stages)
