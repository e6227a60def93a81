"""ParquetSink never writes inside another sink's committed output, nor moves what it did not write."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.exceptions import PipelineError, PlanError, StoreError
from airflow_provider_speculative.pipeline import Pipeline, parquet_source
from airflow_provider_speculative.sinks.base import FinalizationContext, PlanContext
from airflow_provider_speculative.sinks.parquet import ParquetSink
from tests.unit.sinks.test_parquet_sink import attempt_output, committed_ids, snapshot


def plan_context(tmp: Path, *, declared: str | None = None, dag: str = "dag", stage: str = "write") -> PlanContext:
    return PlanContext(dag, "run", stage, f"pipeline 'p', stage {stage!r}, sink ParquetSink", tmp / "store",
                       declared={"path": declared} if declared is not None else None)


def commit(tmp: Path, path: Path, *, dag: str = "dag", stage: str = "write", ids: list[int] | None = None) -> None:
    data = tmp / "s" / dag / stage / path.name / "-".join(map(str, ids or [1]))
    ctx = FinalizationContext(parallelism=1, attempts={0: attempt_output(data, 0, 0, ids or [1])},
                              dag_id=dag, run_id="run", stage=stage)
    ParquetSink(str(path)).finalize_global(ctx)


def test_a_path_inside_another_stages_committed_output_is_refused_at_plan_and_commit(tmp_path: Path):
    q1 = tmp_path / "out" / "q1"
    commit(tmp_path, q1, dag="other", stage="agg")
    before = snapshot(q1)
    nested = q1 / "day=2"
    for stage in ("agg", "write"):  # another stage, or the owner itself one level down
        with pytest.raises(PlanError, match=r"stage '\w+', sink ParquetSink: will not replace '.*day=2': it lies "
                                            r"inside '.*q1', the committed output of DAG 'other', stage 'agg'"):
            ParquetSink(str(nested)).validate_plan(plan_context(tmp_path, stage=stage))
    with pytest.raises(StoreError, match="lies inside"):
        commit(tmp_path, nested, ids=[9])
    assert snapshot(q1) == before and not nested.exists()


def test_own_output_with_something_put_inside_is_not_moved(tmp_path: Path):
    q1 = tmp_path / "out" / "q1"
    commit(tmp_path, q1)
    before = snapshot(q1)
    intruder = q1 / "day=2"
    intruder.mkdir()
    (intruder / "part-0.parquet").write_bytes(b"someone else's")
    with pytest.raises(PlanError, match=r"besides this stage's committed files it holds 1 entries it did not write "
                                        r"\(e.g. 'day=2'\); the sink never moves what it did not write"):
        ParquetSink(str(q1)).validate_plan(plan_context(tmp_path))
    with pytest.raises(StoreError, match="did not write"):
        commit(tmp_path, q1, ids=[7])
    assert (intruder / "part-0.parquet").read_bytes() == b"someone else's"
    assert {p.name: p.read_bytes() for p in q1.iterdir() if p.is_file()} == before
    assert not [p for p in q1.parent.iterdir() if p.name.startswith(".q1.old-")]  # nothing hidden away
    # A rerun of the untouched output is still fine.
    (intruder / "part-0.parquet").unlink()
    intruder.rmdir()
    commit(tmp_path, q1, ids=[8])
    assert committed_ids(q1) == [8]


@pytest.mark.parametrize("declared,rendered,why", [
    ("/out/q1/{{ params.day }}", "/out/q1/", "ends with '/' once rendered"),
    ("/out/{{ params.region }}/q1", "/out//q1", "has an empty part once rendered"),
    ("/out/q1/{{ params.day }}", "/out/q1/..", "has a '.' or '..' part"),
    ("/out/q1/{{ params.day }}", "/out/q1/.", "has a '.' or '..' part"),
    ("/out/{{ params.x }}", "/out/a/../../etc", "has a '.' or '..' part"),
])
def test_a_template_that_renders_an_empty_or_dot_part_is_refused_at_plan(tmp_path: Path, declared: str,
                                                                          rendered: str, why: str):
    rendered = str(tmp_path) + rendered
    with pytest.raises(PlanError, match=rf"sink ParquetSink: path '.*' {why}"):
        ParquetSink(rendered).validate_plan(plan_context(tmp_path, declared=str(tmp_path) + declared))


def test_slashes_the_author_wrote_are_kept(tmp_path: Path):
    for template in ("/out//q1/{{ ds }}", "/out/q1/{{ ds }}"):
        rendered = template.replace("{{ ds }}", "2026-01-01")
        ParquetSink(f"{tmp_path}{rendered}").validate_plan(plan_context(tmp_path, declared=f"{tmp_path}{template}"))


def _two_stages(a: str, b: str) -> None:
    p = Pipeline("p")
    for name, path in (("a", a), ("b", b)):
        p.stage(name, application="/apps/w.py", parallelism=1, inputs={"rows": parquet_source("/data/rows")},
                sink=ParquetSink(path))
    p.graph()


def test_two_stages_sinking_to_the_same_or_nested_paths_fail_at_parse():
    with pytest.raises(PipelineError, match=r"pipeline 'p': stages 'a' and 'b' both sink to '/out/q1'"):
        _two_stages("/out/q1", "/out//q1/")
    with pytest.raises(PipelineError, match=r"stages 'a' and 'b' both sink to '/out/\{\{ ds \}\}'"):
        _two_stages("/out/{{ ds }}", "/out/{{ ds }}")
    with pytest.raises(PipelineError, match=r"stage 'b' sinks to '/out/q1/x', inside the sink path '/out/q1' of "
                                            r"stage 'a'"):
        _two_stages("/out/q1", "/out/q1/x")
    _two_stages("/out/q1", "/out/q10")
    _two_stages("/out/a/{{ ds }}", "/out/b/{{ ds }}")


@pytest.mark.parametrize("path", ["/out/../etc", "/out/./q1"])
def test_dot_parts_in_a_literal_path_fail_at_parse(path: str):
    p = Pipeline("p")
    with pytest.raises(PipelineError, match=r"stage 'w', sink ParquetSink: path .* has a '.' or '..' part"):
        p.stage("w", application="/apps/w.py", parallelism=1, sink=ParquetSink(path))


@pytest.mark.parametrize("path,why", [
    ("/", "is rooted at '/'"), ("/**/*.parquet", "is rooted at '/'"), ("/*", "is rooted at '/'"),
    ("/data/../", "is rooted at '/'"), ("/proc", "system directory /proc"), ("/sys/fs/*.parquet", "/sys"),
    ("/dev/shm/x", "/dev"),
])
def test_a_source_rooted_at_the_filesystem_or_a_system_root_fails_at_parse(path: str, why: str):
    p = Pipeline("p")
    p.stage("s", application="/apps/w.py", parallelism=1, inputs={"rows": parquet_source(path)})
    with pytest.raises(PipelineError, match=rf"pipeline 'p', stage 's', input 'rows': source path .*{why}"):
        p.graph()
