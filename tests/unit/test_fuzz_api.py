"""Fuzzing the authoring API: any input ends in a provider error that names what is wrong, or in a plan
that round-trips through JSON with only finite numbers. Never a raw Python exception.

Hypothesis draws pipelines of one to three stages with random options (``[speculative]`` names with
values of every type, huge and non-finite numbers), parallelism, keys, sources and exchanges; the
pipeline is validated as at parse time and each stage is planned with the pure planner on fake listings.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_speculative.core.config import OPTIONS, SpeculativeConfig
from airflow_provider_speculative.core.graph import SourceSpec
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.exceptions import SpeculativeError
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, broadcast, parquet_source, pointwise

NAMES = [o.name for o in OPTIONS] + ["baseline_ration", "", " enabled"]
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["5s", "1 min", "auto", "64MB", "0", "-1", "1e999", "nan", "inf", "[]", "{}", "true",
                     "http://h:18080", "javascript:alert(1)", "region", "/abs/path"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
# Mostly good values, so that a share of the pipelines gets past parsing and is planned too.
COUNTS = st.one_of(st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=8),
                   st.integers(min_value=-2, max_value=40), st.sampled_from(["auto", "many", True, None, 1.5]))
KEYS = st.one_of(st.just("k"), st.just(["k"]), st.just(["k", "j"]),
                 st.sampled_from(["", [""], " k", None, 3]), st.text(max_size=4))
GOOD_CONFIG = st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "baseline_ratio": st.floats(0.1, 1.0),
                                                  "data_volume_per_subtask": st.sampled_from(["64MB", 100, "1 GiB"]),
                                                  "broadcast_max_bytes": st.sampled_from([1, "1MB", 10 ** 9])})


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = draw(st.one_of(GOOD_CONFIG, GOOD_CONFIG, st.dictionaries(st.sampled_from(NAMES), WEIRD, max_size=3)))
    stages = []
    for i in range(draw(st.integers(min_value=1, max_value=3))):
        inputs: dict[str, Any] = {}
        kinds = ["source", "broadcast_source"] + (["all_to_all", "pointwise", "broadcast"] if i else [])
        for n in range(draw(st.integers(min_value=0 if i else 1, max_value=2))):
            kind = draw(st.sampled_from(kinds))
            upstream = f"s{draw(st.integers(min_value=0, max_value=max(0, i - 1)))}"
            inputs[f"in{n}"] = {"kind": kind, "upstream": upstream, "key": draw(KEYS),
                                "path": draw(st.sampled_from(["/data/x", "/data/y", "/data/z/*.parquet", "rel", "/",
                                                              "/proc/x", ""]))}
        stages.append({"name": f"s{i}", "parallelism": draw(COUNTS),
                       "max_parallelism": draw(st.one_of(st.none(), COUNTS)),
                       "application": draw(st.sampled_from(["/apps/a.py"] * 4 + ["apps/a.py", "/apps/a.txt", "",
                                                                                  None])),
                       "config": draw(st.one_of(st.just({}), st.just({}), GOOD_CONFIG,
                                                st.dictionaries(st.sampled_from(NAMES), WEIRD, max_size=2))),
                       "deterministic": draw(st.sampled_from([True, True, False, "no"])),
                       "inputs": inputs})
    return config, stages


def _input(spec: dict[str, Any], handles: dict[str, Any]) -> Any:
    upstream = handles.get(spec["upstream"], spec["upstream"])
    kind = spec["kind"]
    if kind == "source":
        return parquet_source(spec["path"])
    if kind == "broadcast_source":
        return broadcast(parquet_source(spec["path"]))
    if kind == "all_to_all":
        return all_to_all(upstream, key=spec["key"])
    if kind == "pointwise":
        return pointwise(upstream)
    return broadcast(upstream)


def _committed(stage: str, parallelism: int, count: int) -> dict[str, Any]:
    schema = {"type": "struct", "fields": [{"name": "k", "type": "long"}, {"name": "j", "type": "string"}]}
    return {"stage": stage, "parallelism": parallelism, "fingerprint": stage, "subtasks": {
        str(p): {"attempt": 0, "bytes": 10, "schema": schema, "subpartition_bytes": {"0": 10},
                 "partitioning": {"max_parallelism": count, "hash": "xxhash64-of-string-v1"}}
        for p in range(parallelism)}}


@settings(max_examples=1000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(pipelines())
def test_any_input_is_refused_clearly_or_plans_to_finite_json(
        drawn: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    config, stages = drawn
    try:
        pipeline = Pipeline("fuzz", config=config)
        handles: dict[str, Any] = {}
        for stage in stages:
            handles[stage["name"]] = pipeline.stage(
                stage["name"], application=stage["application"], parallelism=stage["parallelism"],
                max_parallelism=stage["max_parallelism"], config=stage["config"],
                deterministic=stage["deterministic"],
                inputs={name: _input(spec, handles) for name, spec in stage["inputs"].items()})
        graph = pipeline.graph()
    except SpeculativeError as exc:
        assert str(exc).strip() and "\n" not in str(exc)
        event(f"refused at parse: {type(exc).__name__}")
        return
    # Parsed: every stage plans (or is refused by the planner, naming it) to finite, round-tripping JSON.
    committed: dict[str, Any] = {}
    for name in graph.topological_order():
        spec = graph.stages[name]
        try:
            cfg = SpeculativeConfig().with_overrides(graph.config, "p").with_overrides(spec.config, "s")
            plan = plan_stage(graph, name, cfg,
                              source_files={n: [(f"/data/f{i}.parquet", 100 + i) for i in range(4)]
                                            for n, s in spec.inputs.items() if isinstance(s, SourceSpec)},
                              upstream_committed={u: committed[u] for u in graph.upstreams(name)},
                              sink=None, speculation_blocker=None,
                              context={"dag_id": "d", "run_id": "r", "store_root": "/store", "targets": {}})
        except SpeculativeError as exc:
            assert name in str(exc) and "\n" not in str(exc)
            event("refused at plan")
            return
        text = json.dumps(plan, allow_nan=False)
        assert json.loads(text)["fingerprint"] == plan["fingerprint"] and _finite(plan)
        committed[name] = _committed(name, plan["parallelism"], spec.max_parallelism)
    event(f"planned {len(stages)} stage(s)")
