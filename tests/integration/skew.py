"""A skewed-key pipeline for the skew test and bench/skew.py: data, graph and what consumers read."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_speculative.core.failover import files_in_range
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.plan import file_subpartitions
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import committed_files, read_committed

APPS = Path(__file__).resolve().parent / "apps"
SHUFFLE = {"spark.sql.shuffle.partitions": "2"}
MAX_PARALLELISM = 16
CONSUMERS = 4


def write_skewed_parquet(directory: Path, files: int = 4, rows: int = 20_000, hot_share: float = 0.6,
                         keys: int = 200, seed: int = 42) -> Path:
    """``files`` Parquet files of (k, v): key 0 holds ``hot_share`` of the rows; v is random (incompressible)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i in range(files):
        k = [0 if rng.random() < hot_share else rng.randint(1, keys) for _ in range(rows)]
        v = [rng.randrange(1_000_000_000) for _ in range(rows)]
        pq.write_table(pa.table({"k": pa.array(k, pa.int64()), "v": pa.array(v, pa.int64())}),
                       directory / f"part-{i}.parquet")
    return directory


def skew_graph(source: Path, producers: int = 4, rounds: int = 0) -> PipelineGraph:
    """scan (passthrough) -> agg_bytes / agg_count (partial sums, splittable) ; agg_bytes -> merge.

    ``rounds``: SHA-256 rounds per row in the partial sums (CPU work per row read, for the bench).
    """
    args = (str(rounds),) if rounds else ()
    aggregate = {"rows": ExchangeSpec("scan", "all_to_all", ("k",))}
    graph = PipelineGraph("skew", {
        "scan": StageSpec("scan", str(APPS / "passthrough.py"), producers, {"rows": SourceSpec(str(source))},
                          max_parallelism=MAX_PARALLELISM, spark_conf=SHUFFLE),
        "agg_bytes": StageSpec("agg_bytes", str(APPS / "partial_sum.py"), CONSUMERS, dict(aggregate),
                               max_parallelism=MAX_PARALLELISM, spark_conf=SHUFFLE, splittable_skew=True,
                               application_args=args),
        "agg_count": StageSpec("agg_count", str(APPS / "partial_sum.py"), CONSUMERS, dict(aggregate),
                               max_parallelism=MAX_PARALLELISM, spark_conf=SHUFFLE, splittable_skew=True,
                               application_args=args),
        "merge": StageSpec("merge", str(APPS / "merge_sum.py"), 1,
                           {"partials": ExchangeSpec("agg_bytes", "all_to_all", ("k",))}, spark_conf=SHUFFLE),
    })
    graph.validate()
    return graph


def bytes_read(root: Path, plan: dict[str, Any], input_name: str = "rows") -> list[int]:
    """Bytes of the producer files each consumer subtask resolves (as runtime exchange_files does)."""
    upstream = StageLayout(root, plan["dag_id"], plan["run_id"], plan["inputs"][input_name]["upstream"])
    committed = read_committed(upstream)
    out = []
    for spec in plan["subtasks"]:
        mine = spec["inputs"][input_name]
        total = 0
        for producer in range(*mine["producers"]):
            attempt = committed["subtasks"][str(producer)]["attempt"]
            files = files_in_range(committed_files(upstream, producer, attempt), mine["subpartitions"])
            total += sum(_bytes_in(f, mine["subpartitions"]) for f in files)
        out.append(total)
    return out


def _bytes_in(entry: dict[str, Any], span: list[int] | None) -> int:
    """A file's bytes in subpartition range ``span``: a partitioned file's size, a packed file's index within it."""
    if span is None:
        return int(entry["size"])
    return sum(size for sp, size in file_subpartitions(entry).items() if span[0] <= sp < span[1])


def max_over_median(values: list[int | float]) -> float:
    """Imbalance: the largest consumer's load over the median one's."""
    return max(values) / statistics.median(values)


def expected_sums(source: Path) -> dict[int, tuple[int, int]]:
    """k -> (sum v, count) computed by pyarrow over the source files."""
    table = pq.read_table(source).group_by("k").aggregate([("v", "sum"), ("v", "count")])
    return {k: (s, c) for k, s, c in zip(table["k"].to_pylist(), table["v_sum"].to_pylist(),
                                         table["v_count"].to_pylist(), strict=True)}


def read_sums(paths: list[Path]) -> dict[int, tuple[int, int]]:
    """k -> (sum_v, cnt) from committed output directories; a key twice is an error (no merge happened)."""
    out: dict[int, tuple[int, int]] = {}
    for path in paths:
        files = sorted(p for p in path.rglob("*.parquet"))
        if not files:
            continue
        table = pa.concat_tables([pq.read_table(f, columns=["k", "sum_v", "cnt"]) for f in files])
        for k, s, c in zip(table["k"].to_pylist(), table["sum_v"].to_pylist(), table["cnt"].to_pylist(),
                           strict=True):
            assert k not in out, f"key {k} appears twice"
            out[k] = (s, c)
    return out


def rows_read(paths: list[Path]) -> int:
    """Rows a partial-sum consumer read: the sum of its output counts."""
    total = 0
    for path in paths:
        for f in path.rglob("*.parquet"):
            total += sum(pq.read_table(f, columns=["cnt"])["cnt"].to_pylist())
    return total


def merged_sums(paths: list[Path]) -> dict[int, tuple[Any, ...]]:
    """k -> (sum_v, cnt[, work]) with a split key's partial rows added up (``work``: the largest digest).

    Reads partial-sum outputs (several rows per key allowed) or one plain query's output alike, so the
    pipeline's result and the plain run's compare exactly.
    """
    out: dict[int, list[Any]] = {}
    for path in paths:
        for f in sorted(path.rglob("*.parquet")):
            for row in pq.read_table(f).to_pylist():
                have = out.get(row["k"])
                if have is None:
                    out[row["k"]] = [row["sum_v"], row["cnt"], row.get("work")]
                else:
                    have[0] += row["sum_v"]
                    have[1] += row["cnt"]
                    if row.get("work") is not None:
                        have[2] = max(have[2] or "", row["work"])
    return {k: tuple(v if v[2] is not None else v[:2]) for k, v in out.items()}
