"""Every bad input fails early with a message naming pipeline, stage and input: one case per row of docs/validation.md.

Parse-time cases build the pipeline (no I/O); plan-time cases run the real operator's ``execute`` on real
files, which must fail before any attempt is launched (and before targets are even resolved, except for the
target case itself); CLI cases run the real command functions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.core.graph import ExchangeSpec
from airflow_provider_speculative.exceptions import (
    ConfigError,
    PipelineError,
    PlanError,
    StageFailedError,
    TargetError,
)
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, broadcast, parquet_source, pointwise
from airflow_provider_speculative.sinks import ParquetSink, PostgresSink
from airflow_provider_speculative.store.identity import own_store

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
APP = str(Path(__file__).resolve().parents[1] / "integration" / "apps" / "passthrough.py")


@dataclass(frozen=True)
class Case:
    """One bad input: how to trigger it, the error class and a pattern of its message."""

    id: str
    trigger: Callable[[Path], Any]
    error: type[BaseException]
    message: str


def parquet_dir(tmp: Path, files: int = 2) -> Path:
    data = tmp / "data" / "rows"
    data.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        pq.write_table(pa.table({"id": [i]}), data / f"part-{i}.parquet")
    return data


def stage(inputs: dict[str, Any] | None = None, *, parallelism: Any = 2, application: Any = APP,
          sink: Any = None, config: dict[str, Any] | None = None, **kwargs: Any) -> Pipeline:
    p = Pipeline("p", config=config)
    p.stage("s", application=application, parallelism=parallelism,
            inputs=inputs if inputs is not None else {"rows": parquet_source("/data/rows")}, sink=sink, **kwargs)
    p.graph()
    return p


def two_stages(key: Any = "id", consumers: int = 2, producer_max: int | None = None) -> None:
    p = Pipeline("p")
    a = p.stage("a", application=APP, parallelism=2, inputs={"rows": parquet_source("/data/rows")},
                max_parallelism=producer_max)
    p.stage("b", application=APP, parallelism=consumers, inputs={"partials": all_to_all(a, key=key)})
    p.graph()


def join(left: Any, right: Any, *, left_max: int | None = None, right_max: int | None = None,
         parallelism: int = 2) -> None:
    """A stage joining input 'l' and input 'r'; a Stage argument is keyed on 'id' through all_to_all."""
    p = Pipeline("p")
    a = p.stage("a", application=APP, parallelism=2, inputs={"rows": parquet_source("/data/a")},
                max_parallelism=left_max)
    b = p.stage("b", application=APP, parallelism=2, inputs={"rows": parquet_source("/data/b")},
                max_parallelism=right_max)
    pick = {"a": all_to_all(a, key="id"), "b": all_to_all(b, key="id"), "a2": all_to_all(a, key=["id", "x"]),
            "b2": all_to_all(b, key=["x", "id"]),
            "pa": pointwise(a), "bb": broadcast(b)}
    p.stage("j", application=APP, parallelism=parallelism,
            inputs={"l": pick.get(left, left), "r": pick.get(right, right)})
    p.graph()


def join_plan(tmp: Path, left_type: str, right_type: str, *, collation: str | None = None,
              zones: tuple[str, str] = ("UTC", "UTC")) -> None:
    """Plan (the real operator) a join whose two producers committed key 'id' with these Spark types.

    ``collation`` is recorded on both key columns; ``zones`` are the producers' session time zones.
    """
    from airflow_provider_speculative.operators.stage import SparkStageOperator
    from airflow_provider_speculative.store.files import atomic_write_json
    from airflow_provider_speculative.store.layout import StageLayout

    p = Pipeline("p")
    a = p.stage("a", application=APP, parallelism=1, inputs={"rows": parquet_source("/data/a")})
    b = p.stage("b", application=APP, parallelism=1, inputs={"rows": parquet_source("/data/b")})
    p.stage("j", application=APP, parallelism=2, inputs={"l": all_to_all(a, key="id"), "r": all_to_all(b, key="k")})
    run_id = f"run_{tmp.name}"
    own_store(store_root())  # as the producers' planning would have: their commits are written by hand below
    StageLayout(store_root(), "validation_dag", run_id, "a").claim_run()  # as the producers' planning would have
    for (stage, column, spark_type), zone in zip((("a", "id", left_type), ("b", "k", right_type)), zones,
                                                 strict=True):
        metadata = {"__COLLATIONS": {column: f"spark.{collation}"}} if collation else {}
        schema = {"type": "struct", "fields": [{"name": column, "type": spark_type, "nullable": True,
                                                "metadata": metadata}]}
        atomic_write_json(StageLayout(store_root(), "validation_dag", run_id, stage).committed, {
            "stage": stage, "parallelism": 1, "fingerprint": stage, "subtasks": {"0": {
                "attempt": 0, "bytes": 1, "schema": schema, "subpartition_bytes": {"0": 1},
                "partitioning": {"key": [column], "max_parallelism": 32, "hash": "xxhash64-of-string-v1",
                                 "session_time_zone": zone}}}})
    operator = SparkStageOperator(task_id="j", graph=p.graph(), stage="j")
    operator.execute({"dag": SimpleNamespace(dag_id="validation_dag"), "run_id": run_id,
                      "ti": SimpleNamespace(try_number=1), "logical_date": None, "dag_run": None})


def hybrid_key_mismatch(tmp: Path) -> None:
    """A hybrid producer's first admitted subtask hashes a string key beside a committed long key.

    The consumer's controller fails the stage (what its task then raises, StageFailedError) before any attempt.
    """
    from tests.factories import Clock
    from tests.unit.control.test_hybrid_inputs import join_controller

    ctrl, backend, _ = join_controller(tmp / "store", Clock(), "string")
    assert ctrl.result is not None and backend.launched == []
    raise StageFailedError(ctrl.result.reason)


def deployment(**options: Any) -> Any:
    """Options as airflow.cfg gives them (parsed like the deployment's [speculative] section)."""
    from airflow_provider_speculative.core.config import SpeculativeConfig

    return SpeculativeConfig().with_overrides(options, "airflow.cfg")


def foreign_stage() -> None:
    other = Pipeline("other")
    a = other.stage("a", application=APP, parallelism=2, inputs={"rows": parquet_source("/data/rows")})
    p = Pipeline("p")
    p.stage("a", application=APP, parallelism=2, inputs={"rows": parquet_source("/data/rows")})
    p.stage("b", application=APP, parallelism=2, inputs={"rows": pointwise(a)})


def with_conn(conn_id: str, uri: str, action: Callable[[], Any]) -> Any:
    """Run ``action`` with an Airflow connection defined in the environment."""
    return with_conn_env(f"AIRFLOW_CONN_{conn_id.upper()}", uri, action)


def with_conn_env(name: str, value: str, action: Callable[[], Any]) -> Any:
    """Run ``action`` with ``name`` set in the environment (restored after)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        return action()
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def auto_pointwise_into_fixed() -> None:
    p = Pipeline("p")
    a = p.stage("a", application=APP, parallelism="auto", inputs={"rows": parquet_source("/data/rows")})
    p.stage("b", application=APP, parallelism=2, inputs={"same": pointwise(a)})
    p.graph()


def plan(tmp: Path, *, inputs: dict[str, Any] | None = None, parallelism: int = 2, application: str = APP,
         sink: Any = None, config: dict[str, Any] | None = None, rendered: dict[str, Any] | None = None) -> None:
    """Run the real operator's execute (planning) for one stage on real files.

    ``rendered`` stands in for Airflow's rendering of the sink's templated arguments.
    """
    from airflow_provider_speculative.operators.stage import SparkStageOperator

    p = Pipeline("p", config=config)
    p.stage("s", application=application, parallelism=parallelism,
            inputs=inputs if inputs is not None else {"rows": parquet_source(str(parquet_dir(tmp)))}, sink=sink)
    operator = SparkStageOperator(task_id="s", graph=p.graph(), stage="s", sink=sink)
    for field, value in (rendered or {}).items():
        if field in ("application", "application_args", "spark_conf", "source_paths"):
            setattr(operator, field, value)  # a templated stage field as Airflow rendered it
        else:
            operator.sink_args = {**(operator.sink_args or {}), field: value}
    operator.execute({"dag": SimpleNamespace(dag_id="validation_dag"), "run_id": f"run_{tmp.name}",
                      "ti": SimpleNamespace(try_number=1), "logical_date": None, "dag_run": None})


def plan_with_faults(tmp: Path, faults: dict[str, Any]) -> None:
    """Plan as :func:`plan` does while a test injects ``faults`` into the stage (core/faults.py)."""
    from airflow_provider_speculative.devtools.faults import injected

    with injected({"validation_dag/s": faults}):
        plan(tmp)


def not_parquet(tmp: Path) -> None:
    data = parquet_dir(tmp)
    (data / "part-9.parquet").write_text("id,name\n1,one\n2,two\n")  # a CSV with a Parquet name
    plan(tmp, inputs={"rows": parquet_source(str(data))})


def corrupt_footer(tmp: Path) -> None:
    data = parquet_dir(tmp)
    good = next(iter(sorted(data.glob("*.parquet")))).read_bytes()
    # The magic bytes at both ends, but the footer length and metadata in front of the tail are garbage.
    (data / "part-9.parquet").write_bytes(good[:-12] + b"\xff" * 8 + b"PAR1")
    plan(tmp, inputs={"rows": parquet_source(str(data))})


def store_root() -> Path:
    from airflow_provider_speculative.settings import airflow_config
    from airflow_provider_speculative.settings import store_root as root

    return root(airflow_config())


def foreign_dir(tmp: Path) -> None:
    reports = tmp / "reports"
    reports.mkdir()
    (reports / "q3.xlsx").write_text("mine")
    plan(tmp, sink=ParquetSink(str(reports)))


def other_dags_output(tmp: Path) -> None:
    from airflow_provider_speculative.store.files import atomic_write_json

    out = tmp / "out"
    out.mkdir()
    atomic_write_json(out / "_SUCCESS", {"dag_id": "other_dag", "stage": "s", "files": []})
    (out / "part-00000-000.parquet").write_bytes(b"PAR1")
    plan(tmp, sink=ParquetSink(str(out)))


def committed_output(path: Path, dag_id: str = "other_dag", stage: str = "agg", extra: str | None = None) -> Path:
    """A directory ParquetSink committed (its manifest), optionally with something put inside it since."""
    from airflow_provider_speculative.store.files import atomic_write_json

    path.mkdir(parents=True)
    atomic_write_json(path / "_SUCCESS", {"sink": "ParquetSink", "dag_id": dag_id, "stage": stage, "files": []})
    (path / "part-00000-000.parquet").write_bytes(b"PAR1")
    if extra:
        (path / extra).mkdir()
    return path


def two_sinks(a: str, b: str) -> None:
    p = Pipeline("p")
    for name, path in (("a", a), ("b", b)):
        p.stage(name, application=APP, parallelism=1, inputs={"rows": parquet_source("/data/rows")},
                sink=ParquetSink(path))
    p.graph()


def sensor(**kwargs: Any) -> None:
    from airflow_provider_speculative.sensors.stage_output import StageOutputSensor

    StageOutputSensor(**{"task_id": "wait", "external_dag_id": "up", "stage": "aggregate", **kwargs})


def cli(command: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, corrupt: bool) -> None:
    from airflow_provider_speculative import settings
    from airflow_provider_speculative.cli import commands
    from airflow_provider_speculative.core.config import SpeculativeConfig

    root = tmp / "store"
    if corrupt:
        plan_path = root / "dag" / "run" / "s" / "plan.json"
        plan_path.parent.mkdir(parents=True)
        plan_path.write_text('{"stage": "s", "parallel')
    monkeypatch.setattr(settings, "store_root", lambda config: root)
    monkeypatch.setattr(settings, "airflow_config", SpeculativeConfig)
    args = SimpleNamespace(dag_id="dag", run_id="run", stage="s", output="table", subtask=None, dry_run=True)
    getattr(commands, command)(args)


def foreign_store(tmp: Path) -> None:
    """Plan with store_path pointing at a shared directory someone else uses."""
    shared = tmp / "shared"
    (shared / "dags" / "team_a").mkdir(parents=True)
    (shared / "dags" / "team_a" / "x.py").write_text("print('dag')")
    (shared / "projects").mkdir()
    # The deployment's store_path (a per-pipeline one is refused at parse).
    with_conn_env("AIRFLOW__SPECULATIVE__STORE_PATH", str(shared), lambda: plan(tmp))


def foreign_run(tmp: Path) -> None:
    """Plan in the provider's store a DAG run whose directory holds files the provider did not write."""
    from airflow_provider_speculative.store.identity import own_store

    store = tmp / "store"
    own_store(store)
    (store / "validation_dag" / f"run_{tmp.name}" / "notes").mkdir(parents=True)
    (store / "validation_dag" / f"run_{tmp.name}" / "notes" / "todo.txt").write_text("not the provider's")
    with_conn_env("AIRFLOW__SPECULATIVE__STORE_PATH", str(store), lambda: plan(tmp))


def unknown_target(tmp: Path) -> None:
    plan(tmp, config={"targets": '[{"name": "gpu", "conn_id": "no_such_connection"}]'})


def hostless_connect_target(tmp: Path) -> None:
    os.environ["AIRFLOW_CONN_SC_NO_HOST"] = '{"conn_type": "spark_connect", "password": "tok-SECRET"}'
    try:
        plan(tmp, config={"targets": '[{"name": "remote", "conn_id": "sc_no_host"}]'})
    finally:
        os.environ.pop("AIRFLOW_CONN_SC_NO_HOST", None)


CASES = [
    # -- DAG parse time: no I/O ---------------------------------------------------------------------
    Case("parallelism-bool", lambda t: stage(parallelism=True), PipelineError,
         r"pipeline 'p', stage 's': parallelism must be an integer from 1 to 32768, got True"),
    Case("parallelism-huge", lambda t: stage(parallelism=10**6), PipelineError,
         r"stage 's': parallelism must be an integer from 1 to 32768, got 1000000"),
    Case("parallelism-zero", lambda t: stage(parallelism=0), PipelineError, r"stage 's': parallelism must be"),
    Case("max-parallelism-below", lambda t: stage(parallelism=4, max_parallelism=2), PipelineError,
         r"stage 's': max_parallelism \(2\) must be >= parallelism \(4\)"),
    Case("parallelism-string", lambda t: stage(parallelism="many"), PipelineError,
         r"stage 's': parallelism must be an integer or 'auto', got 'many'"),
    Case("auto-min-above-max", lambda t: stage(parallelism="auto", min_parallelism=40), PipelineError,
         r"stage 's': max_parallelism \(32\) must be >= min_parallelism \(40\) with parallelism='auto'"),
    Case("auto-bad-volume", lambda t: stage(parallelism="auto", config={"data_volume_per_subtask": "lots"}),
         PipelineError, r"stage 's': parallelism='auto': \[speculative\] data_volume_per_subtask = 'lots'"),
    Case("min-without-auto", lambda t: stage(min_parallelism=2), PipelineError,
         r"stage 's': min_parallelism applies only to parallelism='auto'"),
    Case("auto-pointwise-fixed", lambda t: auto_pointwise_into_fixed(), PipelineError,
         r"stage 'b': pointwise input 'same' reads 'a', whose parallelism is 'auto'; declare parallelism='auto'"),
    Case("splittable-skew-no-exchange", lambda t: stage(splittable_skew=True), PipelineError,
         r"stage 's': splittable_skew needs exactly one all_to_all input"),
    Case("application-empty", lambda t: stage(application=""), PipelineError,
         r"pipeline 'p', stage 's': application is required"),
    Case("application-none", lambda t: stage(application=None), PipelineError,
         r"stage 's': application is required .* got None"),
    Case("source-empty", lambda t: stage({"rows": parquet_source("")}), PipelineError,
         r"pipeline 'p', stage 's', input 'rows': source path is empty"),
    Case("source-none", lambda t: stage({"rows": parquet_source(None)}), PipelineError,  # type: ignore[arg-type]
         r"stage 's', input 'rows': source path is empty"),
    Case("source-relative", lambda t: stage({"rows": parquet_source("data/rows")}), PipelineError,
         r"stage 's', input 'rows': source path 'data/rows' is relative"),
    Case("join-split-source-beside-partitioned", lambda t: join(parquet_source("/data/dim"), "b"), PipelineError,
         r"pipeline 'p', stage 'j': input 'l' is a source split by file across subtasks \(/data/dim\) while input "
         r"'r' is hash-partitioned on \['id'\], .* Declare it broadcast\(parquet_source\('/data/dim'\)\)"),
    Case("join-pointwise-beside-partitioned", lambda t: join("pa", "b"), PipelineError,
         r"stage 'j': input 'l' is pointwise from 'a' .* while input 'r' is hash-partitioned"),
    Case("join-two-split-inputs", lambda t: join(parquet_source("/data/x"), parquet_source("/data/y")), PipelineError,
         r"stage 'j': inputs 'l' \(a source split .*\) and 'r' \(.*\) are split independently"),
    Case("join-max-parallelism-differs", lambda t: join("a", "b", left_max=32, right_max=8), PipelineError,
         r"stage 'j': all_to_all inputs 'l' and 'r' are not co-partitioned: their producers write 32 \('a'\) "
         r"and 8 \('b'\) hash subpartitions"),
    Case("join-key-arity-differs", lambda t: join("a2", "b"), PipelineError,
         r"stage 'j': all_to_all inputs 'l' \(key \['id', 'x'\]\) and 'r' \(key \['id'\]\) have keys of "
         r"different length"),
    Case("join-key-order-differs", lambda t: join("a2", "b2"), PipelineError,
         r"stage 'j': all_to_all inputs 'l' \(key \['id', 'x'\]\) and 'r' \(key \['x', 'id'\]\) name column 'x' "
         r"at different positions; .* List the key columns in the same order on both inputs"),
    Case("broadcast-only-parallel", lambda t: join("bb", broadcast(parquet_source("/data/y"))), PipelineError,
         r"stage 'j': every input \('l', 'r'\) is broadcast, so each of its subtasks would read and write the "
         r"same rows; use parallelism=1"),
    Case("broadcast-hybrid", lambda t: join("b", ExchangeSpec("a", "broadcast", mode="hybrid")), PipelineError,
         r"stage 'j': broadcast input 'r' must be blocking, got mode 'hybrid'"),
    Case("key-none", lambda t: two_stages(key=None), PipelineError,
         r"pipeline 'p', stage 'b': all_to_all input 'partials' needs a key: .* got None"),
    Case("key-empty", lambda t: two_stages(key=""), PipelineError,
         r"stage 'b': all_to_all input 'partials' needs a key"),
    Case("key-list-empty", lambda t: two_stages(key=[""]), PipelineError,
         r"stage 'b': all_to_all input 'partials' needs a key: .* got \(''\,\)"),
    Case("consumer-wider-than-max-parallelism", lambda t: two_stages(consumers=8, producer_max=4), PipelineError,
         r"stage 'b': all_to_all input 'partials' has 8 consumers but its producer 'a' writes only "
         r"max_parallelism=4 subpartitions"),
    Case("exchange-unknown-stage", lambda t: stage({"x": pointwise("s0")}), PipelineError,
         r"stage 's': input 'x' reads unknown stage 's0'"),
    Case("option-nan", lambda t: stage(config={"check_interval": float("nan")}), PipelineError,
         r"\[speculative\] check_interval = nan \(pipeline 'p'\): must be a finite number of seconds"),
    Case("option-inf", lambda t: stage(config={"baseline_multiplier": "inf"}), PipelineError,
         r"\[speculative\] baseline_multiplier = 'inf' \(pipeline 'p'\): expected a finite number"),
    Case("option-bool-as-number", lambda t: stage(config={"max_concurrent_executions": True}), PipelineError,
         r"max_concurrent_executions = True \(pipeline 'p'\): expected an integer"),
    Case("option-duration-overflow", lambda t: stage(config={"retention": "9" * 400}), PipelineError,
         r"\[speculative\] retention = '9+\.\.\.9+' \(402 characters\) \(pipeline 'p'\): must be a finite number "
         r"of seconds, at most 3153600000 \(100 years\)"),
    Case("option-float-overflow", lambda t: stage(config={"baseline_ratio": 10**400}), PipelineError,
         r"\[speculative\] baseline_ratio = 10+\.\.\.0+ \(401 characters\) \(pipeline 'p'\): expected a finite "
         r"number"),
    Case("option-size-overflow", lambda t: stage(config={"data_volume_per_subtask": "9" * 400 + "GB"}),
         PipelineError, r"data_volume_per_subtask = .* \(pipeline 'p'\): must be at most 1152921504606846976 bytes"),
    Case("option-check-interval-tiny", lambda t: stage(config={"check_interval": 1e-9}), PipelineError,
         r"\[speculative\] check_interval = 1e-09 \(pipeline 'p'\): must be at least 0.01 s"),
    Case("deterministic-not-bool", lambda t: stage(deterministic="no"), PipelineError,
         r"pipeline 'p', stage 's': deterministic must be True or False, got 'no'"),
    Case("application-args-string", lambda t: stage(application_args="--date 2026"), PipelineError,
         r"pipeline 'p', stage 's': application_args must be a list of strings, got '--date 2026'; pass e.g. "
         r"\['--date', '2026'\]"),
    Case("target-conf-not-object", lambda t: stage(config={"targets": [{"name": "a", "conf": ["x"]}]}),
         PipelineError, r"\[speculative\] targets\[a\].conf = \['x'\] \(pipeline 'p'\): expected an object of Spark "
                        r"settings"),
    Case("fault-injection-option", lambda t: stage(config={"fault_injection": {"targets": {"local-b": {"factor": 4}}}}),
         PipelineError, r"\[speculative\] fault_injection \(pipeline 'p'\): fault injection is a test facility, not an "
                        r"option: set the environment variable SPECULATIVE_FAULT_INJECTION"),
    Case("sensor-poke-interval-zero", lambda t: sensor(poke_interval=0), PipelineError,
         r"StageOutputSensor 'wait': poke_interval must be a number of seconds >= 0.01, got 0"),
    Case("sensor-subtasks-not-indexes", lambda t: sensor(subtasks=["a"]), PipelineError,
         r"StageOutputSensor 'wait': subtasks must be a list of indexes >= 0, got 'a' in \['a'\]"),
    Case("sensor-store-path-relative", lambda t: sensor(store_path="store"), PipelineError,
         r"StageOutputSensor 'wait': store_path 'store' is relative"),
    Case("sensor-store-path-url", lambda t: sensor(store_path="gs://lake/store"), PipelineError,
         r"StageOutputSensor 'wait': store_path 'gs://lake/store': scheme 'gs://' is not supported"),
    Case("postgres-table-upper-case", lambda t: stage(sink=PostgresSink("public.Sales")), PipelineError,
         r"sink PostgresSink: table 'public.Sales' is not \[schema.\]table: 'Sales' has upper-case letters: the sink "
         r"writes it quoted"),
    Case("option-unknown", lambda t: stage(config={"enable": True}), PipelineError,
         r"\[speculative\] unknown option 'enable' \(pipeline 'p'\); known options: enabled, "),
    Case("sink-path-empty", lambda t: stage(sink=ParquetSink("")), PipelineError,
         r"pipeline 'p', stage 's', sink ParquetSink: path is empty"),
    Case("sink-path-none", lambda t: stage(sink=ParquetSink(None)), PipelineError,  # type: ignore[arg-type]
         r"stage 's', sink ParquetSink: path is empty \(None\)"),
    Case("sink-path-relative", lambda t: stage(sink=ParquetSink("..")), PipelineError,
         r"stage 's', sink ParquetSink: path '..' is relative"),
    Case("sink-same-path-two-stages", lambda t: two_sinks("/out/q1", "/out/q1/"), PipelineError,
         r"pipeline 'p': stages 'a' and 'b' both sink to '/out/q1'; each commit would replace the other's output"),
    Case("sink-path-nested-two-stages", lambda t: two_sinks("/out/q1", "/out/q1/day=2"), PipelineError,
         r"pipeline 'p': stage 'b' sinks to '/out/q1/day=2', inside the sink path '/out/q1' of stage 'a'"),
    Case("sink-path-dot-part", lambda t: stage(sink=ParquetSink("/out/../etc")), PipelineError,
         r"stage 's', sink ParquetSink: path '/out/../etc' has a '.' or '..' part"),
    Case("sink-s3-url-invalid", lambda t: stage(sink=ParquetSink("s3://key:secret@lake/out/{{ ds }}")),
         PipelineError, r"stage 's', sink ParquetSink: sink URL 's3://\*\*\*@lake/out/\{\{ ds \}\}' carries "
         r"credentials"),
    Case("sink-url-scheme", lambda t: stage(sink=ParquetSink("gs://lake/out")), PipelineError,
         r"stage 's', sink ParquetSink: path 'gs://lake/out': scheme 'gs://' is not supported"),
    Case("source-filesystem-root", lambda t: stage({"rows": parquet_source("/**/*.parquet")}), PipelineError,
         r"pipeline 'p', stage 's', input 'rows': source path '/\*\*/\*.parquet' is rooted at '/': planning would "
         r"list the whole filesystem"),
    Case("source-system-directory", lambda t: stage({"rows": parquet_source("/proc/self")}), PipelineError,
         r"stage 's', input 'rows': source path '/proc/self' lies in the system directory /proc"),
    Case("postgres-table-three-parts", lambda t: stage(sink=PostgresSink("db.schema.table")), PipelineError,
         r"stage 's', sink PostgresSink: table 'db.schema.table' is not \[schema.\]table: at most 1 dot allowed"),
    Case("postgres-table-empty", lambda t: stage(sink=PostgresSink("")), PipelineError,
         r"stage 's', sink PostgresSink: table '' is not \[schema.\]table: it is empty"),
    Case("postgres-table-bad-identifier", lambda t: stage(sink=PostgresSink("public.my table")), PipelineError,
         r"sink PostgresSink: table 'public.my table' is not \[schema.\]table: 'my table' is not an unquoted"),
    Case("store-path-relative", lambda t: deployment(store_path="banana"), ConfigError,
         r"\[speculative\] store_path = 'banana' \(airflow.cfg\): must be an absolute path"),
    Case("store-path-root", lambda t: deployment(store_path="file:///"), ConfigError,
         r"\[speculative\] store_path = 'file:///' \(airflow.cfg\): must be a directory of its own, not /"),
    Case("store-path-airflow-home", lambda t: deployment(store_path=os.environ["AIRFLOW_HOME"] + "/"),
         ConfigError, r"store_path = '.*' \(airflow.cfg\): must be a directory of its own, not AIRFLOW_HOME"),
    Case("store-path-per-pipeline", lambda t: stage(config={"store_path": "/data/store"}), PipelineError,
         r"pipeline 'p', stage 's': store_path cannot be set per pipeline; set \[speculative\] store_path"),
    Case("pipeline-name-empty", lambda t: Pipeline(""), PipelineError,
         r"Pipeline name must be a non-empty string without surrounding spaces, '/' or NUL, got ''"),
    Case("pipeline-config-string", lambda t: Pipeline("p", config="enabled=true"), PipelineError,
         r"pipeline 'p': config must be a dict of option -> value, got str 'enabled=true'"),
    Case("stage-of-another-pipeline", lambda t: foreign_stage(), PipelineError,
         r"pipeline 'p', stage 'b': input 'rows' reads stage 'a' of another pipeline \('other'\)"),
    Case("application-not-python", lambda t: stage(application="/apps/job.txt"), PipelineError,
         r"pipeline 'p', stage 's': application '/apps/job.txt' is not a .py file"),
    Case("application-unknown-scheme", lambda t: stage(application="ftp://host/app.py"), PipelineError,
         r"pipeline 'p', stage 's': application 'ftp://host/app.py' has scheme 'ftp'"),
    Case("application-nul", lambda t: stage(application="/apps/a\0.py"), PipelineError,
         r"pipeline 'p', stage 's': application '/apps/a\\x00.py' contains a NUL byte"),
    Case("key-surrounding-space", lambda t: two_stages(key=" k"), PipelineError,
         r"all_to_all input 'partials' needs a key: .* none empty or with surrounding spaces; got \(' k',\)"),
    Case("postgres-table-system-schema", lambda t: stage(sink=PostgresSink("pg_catalog.sales")), PipelineError,
         r"sink PostgresSink: table 'pg_catalog.sales' is in the system schema 'pg_catalog'"),
    Case("postgres-table-is-ledger", lambda t: stage(sink=PostgresSink("speculative_staging.commits")),
         PipelineError, r"sink PostgresSink: table 'speculative_staging.commits' is the provider's own ledger"),
    Case("application-directory", lambda t: plan(t, application=str((t / "app.py").mkdir() or t / "app.py")),
         PlanError, r"pipeline 'p', stage 's': application '.*app.py' is a directory"),
    Case("fault-injection-unknown-target", lambda t: plan_with_faults(t, {"targets": {"local-x": {"factor": 4}}}),
         PlanError, r"pipeline 'p', stage 's': SPECULATIVE_FAULT_INJECTION names targets \['local-x'\] that are not "
                    r"targets of this stage"),
    Case("parquet-sink-path-not-string", lambda t: stage(sink=ParquetSink(123)), PipelineError,
         r"stage 's', sink ParquetSink: path must be a string, got int 123"),
    Case("postgres-conn-missing", lambda t: plan(t, sink=PostgresSink("sales", postgres_conn_id="no_such_pg")),
         PlanError, r"stage 's', sink PostgresSink: connection 'no_such_pg' \(postgres_conn_id\) cannot be found"),
    Case("postgres-conn-wrong-type", lambda t: with_conn("not_pg", "http://example.invalid", lambda: plan(
        t, sink=PostgresSink("sales", postgres_conn_id="not_pg"))), PlanError,
         r"stage 's', sink PostgresSink: connection 'not_pg' \(postgres_conn_id\) has type 'http', not 'postgres'"),
    Case("postgres-conn-unknown-extra", lambda t: with_conn(
        "pg_typo", "postgresql://etl@db.example:5432/sales?sslmod=require", lambda: plan(
            t, sink=PostgresSink("sales", postgres_conn_id="pg_typo"))), PlanError,
         r"stage 's', sink PostgresSink: connection 'pg_typo' has extras \['sslmod'\] that are not "
         r"libpq connection parameters"),
    Case("postgres-conn-iam", lambda t: with_conn(
        "pg_iam", "postgresql://etl@db.example:5432/sales?iam=true", lambda: plan(
            t, sink=PostgresSink("sales", postgres_conn_id="pg_iam"))), PlanError,
         r"stage 's', sink PostgresSink: connection 'pg_iam' uses IAM authentication"),
    Case("history-url-script", lambda t: stage(config={"spark_history_url": "javascript:alert(1)//x"}),
         PipelineError, r"\[speculative\] spark_history_url = 'javascript:alert\(1\)//x' \(pipeline 'p'\): "
                        r"scheme javascript: is not http: or https:"),
    Case("history-url-no-host", lambda t: stage(config={"spark_history_url": "banana"}), PipelineError,
         r"spark_history_url = 'banana' \(pipeline 'p'\): scheme \(none\) is not http: or https:"),
    # -- plan time: the operator's execute, before any attempt ---------------------------------------
    Case("application-missing", lambda t: plan(t, application=str(t / "nope.py")), PlanError,
         r"pipeline 'p', stage 's': application '.*nope.py' does not exist"),
    Case("source-missing", lambda t: plan(t, inputs={"rows": parquet_source(str(t / "gone"))}), PlanError,
         r"pipeline 'p', stage 's', input 'rows': source '.*gone' does not exist"),
    Case("source-no-files", lambda t: plan(t, inputs={"rows": parquet_source(str((t / "e").mkdir() or t / "e"))}),
         PlanError, r"stage 's', input 'rows': source '.*/e' has no parquet files"),
    Case("source-not-parquet", not_parquet, PlanError,
         r"stage 's', input 'rows': source '.*rows': .*part-9.parquet is not a Parquet file: no Parquet magic"),
    Case("source-corrupt-footer", corrupt_footer, PlanError,
         r"stage 's', input 'rows': source '.*rows': .*part-9.parquet is not a Parquet file: its Parquet footer "
         r"cannot be read"),
    Case("source-template-renders-relative",
         lambda t: plan(t, inputs={"rows": parquet_source("{{ params.root }}/rows")},
                        rendered={"source_paths": {"rows": "rows"}}), PipelineError,
         r"pipeline 'p', stage 's', input 'rows': source path 'rows' is relative; .* \(rendered from "
         r"'\{\{ params.root \}\}/rows'\)"),
    Case("application-template-renders-empty",
         lambda t: plan(t, application="{{ params.app }}", rendered={"application": ""}), PipelineError,
         r"pipeline 'p', stage 's': application is '' \(rendered from '\{\{ params.app \}\}'\); a template "
         r"rendered empty"),
    Case("join-key-types-differ", lambda t: join_plan(t, "string", "long"), PlanError,
         r"pipeline 'p', stage 'j': key column 1 differs in type between inputs: 'l'.id is string, 'r'.k is long"),
    Case("join-key-collation", lambda t: join_plan(t, "string", "string", collation="UTF8_LCASE"), PlanError,
         r"stage 'j', input 'l': key column 'id' has collation UTF8_LCASE; the exchange hashes a string's exact "
         r"bytes"),
    Case("join-key-time-zones", lambda t: join_plan(t, "timestamp", "timestamp", zones=("UTC", "Asia/Tokyo")),
         PlanError, r"stage 'j': timestamp key columns were hashed under different session time zones \('r'.k in "
         r"Asia/Tokyo, 'l'.id in UTC\)"),
    Case("join-key-hybrid-first-commit", hybrid_key_mismatch, StageFailedError,
         r"pipeline 'p', stage 'enrich': key column 1 differs in type between inputs: 'dim'.id is long, 'rows'.k "
         r"is string; .* \(input 'rows' is a hybrid exchange: producer 'scan' was checked when its first subtask "
         r"was admitted, before any attempt of this stage read it\)"),
    Case("join-key-floating", lambda t: join_plan(t, "double", "double"), PlanError,
         r"pipeline 'p', stage 'j', input 'l': key column 'id' is double; floating-point keys are refused"),
    Case("join-key-decimal-scales", lambda t: join_plan(t, "decimal(12,2)", "decimal(12,3)"), PlanError,
         r"stage 'j': key column 1 differs in type between inputs: 'l'.id is decimal\(12,2\), 'r'.k is decimal"),
    Case("sink-inside-store", lambda t: plan(t, sink=ParquetSink(str(store_root() / "validation_dag" / "out"))),
         PlanError, r"stage 's', sink ParquetSink: path '.*' overlaps the result store"),
    Case("sink-is-store-root", lambda t: plan(t, sink=ParquetSink(str(store_root()))), PlanError,
         r"stage 's', sink ParquetSink: path '.*' overlaps the result store"),
    Case("sink-above-source", lambda t: plan(t, sink=ParquetSink(str(t / "data"))), PlanError,
         r"stage 's', sink ParquetSink: path '.*/data' overlaps the source"),
    Case("sink-foreign-directory", foreign_dir, PlanError,
         r"stage 's', sink ParquetSink: will not replace '.*reports': it holds 1 entries .* no ParquetSink manifest"),
    Case("sink-other-dags-output", other_dags_output, PlanError,
         r"sink ParquetSink: will not replace '.*out': it was committed by DAG 'other_dag', stage 's'"),
    Case("sink-template-renders-empty",
         lambda t: plan(t, sink=ParquetSink(f"{t}/out/q1/{{{{ params.day }}}}"), rendered={"path": f"{t}/out/q1/"}),
         PlanError, r"stage 's', sink ParquetSink: path '.*/out/q1/' ends with '/' once rendered from "
                    r"'.*/out/q1/\{\{ params.day \}\}': a template rendered empty"),
    Case("sink-inside-committed-output",
         lambda t: plan(t, sink=ParquetSink(str(committed_output(t / "out" / "q1") / "day=2"))), PlanError,
         r"stage 's', sink ParquetSink: will not replace '.*/q1/day=2': it lies inside '.*/q1', the committed "
         r"output of DAG 'other_dag', stage 'agg'"),
    Case("sink-output-holds-foreign-entries",
         lambda t: plan(t, sink=ParquetSink(str(committed_output(t / "q1", "validation_dag", "s", "day=2")))),
         PlanError, r"will not replace '.*/q1': besides this stage's committed files it holds 1 entries it did not "
                    r"write \(e.g. 'day=2'\)"),
    Case("store-root-foreign", foreign_store, PlanError,
         r"pipeline 'p', stage 's': store root '.*shared' is not the provider's: it has no store.json and holds 2 "
         r"entries that are not provider run files \('dags/', 'projects/'\)"),
    Case("store-run-foreign", foreign_run, PlanError,
         r"pipeline 'p', stage 's': DAG 'validation_dag' run 'run_.*' stage 's': '.*/validation_dag/run_.*' "
         r"holds files but no _owner.json of this store and no plan of this provider naming the run"),
    Case("target-unknown-connection", unknown_target, TargetError,
         r"pipeline 'p', stage 's': target 'gpu' uses connection 'no_such_connection', which cannot be found"),
    Case("target-connect-without-host", hostless_connect_target, TargetError,
         r"pipeline 'p', stage 's': target 'remote': connection 'sc_no_host' is a spark_connect connection "
         r"without a host \(expected host sc://<server> and a port\); its token, if any, was not used$"),
]
# (id, command, corrupt plan.json?, message): the CLI prints NotFoundError / StoreError as one line.
CLI_CASES = [
    ("cli-status-unknown-run", "status", False, r"no speculative stages recorded for dag 'dag' run 'run'"),
    ("cli-status-corrupt-plan", "status", True, r"corrupt JSON in .*plan.json"),
    ("cli-rerun-unknown-run", "rerun", False, r"no speculative stages recorded for dag 'dag' run 'run'"),
    ("cli-rerun-corrupt-plan", "rerun", True, r"corrupt JSON in .*plan.json"),
]


@pytest.mark.parametrize("case", CASES + CLI_CASES, ids=lambda c: c.id if isinstance(c, Case) else c[0])
def test_bad_input_fails_early_naming_pipeline_stage_and_input(
        case: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if isinstance(case, Case):
        with pytest.raises(case.error) as info:
            case.trigger(tmp_path)
        assert re.search(case.message, str(info.value)), f"{case.id}: {info.value}"
        assert "\n" not in str(info.value)
        return
    _, command, corrupt, message = case
    with pytest.raises(SystemExit) as exit_info:
        cli(command, tmp_path, monkeypatch, corrupt)
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(message, err), err


def test_one_subtask_reads_split_inputs_whole_so_they_are_not_refused() -> None:
    join(parquet_source("/data/nation"), parquet_source("/data/region"), parallelism=1)
    join(parquet_source("/data/dim"), "b", parallelism=1)


def test_docs_table_lists_every_case() -> None:
    doc = DOC.read_text()
    ids = [c.id for c in CASES] + [c[0] for c in CLI_CASES]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", doc, flags=re.M)
    assert sorted(listed) == sorted([*ids, "misspelled-airflow-cfg-option"])
