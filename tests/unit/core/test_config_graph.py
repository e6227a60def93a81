"""[speculative] option parsing and validation; stage-graph validation, exchange ranges and file splits."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_speculative.core.config import (
    DEFAULT_TARGETS,
    ConfigError,
    SpeculativeConfig,
    Target,
    default_strings,
    parse_option,
)
from airflow_provider_speculative.core.graph import (
    ExchangeSpec,
    PipelineError,
    PipelineGraph,
    SourceSpec,
    StageSpec,
    split_files,
    subpartition_range,
)
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, parquet_source, pointwise

# -- config ---------------------------------------------------------------------------------------


def override(name: str, value) -> SpeculativeConfig:
    return SpeculativeConfig().with_overrides({name: value}, "stage 'x'")


def test_defaults_follow_flip168_except_a_derived_lower_bound() -> None:
    cfg = SpeculativeConfig()
    # baseline_lower_bound None is 'auto': derived from the stage's start-up times (core/detector.py).
    assert (cfg.enabled, cfg.max_concurrent_executions, cfg.block_slow_node_duration, cfg.check_interval,
            cfg.baseline_lower_bound, cfg.baseline_ratio, cfg.baseline_multiplier) == (
        False, 2, 60.0, 1.0, None, 0.75, 1.5)
    assert parse_option("baseline_lower_bound", "auto", "t") is None
    assert parse_option("baseline_lower_bound", " Auto ", "t") is None
    assert SpeculativeConfig.from_json(cfg.to_json()).baseline_lower_bound is None
    assert [(t.name, t.slots) for t in cfg.targets] == [("local-a", 2), ("local-b", 2)]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("baseline_ratio", 0),
        ("baseline_ratio", 1.5),
        ("baseline_ratio", -0.5),
        ("baseline_ratio", "abc"),
        ("baseline_multiplier", 0.5),
        ("baseline_multiplier", "x"),
        ("max_concurrent_executions", 0),
        ("max_concurrent_executions", "two"),
        ("max_concurrent_executions", 1.5),
        ("max_concurrent_executions", True),
        ("max_failures_per_subtask", -1),
        ("check_interval", 0),
        ("check_interval", "0s"),
        ("check_interval", "abc"),
        ("block_slow_node_duration", "abc"),
        ("block_slow_node_duration", -1),
        ("block_slow_node_duration", "-5s"),
        ("block_slow_node_duration", "10 parsecs"),
        ("baseline_lower_bound", "abc"),
        ("baseline_lower_bound", True),
        ("enabled", "maybe"),
        ("normalize_by_input_bytes", "sometimes"),
        ("targets", "[{"),
        ("targets", "[]"),
        ("targets", '[{"conn_id": "spark_default"}]'),
        ("targets", '[{"name": "a", "colour": "red"}]'),
        ("targets", '[{"name": "a", "slots": 0}]'),
    ],
)
def test_bad_value_raises_config_error_naming_the_option(name: str, value) -> None:
    with pytest.raises(ConfigError) as info:
        override(name, value)
    message = str(info.value)
    assert f"[speculative] {name}" in message
    assert "stage 'x'" in message


def test_duplicate_target_names_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"\[speculative\] targets.*unique"):
        override("targets", '[{"name": "a"}, {"name": "b"}, {"name": "a"}]')


def test_unknown_option_is_rejected_and_known_ones_listed() -> None:
    with pytest.raises(ConfigError, match="unknown option 'baseline_ration'") as info:
        override("baseline_ration", 0.5)
    assert "baseline_ratio" in str(info.value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1 min", 60.0), ("60s", 60.0), ("60", 60.0), (60, 60.0), ("500ms", 0.5), ("1.5 minutes", 90.0),
     ("2h", 7200.0), (" 30 sec ", 30.0), ("0", 0.0)],
)
def test_durations(value, seconds: float) -> None:
    assert parse_option("block_slow_node_duration", value, "test") == seconds
    assert parse_option("baseline_lower_bound", value, "test") == seconds


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("On", True), ("1", True), ("false", False),
                                                 ("no", False), (False, False)])
def test_booleans(value, expected: bool) -> None:
    assert parse_option("enabled", value, "test") is expected


def test_valid_overrides_are_applied() -> None:
    cfg = SpeculativeConfig().with_overrides(
        {"enabled": "true", "baseline_ratio": "1", "max_concurrent_executions": "3", "check_interval": "500ms",
         "targets": '[{"name": "a", "slots": 4, "node": "n1", "conf": {"spark.x": 1}}]'}, "test")
    assert cfg.enabled is True and cfg.baseline_ratio == 1.0 and cfg.max_concurrent_executions == 3
    assert cfg.check_interval == 0.5
    assert cfg.targets == (Target(name="a", slots=4, node="n1", conf={"spark.x": "1"}),)


def test_json_round_trip() -> None:
    cfg = SpeculativeConfig(
        enabled=True, max_concurrent_executions=3, block_slow_node_duration=5.0,
        targets=(Target("a", slots=1, node="n1", conf={"k": "v"}), Target("b", conn_id="spark_b")))
    assert SpeculativeConfig.from_json(cfg.to_json()) == cfg
    assert "fault_injection" not in cfg.to_json()


def test_a_plan_config_carrying_fault_injection_reads_without_it() -> None:
    # plan.json is the provider's own file: a name that is not an option configures nothing there.
    data = {**SpeculativeConfig(enabled=True).to_json(), "fault_injection": {"targets": {"local-b": {"factor": 4}}}}
    assert SpeculativeConfig.from_json(data) == SpeculativeConfig(enabled=True)


def test_default_strings_parse_back_to_the_defaults() -> None:
    strings = default_strings()
    assert all(isinstance(v, str) for v in strings.values())
    assert SpeculativeConfig().with_overrides(strings, "airflow.cfg") == SpeculativeConfig()
    assert SpeculativeConfig().with_overrides(strings, "airflow.cfg").targets == DEFAULT_TARGETS


@pytest.mark.parametrize("value", ['{"targets": {"local-b": {"factor": 4}}}', "", {"barrier": True}])
def test_fault_injection_is_refused_naming_the_variable_that_replaces_it(value) -> None:
    with pytest.raises(ConfigError) as info:
        override("fault_injection", value)
    assert str(info.value).startswith("[speculative] fault_injection (stage 'x'): fault injection is a test facility, "
                                      "not an option: set the environment variable SPECULATIVE_FAULT_INJECTION")


# -- graph validation -----------------------------------------------------------------------------


def stage(name: str, parallelism: int = 2, max_parallelism: int = 8, config: dict | None = None,
          **inputs: SourceSpec | ExchangeSpec) -> StageSpec:
    return StageSpec(name=name, application=f"apps/{name}.py", parallelism=parallelism, inputs=dict(inputs),
                     max_parallelism=max_parallelism, config=config or {})


def graph(*stages: StageSpec, config: dict | None = None) -> PipelineGraph:
    return PipelineGraph(name="p", stages={s.name: s for s in stages}, config=config or {})


def hash_of(upstream: str, key: str = "k") -> ExchangeSpec:
    return ExchangeSpec(upstream=upstream, distribution="all_to_all", key=(key,))


def test_valid_graph_orders_producers_first() -> None:
    g = graph(stage("report", 1, src=hash_of("agg", "day")),
              stage("agg", 2, src=hash_of("clean", "user")),
              stage("clean", 2, raw=SourceSpec("/data/raw")))
    g.validate()
    assert g.topological_order() == ["clean", "agg", "report"]
    assert g.output_key("clean") == ("user",)
    assert g.output_key("report") == ()


def test_unknown_upstream() -> None:
    g = graph(stage("b", events=hash_of("missing")))
    with pytest.raises(PipelineError, match=r"stage 'b'.*input 'events' reads unknown stage 'missing'"):
        g.validate()


def test_cycle_message_shows_the_path() -> None:
    g = graph(stage("a", x=hash_of("c")), stage("b", x=hash_of("a")), stage("c", x=hash_of("b")))
    with pytest.raises(PipelineError, match="cyclic stage graph: a -> c -> b -> a"):
        g.validate()


def test_self_loop_is_a_cycle() -> None:
    with pytest.raises(PipelineError, match="reads its own stage"):
        graph(stage("a", x=hash_of("a"))).validate()


@pytest.mark.parametrize("parallelism", [0, -1, 1.5])
def test_parallelism_must_be_positive_integer(parallelism) -> None:
    with pytest.raises(PipelineError, match=r"stage 'a': parallelism must be an integer from 1 to 32768"):
        graph(stage("a", parallelism=parallelism)).validate()


def test_max_parallelism_below_parallelism() -> None:
    with pytest.raises(PipelineError, match="max_parallelism"):
        graph(stage("a", parallelism=4, max_parallelism=2)).validate()


def test_pointwise_needs_equal_parallelism() -> None:
    g = graph(stage("a", 2), stage("b", 3, x=ExchangeSpec(upstream="a", distribution="pointwise")))
    with pytest.raises(PipelineError, match=r"pointwise input 'x' needs equal parallelism \(a=2, b=3\)"):
        g.validate()


def test_all_to_all_needs_a_key() -> None:
    g = graph(stage("a"), stage("b", x=ExchangeSpec(upstream="a", distribution="all_to_all")))
    with pytest.raises(PipelineError, match="all_to_all input 'x' needs a key"):
        g.validate()


def test_producer_consumed_with_two_keys() -> None:
    g = graph(stage("a"), stage("b", x=hash_of("a", "user")), stage("c", x=hash_of("a", "day")))
    with pytest.raises(PipelineError, match="stage 'a' is consumed all_to_all with different keys"):
        g.validate()


def test_producer_consumed_twice_with_the_same_key_is_fine() -> None:
    graph(stage("a"), stage("b", x=hash_of("a", "user")), stage("c", x=hash_of("a", "user"))).validate()


def test_bad_stage_config_names_stage_and_option() -> None:
    g = graph(stage("a", config={"baseline_ratio": 2}))
    with pytest.raises(PipelineError, match=r"\[speculative\] baseline_ratio.*stage 'a'"):
        g.validate()


def test_bad_pipeline_config_names_option() -> None:
    with pytest.raises(PipelineError, match=r"\[speculative\] check_interval"):
        graph(stage("a"), config={"check_interval": 0}).validate()


# -- exchange ranges and file splits --------------------------------------------------------------


@pytest.mark.parametrize(("parallelism", "max_parallelism"), [(1, 1), (1, 32), (3, 32), (7, 32), (32, 32), (5, 8)])
def test_subpartition_ranges_cover_every_subpartition_exactly_once(parallelism: int, max_parallelism: int) -> None:
    ranges = [subpartition_range(i, parallelism, max_parallelism) for i in range(parallelism)]
    covered = [sp for r in ranges for sp in r]
    assert covered == list(range(max_parallelism))  # contiguous, in order, no gaps, no overlap
    assert all(len(r) >= 1 for r in ranges)
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


@pytest.mark.parametrize(("consumer", "parallelism", "max_parallelism"), [(-1, 2, 8), (2, 2, 8), (0, 9, 8)])
def test_subpartition_range_rejects_bad_arguments(consumer: int, parallelism: int, max_parallelism: int) -> None:
    with pytest.raises(ValueError):
        subpartition_range(consumer, parallelism, max_parallelism)


def sample_files() -> list[tuple[str, int]]:
    return [(f"part-{i:02d}.parquet", size) for i, size in enumerate([90, 10, 40, 40, 30, 30, 20, 20, 15, 5])]


def test_split_files_uses_every_file_once_and_balances() -> None:
    files = sample_files()
    splits = split_files(files, 3)
    assert sorted(f for split in splits for f in split) == sorted(files)
    loads = [sum(size for _, size in split) for split in splits]
    assert loads == [105, 100, 95]  # largest file first onto the lightest subtask: 300 bytes split evenly
    assert all(split == sorted(split) for split in splits)


def test_split_files_puts_small_files_beside_a_big_one() -> None:
    splits = split_files([("big", 100)] + [(f"small-{i}", 10) for i in range(10)], 2)
    assert [sum(size for _, size in split) for split in splits] == [100, 100]
    assert splits[0] == [("big", 100)]


def test_split_files_is_deterministic_whatever_the_listing_order() -> None:
    files = sample_files()
    expected = split_files(files, 4)
    for seed in range(5):
        shuffled = files[:]
        random.Random(seed).shuffle(shuffled)
        assert split_files(shuffled, 4) == expected


def test_split_files_with_more_subtasks_than_files_leaves_some_empty() -> None:
    splits = split_files([("a", 1), ("b", 1)], 4)
    assert sum(len(s) for s in splits) == 2
    assert splits.count([]) == 2


# -- authoring API (no DAG, no Airflow) -----------------------------------------------------------


def test_duplicate_stage_name() -> None:
    p = Pipeline("p")
    p.stage("a", application="a.py", parallelism=1)
    with pytest.raises(PipelineError, match="duplicate stage name 'a'"):
        p.stage("a", application="b.py", parallelism=1)


def test_stage_passed_directly_as_input_must_be_wrapped() -> None:
    p = Pipeline("p")
    a = p.stage("a", application="a.py", parallelism=1)
    with pytest.raises(PipelineError, match=r"input 'x' is a stage; wrap it in all_to_all"):
        p.stage("b", application="b.py", parallelism=1, inputs={"x": a})


def test_input_of_wrong_type() -> None:
    with pytest.raises(PipelineError, match="input 'x' must be a source"):
        Pipeline("p").stage("a", application="a.py", parallelism=1, inputs={"x": "/data/raw"})


def test_pipeline_graph_resolves_stage_handles() -> None:
    p = Pipeline("p", default_max_parallelism=16)
    a = p.stage("a", application="a.py", parallelism=2, inputs={"raw": parquet_source("/data/raw")})
    p.stage("b", application="b.py", parallelism=3, inputs={"x": all_to_all(a, key="user")})
    p.stage("c", application="c.py", parallelism=3, inputs={"y": pointwise("b")})
    g = p.graph()
    assert g.topological_order() == ["a", "b", "c"]
    assert g.stages["b"].inputs["x"] == ExchangeSpec(upstream="a", distribution="all_to_all", key=("user",))
    assert g.stages["a"].max_parallelism == 16


def test_pipeline_graph_reports_errors_without_a_dag() -> None:
    p = Pipeline("p")
    p.stage("b", application="b.py", parallelism=2, inputs={"x": all_to_all("missing", key="k")})
    with pytest.raises(PipelineError, match="unknown stage 'missing'"):
        p.graph()
    q = Pipeline("q")
    q.stage("a", application="a.py", parallelism=2)
    q.stage("b", application="b.py", parallelism=3, inputs={"x": pointwise("a")})
    with pytest.raises(PipelineError, match="equal parallelism"):
        q.graph()
    assert not q.compiled


def test_pipeline_config_is_validated() -> None:
    p = Pipeline("p", config={"max_concurrent_executions": 0})
    p.stage("a", application="a.py", parallelism=1)
    with pytest.raises(PipelineError, match=r"\[speculative\] max_concurrent_executions"):
        p.graph()


def test_authoring_api_does_not_import_airflow() -> None:
    code = ("import sys\nfrom airflow_provider_speculative.pipeline import Pipeline\n"
            "p = Pipeline('p'); p.stage('a', application='a.py', parallelism=1); p.graph()\n"
            "print('airflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the option table (declared once in core/config.py) -------------------------------------------


def test_every_option_is_declared_once_and_everything_derives_from_the_table() -> None:
    from dataclasses import fields

    from airflow_provider_speculative.core.config import OPTION_DOCS, OPTIONS
    from airflow_provider_speculative.provider_info import get_provider_info

    names = [o.name for o in OPTIONS]
    assert len(names) == len(set(names))
    assert [f.name for f in fields(SpeculativeConfig)] == names
    assert list(OPTION_DOCS) == names
    cfg = SpeculativeConfig()
    assert {o.name: getattr(cfg, o.name) for o in OPTIONS} == {o.name: o.default for o in OPTIONS}
    declared = get_provider_info()["config"]["speculative"]["options"]
    assert list(declared) == names
    assert {n: (d["type"], d["default"]) for n, d in declared.items()} == {
        o.name: (o.type, o.show_default()) for o in OPTIONS}
    # A declared default must parse back to the default.
    assert {n: parse_option(n, d["default"], "provider info") for n, d in declared.items()} == {
        o.name: o.default for o in OPTIONS}


def test_the_docs_option_table_is_the_generated_one_with_every_option_and_default() -> None:
    from airflow_provider_speculative.core.config import OPTIONS
    from airflow_provider_speculative.devtools.configdoc import BEGIN, END, with_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    assert with_table(text) == text, "docs/configuration.md's option table is out of date: run `make docs`"
    table = text[text.index(BEGIN):text.index(END)]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in table.splitlines()
            if line.startswith("| `")}
    for option in OPTIONS:
        assert rows[f"`{option.name}`"] == (option.readme_default or f"`{option.show_default()}`"), option.name


def test_the_option_table_generator_refuses_a_doc_without_its_markers(tmp_path: Path) -> None:
    from airflow_provider_speculative.devtools.configdoc import BEGIN, main, with_table

    with pytest.raises(ValueError, match="expected one"):
        with_table(f"{BEGIN}\n| old |\n")
    stale = tmp_path / "configuration.md"
    stale.write_text(with_table(f"intro\n{BEGIN}\n<!-- end of the option table -->\nrest\n").replace("`enabled`",
                                                                                                    "`enabld`"))
    assert main(["--check", "--path", str(stale)]) == 1
    assert main(["--path", str(stale)]) == 0 and main(["--check", "--path", str(stale)]) == 0
    assert stale.read_text().startswith("intro\n") and stale.read_text().endswith("rest\n")


def test_misspelled_options_in_airflow_config_are_warned_with_the_known_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative import settings

    warnings: list[str] = []
    # Airflow's structlog set-up does not reach caplog: catch the warning where it is logged.
    monkeypatch.setattr(settings.log, "warning", lambda msg, *args: warnings.append(msg % args))
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__ENABLE", "true")
    cfg = settings.airflow_config()
    assert cfg.enabled is False  # the misspelling is not applied, but named
    text = "\n".join(warnings)
    assert "unknown option(s) enable" in text and "known options: enabled, max_concurrent_executions" in text


def test_declared_config_fields_are_the_option_table() -> None:
    from dataclasses import fields

    from airflow_provider_speculative.core.config import OPTIONS

    declared = {f.name: f for f in fields(SpeculativeConfig)}
    assert list(declared) == [o.name for o in OPTIONS]
    config = SpeculativeConfig()
    for option in OPTIONS:
        assert getattr(config, option.name) == option.default, option.name
