"""ParquetSink.finalize_global: commit exactly the admitted attempts, replace on rerun, stay intact on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.sinks.base import AttemptResult, FinalizationContext, Sink
from airflow_provider_speculative.sinks.parquet import ParquetSink
from airflow_provider_speculative.store.files import StoreError
from airflow_provider_speculative.store.manifest import build_manifest


def attempt_output(root: Path, subtask: int, attempt: int, *chunks: list[int]) -> AttemptResult:
    """Write one Parquet file per chunk of ids into a fake attempt data dir and describe it."""
    data = root / f"subtask={subtask}" / f"attempt={attempt}" / "data"
    data.mkdir(parents=True)
    for n, ids in enumerate(chunks):
        table = pa.table({"id": pa.array(ids, pa.int64()), "attempt": pa.array([attempt] * len(ids), pa.int64())})
        pq.write_table(table, data / f"part-{n}.parquet")
    return AttemptResult(subtask=subtask, attempt=attempt, data_dir=data, files=build_manifest(data)["files"])


def context(*results: AttemptResult) -> FinalizationContext:
    return FinalizationContext(parallelism=len(results), attempts={r.subtask: r for r in results},
                               dag_id="dag", run_id="run", stage="write", logical_date="2026-01-01")


def committed_ids(final: Path) -> list[int]:
    return sorted(pq.read_table(final).column("id").to_pylist())


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def leftovers(final: Path) -> list[str]:
    return sorted(p.name for p in final.parent.iterdir() if p.name.startswith(f".{final.name}."))


@pytest.fixture
def final(tmp_path: Path) -> Path:
    return tmp_path / "out" / "ds=2026-01-01"


def test_finalize_commits_exactly_the_admitted_attempts(tmp_path: Path, final: Path) -> None:
    store = tmp_path / "store"
    winner0 = attempt_output(store, 0, 1, [1, 2], [3])
    attempt_output(store, 0, 0, [1, 2, 3, 999])  # the cancelled loser of subtask 0: never committed
    winner1 = attempt_output(store, 1, 0, [4, 5])

    summary = ParquetSink(str(final)).finalize_global(context(winner0, winner1))

    assert sorted(p.name for p in final.iterdir()) == [
        "_SUCCESS", "part-00000-000.parquet", "part-00000-001.parquet", "part-00001-000.parquet"]
    assert committed_ids(final) == [1, 2, 3, 4, 5]
    assert set(pq.read_table(final).column("attempt").to_pylist()) == {0, 1}
    manifest = json.loads((final / "_SUCCESS").read_text())
    assert [(f["path"], f["subtask"], f["attempt"]) for f in manifest["files"]] == [
        ("part-00000-000.parquet", 0, 1), ("part-00000-001.parquet", 0, 1), ("part-00001-000.parquet", 1, 0)]
    assert (manifest["dag_id"], manifest["run_id"], manifest["stage"]) == ("dag", "run", "write")
    assert summary["files"] == 3 and summary["path"] == str(final)
    assert leftovers(final) == []


def test_rerun_replaces_the_directory_instead_of_appending(tmp_path: Path, final: Path) -> None:
    sink = ParquetSink(str(final))
    sink.finalize_global(context(attempt_output(tmp_path / "run1", 0, 0, [1], [2], [3]),
                                 attempt_output(tmp_path / "run1", 1, 0, [4])))
    sink.finalize_global(context(attempt_output(tmp_path / "run2", 0, 0, [10])))

    assert sorted(p.name for p in final.iterdir()) == ["_SUCCESS", "part-00000-000.parquet"]
    assert committed_ids(final) == [10]
    manifest = json.loads((final / "_SUCCESS").read_text())
    assert [f["path"] for f in manifest["files"]] == ["part-00000-000.parquet"]
    assert leftovers(final) == []


def test_finalize_is_idempotent(tmp_path: Path, final: Path) -> None:
    ctx = context(attempt_output(tmp_path, 0, 0, [1, 2]), attempt_output(tmp_path, 1, 2, [3]))
    ParquetSink(str(final)).finalize_global(ctx)
    first = {k: v for k, v in snapshot(final).items() if k != "_SUCCESS"}
    ParquetSink(str(final)).finalize_global(ctx)
    assert {k: v for k, v in snapshot(final).items() if k != "_SUCCESS"} == first
    assert committed_ids(final) == [1, 2, 3]


def commit_then_fail(tmp_path: Path, final: Path, broken: AttemptResult) -> tuple[dict[str, bytes], Exception]:
    ParquetSink(str(final)).finalize_global(context(attempt_output(tmp_path / "good", 0, 0, [1, 2]),
                                                    attempt_output(tmp_path / "good", 1, 0, [3])))
    before = snapshot(final)
    healthy = attempt_output(tmp_path / "bad", 0, 0, [7, 8])
    with pytest.raises(StoreError) as info:
        ParquetSink(str(final)).finalize_global(context(healthy, broken))
    return before, info.value


def test_failure_midway_keeps_previous_commit_and_no_staging(tmp_path: Path, final: Path) -> None:
    broken = attempt_output(tmp_path / "bad", 1, 3, [9], [10])
    (broken.data_dir / "part-1.parquet").unlink()  # listed in the manifest, gone from disk
    before, error = commit_then_fail(tmp_path, final, broken)
    assert str(final) in str(error)
    assert snapshot(final) == before
    assert committed_ids(final) == [1, 2, 3]
    assert leftovers(final) == []


def test_checksum_mismatch_keeps_previous_commit_and_no_staging(tmp_path: Path, final: Path) -> None:
    broken = attempt_output(tmp_path / "bad", 1, 3, [9])
    path = broken.data_dir / "part-0.parquet"
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0xFF
    path.write_bytes(bytes(content))
    before, error = commit_then_fail(tmp_path, final, broken)
    assert "checksum mismatch" in str(error)
    assert snapshot(final) == before
    assert leftovers(final) == []


def test_failure_on_first_commit_leaves_nothing(tmp_path: Path, final: Path) -> None:
    broken = attempt_output(tmp_path, 0, 0, [1])
    (broken.data_dir / "part-0.parquet").unlink()
    with pytest.raises(StoreError):
        ParquetSink(str(final)).finalize_global(context(broken))
    assert not final.exists()
    assert leftovers(final) == []


def test_parquet_sink_opts_in_to_concurrent_attempts_and_round_trips(final: Path) -> None:
    sink = ParquetSink(str(final))
    assert sink.supports_concurrent_attempts
    clone = Sink.from_json(sink.to_json())
    assert isinstance(clone, ParquetSink) and clone.path == str(final)


# -- never replace what the sink did not write -----------------------------------------------------


def test_a_users_directory_at_the_path_is_never_replaced(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "q3.xlsx").write_bytes(b"the user's work")
    with pytest.raises(StoreError, match="no ParquetSink manifest"):
        ParquetSink(str(reports)).finalize_global(context(attempt_output(tmp_path / "s", 0, 0, [1])))
    assert snapshot(reports) == {"q3.xlsx": b"the user's work"}
    assert leftovers(reports) == []


def test_a_sibling_reached_through_dotdot_is_never_replaced(tmp_path: Path) -> None:
    sibling = tmp_path / "other"
    sibling.mkdir()
    (sibling / "keep.parquet").write_bytes(b"PAR1 not ours PAR1")
    path = str(tmp_path / "out" / ".." / "other")
    with pytest.raises(StoreError, match="will not replace"):
        ParquetSink(path).finalize_global(context(attempt_output(tmp_path / "s", 0, 0, [1])))
    assert snapshot(sibling) == {"keep.parquet": b"PAR1 not ours PAR1"}


def test_the_store_root_is_refused_at_plan_time_and_never_replaced_at_commit(tmp_path: Path) -> None:
    from airflow_provider_speculative.exceptions import PlanError
    from airflow_provider_speculative.sinks.base import PlanContext

    store = tmp_path / "store"
    other_dag = store / "other_dag" / "run" / "stage"
    other_dag.mkdir(parents=True)
    (other_dag / "plan.json").write_text("{}")
    sink = ParquetSink(str(store))
    for path in (store, store / "dag" / "out", tmp_path):  # the root, inside it, above it
        with pytest.raises(PlanError, match="overlaps the result store"):
            ParquetSink(str(path)).validate_plan(PlanContext("dag", "run", "write", "pipeline 'p', stage 'write'",
                                                             store))
    with pytest.raises(StoreError, match="no ParquetSink manifest"):
        sink.finalize_global(context(attempt_output(tmp_path / "s", 0, 0, [1])))
    assert (other_dag / "plan.json").read_text() == "{}"


def plan_context(store: Path, *sources: Path, dag: str = "dag", stage: str = "write"):
    from airflow_provider_speculative.sinks.base import PlanContext

    return PlanContext(dag, "run", stage, f"pipeline 'p', stage {stage!r}, sink ParquetSink", store, tuple(sources))


def test_a_path_equal_to_above_or_inside_a_source_is_refused_at_plan_time(tmp_path: Path) -> None:
    from airflow_provider_speculative.exceptions import PlanError

    source = tmp_path / "data" / "lineitem"
    source.mkdir(parents=True)
    for path in (source, source.parent, source / "out"):
        with pytest.raises(PlanError, match=r"stage 'write', sink ParquetSink: .* overlaps the source"):
            ParquetSink(str(path)).validate_plan(plan_context(tmp_path / "store", source))
    ParquetSink(str(tmp_path / "out")).validate_plan(plan_context(tmp_path / "store", source))


def test_a_path_committed_by_another_dag_or_stage_is_refused_at_plan_and_commit(tmp_path: Path, final: Path) -> None:
    from airflow_provider_speculative.exceptions import PlanError

    ParquetSink(str(final)).finalize_global(context(attempt_output(tmp_path / "a", 0, 0, [1])))
    before = snapshot(final)
    for dag, stage in (("other_dag", "write"), ("dag", "other_stage")):
        with pytest.raises(PlanError, match=r"committed by DAG 'dag', stage 'write'; two stages may not share"):
            ParquetSink(str(final)).validate_plan(plan_context(tmp_path / "store", dag=dag, stage=stage))
        ctx = FinalizationContext(parallelism=1, attempts={0: attempt_output(tmp_path / dag / stage, 0, 0, [9])},
                                  dag_id=dag, run_id="run", stage=stage)
        with pytest.raises(StoreError, match="committed by DAG 'dag'"):
            ParquetSink(str(final)).finalize_global(ctx)
        assert snapshot(final) == before
    # The owner itself (a rerun) and an empty directory are fine.
    ParquetSink(str(final)).validate_plan(plan_context(tmp_path / "store"))
    empty = tmp_path / "empty"
    empty.mkdir()
    ParquetSink(str(empty)).finalize_global(context(attempt_output(tmp_path / "e", 0, 0, [5])))
    assert committed_ids(empty) == [5]


@pytest.mark.parametrize("path", ["", "  ", None, "..", "out/{{ ds }}", "reports"])
def test_empty_relative_or_none_paths_fail_when_the_dag_is_parsed(path) -> None:
    from airflow_provider_speculative.exceptions import PipelineError
    from airflow_provider_speculative.pipeline import Pipeline

    p = Pipeline("p")
    with pytest.raises(PipelineError, match=r"pipeline 'p', stage 'write', sink ParquetSink: path .*(empty|relative)"):
        p.stage("write", application="/apps/w.py", parallelism=1, sink=ParquetSink(path))


def test_leftovers_of_other_runs_and_foreign_siblings_are_not_removed(tmp_path: Path, final: Path) -> None:
    final.parent.mkdir(parents=True)
    foreign = final.parent / f".{final.name}.staging-user"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    ParquetSink(str(final)).finalize_global(context(attempt_output(tmp_path, 0, 0, [1])))
    assert (foreign / "notes.txt").read_text() == "mine"


def test_crashed_finalize_leftovers_are_listed_and_cleaned_for_their_own_run_only(tmp_path: Path, final: Path) -> None:
    from airflow_provider_speculative.sinks.base import StagingScope
    from airflow_provider_speculative.sinks.parquet import _run_key

    final.parent.mkdir(parents=True)
    mine = final.parent / f".{final.name}.staging-{_run_key('dag', 'run', 'write', final)}-abcd1234"
    theirs = final.parent / f".{final.name}.staging-{_run_key('dag', 'run2', 'write', final)}-abcd1234"
    for d in (mine, theirs):
        d.mkdir()
        (d / "part-00000-000.parquet").write_bytes(b"x" * 10)
    sink = ParquetSink(str(final))
    scope = StagingScope("dag", "run", "write")
    assert [(o.name, o.bytes) for o in sink.staging(scope)] == [(str(mine), 10)]
    assert sink.cleanup_staging(scope) == [str(mine)]
    assert not mine.exists() and theirs.exists()


def test_a_local_sink_stages_the_attempts_files_from_a_store_without_paths(tmp_path: Path, final: Path) -> None:
    """The store on S3, the sink on a local path: finalize downloads each admitted file and checks its checksum."""
    import dataclasses

    from tests.unit.store.memory import MemoryBackend

    result = attempt_output(tmp_path / "store", 0, 0, [1, 2], [3])
    store = MemoryBackend("s3://bucket/store")
    data = "run/write/subtask=0/attempt=0/data"
    for entry in result.files:
        store.replace(f"{data}/{entry['path']}", (result.data_dir / entry["path"]).read_bytes())
    on_s3 = AttemptResult(subtask=0, attempt=0, data_dir=Path("/nonexistent/on-s3"), files=result.files,
                          data_name=data)
    ctx = dataclasses.replace(context(on_s3), store=store)
    ParquetSink(str(final)).finalize_global(ctx)
    assert committed_ids(final) == [1, 2, 3]
    # A file whose bytes changed in the store since its manifest was written is refused, nothing published.
    store.replace(f"{data}/{result.files[0]['path']}", b"not the manifest's bytes")
    before = snapshot(final)
    with pytest.raises(StoreError, match="checksum mismatch"):
        ParquetSink(str(final)).finalize_global(ctx)
    assert snapshot(final) == before and leftovers(final) == []
