"""Adaptive parallelism and byte-balanced exchange ranges: the arithmetic, the graph rules and the plan."""

from __future__ import annotations

import random
from typing import Any

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.parallelism import (
    balanced_ranges,
    decide_parallelism,
    equal_count_ranges,
    exchange_ranges,
    full_waves,
)
from airflow_provider_speculative.exceptions import ConfigError, PipelineError
from tests.factories import planned

MiB = 1024**2


def _sums(sizes: list[int], ranges: list[tuple[int, int]]) -> list[int]:
    return [sum(sizes[a:b]) for a, b in ranges]


def _check_cover(ranges: list[tuple[int, int]], m: int) -> None:
    assert ranges[0][0] == 0 and ranges[-1][1] == m
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))


def test_balanced_ranges_cover_contiguously_and_non_empty() -> None:
    rng = random.Random(7)
    for _ in range(300):
        m = rng.randint(1, 40)
        n = rng.randint(1, m)
        sizes = [rng.choice([0, 0, 1, 5, 100, 10_000]) for _ in range(m)]
        ranges = balanced_ranges(sizes, n)
        assert len(ranges) == n
        _check_cover(ranges, m)
        assert balanced_ranges(sizes, n) == ranges  # deterministic


def test_equal_bytes_instead_of_equal_counts() -> None:
    sizes = [100, 100, 100, 100, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert _sums(sizes, equal_count_ranges(16, 4)) == [400, 4, 4, 4]
    balanced = balanced_ranges(sizes, 4)
    assert balanced == [(0, 1), (1, 2), (2, 3), (3, 16)]
    assert _sums(sizes, balanced) == [100, 100, 100, 112]


def test_a_huge_subpartition_gets_a_range_of_its_own_and_the_rest_is_shared_evenly() -> None:
    sizes = [10] * 8 + [610] + [10] * 7  # subpartition 8 holds 61% of 1000 bytes
    ranges = balanced_ranges(sizes, 4)
    assert (8, 9) in ranges
    others = [s for r, s in zip(ranges, _sums(sizes, ranges), strict=True) if r != (8, 9)]
    assert max(others) <= 2 * sum(others) / len(others)


def test_all_zero_and_exact_counts() -> None:
    assert balanced_ranges([0, 0, 0, 0], 2) == [(0, 2), (2, 4)]
    assert balanced_ranges([5, 1, 9], 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError):
        balanced_ranges([1, 2], 3)


def test_balanced_ranges_never_worse_than_equal_counts_on_random_data() -> None:
    rng = random.Random(11)
    for _ in range(200):
        m, n = 32, rng.randint(2, 8)
        sizes = [int(rng.paretovariate(1.2) * 100) for _ in range(m)]
        assert max(_sums(sizes, balanced_ranges(sizes, n))) <= max(_sums(sizes, equal_count_ranges(m, n)))


def _skewed_matrix(producers: int = 4, m: int = 16, hot: int = 5, hot_bytes: int = 600) -> list[list[int]]:
    return [[hot_bytes if sp == hot else 10 for sp in range(m)] for _ in range(producers)]


def test_skew_is_reported_when_the_stage_does_not_declare_splittable_skew() -> None:
    result = exchange_ranges(_skewed_matrix(), 4)
    assert all(producers == (0, 4) for producers, _ in result.reads)
    assert [r for _, r in result.reads if r == (5, 6)] == [(5, 6)]
    (entry,) = result.skew
    assert entry["subpartition"] == 5 and entry["split"] == 1
    assert round(entry["share"], 2) == round(2400 / (2400 + 4 * 15 * 10), 2)
    assert "not split (stage does not declare splittable_skew)" in entry["reason"] or entry["reason"]


def test_splittable_skew_splits_the_subpartition_by_producer_range() -> None:
    matrix = _skewed_matrix()
    result = exchange_ranges(matrix, 4, splittable_skew=True)
    assert len(result.reads) == 4
    hot = [producers for producers, sps in result.reads if sps == (5, 6)]
    assert len(hot) >= 2
    # Disjoint producer ranges that together cover every producer, exactly once.
    covered = sorted(p for lo, hi in hot for p in range(lo, hi))
    assert covered == [0, 1, 2, 3]
    # Every (producer, subpartition) byte is read by exactly one consumer.
    seen: dict[tuple[int, int], int] = {}
    for (lo, hi), (a, b) in result.reads:
        for p in range(lo, hi):
            for sp in range(a, b):
                seen[(p, sp)] = seen.get((p, sp), 0) + 1
    assert all(v == 1 for v in seen.values()) and len(seen) == 4 * 16
    loads = [sum(matrix[p][sp] for p in range(lo, hi) for sp in range(a, b)) for (lo, hi), (a, b) in result.reads]
    assert max(loads) / sorted(loads)[len(loads) // 2] < 1.5
    assert result.skew[0]["split"] == len(hot)


def test_splittable_skew_falls_back_when_there_are_too_many_units() -> None:
    matrix = [[600 if sp in (2, 6, 10) else 1 for sp in range(16)] for _ in range(2)]
    result = exchange_ranges(matrix, 3, splittable_skew=True)
    assert all(producers == (0, 2) for producers, _ in result.reads)
    assert result.skew == [] or all(e["split"] == 1 for e in result.skew)


def test_decide_parallelism_clamps_and_applies_bounds() -> None:
    d = decide_parallelism(total_bytes=1000 * MiB, per_subtask=128 * MiB, minimum=1, maximum=32, bounds={})
    assert (d["wanted"], d["chosen"], d["bounded_by"]) == (8, 8, "bytes")
    d = decide_parallelism(total_bytes=10 * MiB, per_subtask=128 * MiB, minimum=3, maximum=32, bounds={})
    assert (d["chosen"], d["bounded_by"]) == (3, "min_parallelism")
    d = decide_parallelism(total_bytes=10_000 * MiB, per_subtask=128 * MiB, minimum=1, maximum=16, bounds={})
    assert (d["chosen"], d["bounded_by"]) == (16, "max_parallelism")
    d = decide_parallelism(total_bytes=10_000 * MiB, per_subtask=128 * MiB, minimum=6, maximum=16,
                           bounds={"files": 4}, files=4)
    assert (d["chosen"], d["bounded_by"], d["files"]) == (4, "files", 4)
    assert decide_parallelism(total_bytes=0, per_subtask=1, minimum=1, maximum=4, bounds={})["chosen"] == 1


def test_size_option_accepts_units_and_names_the_option() -> None:
    assert SpeculativeConfig().data_volume_per_subtask == 128 * MiB
    cfg = SpeculativeConfig().with_overrides({"data_volume_per_subtask": "64MB"}, "t")
    assert cfg.data_volume_per_subtask == 64 * MiB
    assert SpeculativeConfig().with_overrides({"data_volume_per_subtask": "1 GiB"}, "t").data_volume_per_subtask \
        == 1024 * MiB
    with pytest.raises(ConfigError, match="data_volume_per_subtask"):
        SpeculativeConfig().with_overrides({"data_volume_per_subtask": "lots"}, "t")


# -- graph rules ------------------------------------------------------------------------------------

def _graph(**stages: StageSpec) -> PipelineGraph:
    graph = PipelineGraph("p", stages)
    graph.validate()
    return graph


def _scan(parallelism: Any = "auto", **kw: Any) -> StageSpec:
    return StageSpec("scan", "/a.py", parallelism, {"src": SourceSpec("/data")}, max_parallelism=16, **kw)


def test_auto_graph_rules() -> None:
    _graph(scan=_scan(min_parallelism=2))
    with pytest.raises(PipelineError, match=r"stage 'scan': max_parallelism .* must be >= min_parallelism"):
        _graph(scan=_scan(min_parallelism=20))
    with pytest.raises(PipelineError, match="min_parallelism applies only to parallelism='auto'"):
        _graph(scan=_scan(4, min_parallelism=2))
    with pytest.raises(PipelineError, match="parallelism must be an integer or 'auto', got 'many'"):
        _graph(scan=_scan("many"))
    with pytest.raises(PipelineError, match=r"stage 'scan'.*data_volume_per_subtask"):
        _graph(scan=_scan(config={"data_volume_per_subtask": "-3"}))
    # A fixed pointwise consumer of an auto stage cannot know its parallelism.
    with pytest.raises(PipelineError, match="declare parallelism='auto' on 'post'"):
        _graph(scan=_scan(), post=StageSpec("post", "/b.py", 4, {"x": ExchangeSpec("scan", "pointwise")}))
    _graph(scan=_scan(), post=StageSpec("post", "/b.py", "auto", {"x": ExchangeSpec("scan", "pointwise")},
                                        max_parallelism=16))
    with pytest.raises(PipelineError, match="inherits 'scan'"):
        _graph(scan=_scan(), post=StageSpec("post", "/b.py", "auto", {"x": ExchangeSpec("scan", "pointwise")},
                                            max_parallelism=8))
    with pytest.raises(PipelineError, match="min_parallelism 17 exceeds the 16 subpartitions"):
        _graph(scan=_scan(), agg=StageSpec("agg", "/b.py", "auto", {"x": ExchangeSpec("scan", "all_to_all", ("k",))},
                                           max_parallelism=32, min_parallelism=17))
    with pytest.raises(PipelineError, match="splittable_skew needs exactly one all_to_all input"):
        _graph(scan=_scan(splittable_skew=True))


# -- plans ------------------------------------------------------------------------------------------

def _committed(stage: str, matrix: list[list[int]]) -> dict[str, Any]:
    return {"stage": stage, "parallelism": len(matrix), "fingerprint": "f" + stage, "subtasks": {
        str(p): {"attempt": 0, "bytes": sum(row), "schema": {"fields": [{"name": "k", "type": "long"}]},
                 "subpartition_bytes": {str(sp): b for sp, b in enumerate(row) if b}}
        for p, row in enumerate(matrix)}}


def _agg_graph(parallelism: Any = 4, splittable: bool = False, producers: Any = 4) -> PipelineGraph:
    return _graph(
        scan=StageSpec("scan", "/a.py", producers, {"src": SourceSpec("/data")}, max_parallelism=16),
        agg=StageSpec("agg", "/b.py", parallelism, {"rows": ExchangeSpec("scan", "all_to_all", ("k",))},
                      max_parallelism=16, splittable_skew=splittable))


def test_auto_source_stage_is_decided_from_bytes_and_bounded_by_files() -> None:
    graph = _graph(scan=_scan())
    files = [(f"/data/{i}.parquet", 100 * MiB) for i in range(10)]
    plan = planned(graph, "scan", sources={"src": files})
    assert plan["parallelism"] == len(plan["subtasks"]) == 8  # ceil(1000 MiB / 128 MiB)
    assert plan["parallelism_decision"]["bytes"] == 1000 * MiB and plan["parallelism_decision"]["files"] == 10
    small = SpeculativeConfig().with_overrides({"data_volume_per_subtask": "10MB", "full_waves": False}, "t")
    plan = planned(graph, "scan", small, sources={"src": files})
    assert (plan["parallelism"], plan["parallelism_decision"]["bounded_by"]) == (10, "files")
    # On the default targets' 4 slots, 10 files make 3 waves (the last half empty); 12 would exceed the
    # files, so the stage runs 2 full waves of 8.
    waved = planned(graph, "scan", small.with_overrides({"full_waves": True}, "t"), sources={"src": files})
    decision = waved["parallelism_decision"]
    assert (waved["parallelism"], decision["before_waves"], decision["bounded_by"]) == (
        8, 10, "full waves of 4 slots")


def test_auto_exchange_consumer_from_committed_bytes_and_pointwise_inherits() -> None:
    matrix = [[MiB] * 16 for _ in range(3)]  # 48 MiB
    graph = _graph(
        scan=_scan(),
        agg=StageSpec("agg", "/b.py", "auto", {"rows": ExchangeSpec("scan", "all_to_all", ("k",))},
                      max_parallelism=16, config={"data_volume_per_subtask": "16MB"}),
        post=StageSpec("post", "/c.py", "auto", {"x": ExchangeSpec("agg", "pointwise")}, max_parallelism=16))
    config = SpeculativeConfig().with_overrides({"data_volume_per_subtask": "16MB", "full_waves": False}, "stage")
    agg = planned(graph, "agg", config, upstream={"scan": _committed("scan", matrix)})
    assert agg["parallelism"] == 3 and agg["inputs"]["rows"]["producer_parallelism"] == 3
    assert [s["input_bytes"] for s in agg["subtasks"]] == [15 * MiB, 15 * MiB, 18 * MiB]  # 16 subpartitions of 3 MiB
    # 3 subtasks on 4 slots leave one idle: 4 subtasks of 12 MiB (at least half of 16 MiB each) fill the wave.
    waved = planned(graph, "agg", config.with_overrides({"full_waves": True}, "stage"),
                    upstream={"scan": _committed("scan", matrix)})
    assert waved["parallelism"] == 4 and [s["input_bytes"] for s in waved["subtasks"]] == [12 * MiB] * 4
    post = planned(graph, "post", upstream={"agg": _committed("agg", [[1]] * 3)})
    assert post["parallelism"] == 3 and post["parallelism_decision"]["inherited_from"] == ["agg"]


def test_plan_uses_byte_balanced_ranges_and_fingerprint_tells_them_apart() -> None:
    matrix = [[100 if sp < 4 else 1 for sp in range(16)] for _ in range(4)]
    upstream = {"scan": _committed("scan", matrix)}
    balanced = planned(_agg_graph(), "agg", upstream=upstream)
    counted = planned(_agg_graph(), "agg", SpeculativeConfig().with_overrides({"balanced_exchange_ranges": False}, "t"),
                      upstream=upstream)
    assert [s["inputs"]["rows"]["subpartitions"] for s in counted["subtasks"]] == [[0, 4], [4, 8], [8, 12], [12, 16]]
    assert [s["inputs"]["rows"]["subpartitions"] for s in balanced["subtasks"]] == [[0, 1], [1, 2], [2, 3], [3, 16]]
    assert [s["input_bytes"] for s in balanced["subtasks"]] == [400, 400, 400, 448]
    assert balanced["fingerprint"] != counted["fingerprint"]


def test_plan_warns_about_unsplit_skew_and_splits_when_declared() -> None:
    upstream = {"scan": _committed("scan", _skewed_matrix())}
    plain = planned(_agg_graph(), "agg", upstream=upstream)
    assert plain["warnings"] == ["input 'rows': subpartition 5 holds 80% of the bytes; not split "
                                 "(stage does not declare splittable_skew)"]
    split = planned(_agg_graph(splittable=True), "agg", upstream=upstream)
    assert split["warnings"] == [] and split["exchange_skew"][0]["split"] >= 2
    assert split["fingerprint"] != plain["fingerprint"]  # producer ranges are part of the subtasks' inputs
    hot = [s["inputs"]["rows"] for s in split["subtasks"] if s["inputs"]["rows"]["subpartitions"] == [5, 6]]
    assert [h["producers"] for h in hot] == [[0, 2], [2, 4]]
    loads = [s["input_bytes"] for s in split["subtasks"]]
    # Two runs of ordinary subpartitions need a consumer each; the hot one is halved by producer range.
    assert sum(loads) == 4 * (600 + 15 * 10) and max(loads) == 1200
    assert max(s["input_bytes"] for s in plain["subtasks"]) >= 2400


@pytest.mark.parametrize(("chosen", "lower", "upper", "smallest", "want"), [
    (8, 1, 64, None, 8),     # already whole waves
    (9, 1, 64, None, 8),     # one attempt alone in a third wave: down
    (10, 1, 64, None, 12),   # half a wave: up on the tie
    (11, 1, 64, None, 12),   # up
    (11, 1, 10, None, 8),    # up exceeds a bound (files, max_parallelism): down
    (9, 9, 64, None, 12),    # down would go below min_parallelism: up
    (9, 9, 10, None, 9),     # neither fits: unchanged
    (3, 1, 64, None, 4),     # less than one wave: up to one
    (1, 1, 64, 1.0, 1),      # too few bytes to give every slot half a subtask's share: unchanged
    (3, 3, 64, 2.5, 3),      # up to 4 would halve subtasks below half their share: and down is below min
    (5, 1, 64, 10.0, 4),     # down
])
def test_full_waves_rounds_to_the_nearer_multiple_within_bounds(chosen: int, lower: int, upper: int,
                                                                smallest: float | None, want: int) -> None:
    assert full_waves(chosen, 4, lower=lower, upper=upper, smallest=smallest) == want


def test_full_waves_is_off_for_reactive_targets_and_when_disabled() -> None:
    graph = _graph(scan=_scan())
    files = [(f"/data/{i}.parquet", 100 * MiB) for i in range(10)]
    small = {"data_volume_per_subtask": "10MB"}
    reactive = SpeculativeConfig().with_overrides({**small, "targets": [
        {"name": "cluster", "conn_id": "spark_default", "slots": "auto", "master_ui": "http://m:8080"}]}, "t")
    plan = planned(graph, "scan", reactive, sources={"src": files})
    assert plan["parallelism"] == 10 and "slots" not in plan["parallelism_decision"]
    off = SpeculativeConfig().with_overrides({**small, "full_waves": False}, "t")
    assert planned(graph, "scan", off, sources={"src": files})["parallelism"] == 10


def test_decide_parallelism_records_the_rounding_for_status() -> None:
    from airflow_provider_speculative.core.parallelism import describe_decision

    d = decide_parallelism(total_bytes=9 * 128 * MiB, per_subtask=128 * MiB, minimum=1, maximum=32, bounds={},
                           slots=4)
    assert (d["wanted"], d["before_waves"], d["chosen"], d["slots"]) == (9, 9, 8, 4)
    assert "9 before rounding to waves: 8 (bounded by full waves of 4 slots)" in describe_decision(d)
    one_slot = decide_parallelism(total_bytes=9 * 128 * MiB, per_subtask=128 * MiB, minimum=1, maximum=32,
                                  bounds={}, slots=1)
    assert one_slot["chosen"] == 9 and "before_waves" not in one_slot
