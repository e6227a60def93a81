"""The provider's Spark commit protocol under Spark's own task retries, on a real Spark (local[2, 3]).

A task whose first attempt fails after it has written rows is retried by Spark; the retry writes a file of its
own name, and the committed-file list the job commit writes names exactly one file per task, whose rows equal
the input. That list is what the manifest is built from (tests/unit/store/test_manifest_committed.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from airflow_provider_speculative.backends.commitjar import find_commit_jar
from airflow_provider_speculative.devtools.localcluster import spark_submit
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.manifest import COMMITTED_LIST, DIRECT_COMMIT_CLASS, build_manifest_in

APP = '''
import sys
from pyspark import TaskContext
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.getOrCreate()
out, protocol = sys.argv[1], sys.argv[2]
spark.conf.set("spark.sql.sources.commitProtocolClass", protocol)

def fail_once(batches):
    context = TaskContext.get()
    for i, batch in enumerate(batches):
        yield batch
        # The first attempt of task 1 fails after some of its rows reached the writer.
        if context.partitionId() == 1 and context.attemptNumber() == 0 and i == 1:
            raise RuntimeError("injected: the first attempt of task 1 fails mid-write")

df = spark.range(0, 40000, 1, 4).withColumn("v", F.col("id") * 3)
df.mapInArrow(fail_once, df.schema).write.option("parquet.block.size", 65536).parquet(out)
print("written", flush=True)
'''


def test_a_retried_task_commits_one_file_of_its_own_and_the_list_names_it(tmp_path: Path) -> None:
    jar = find_commit_jar()
    assert jar is not None, "the commit protocol jar could not be built (is a JDK installed?)"
    app = tmp_path / "app.py"
    app.write_text(APP)
    out = tmp_path / "out"
    done = subprocess.run([spark_submit(), "--master", "local[2,3]", "--jars", str(jar),
                           "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=2000",
                           "--conf", f"spark.pyspark.python={sys.executable}", str(app), str(out),
                           DIRECT_COMMIT_CLASS], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0 and "written" in done.stdout, done.stderr[-3000:]
    assert "injected: the first attempt of task 1 fails" in done.stderr  # the retry really happened

    listed = (out / COMMITTED_LIST).read_text().split()
    assert len(listed) == 4 and len({name.split("-")[1] for name in listed}) == 4, listed  # one per task
    assert not (out / "_temporary").exists()
    # The failed attempt's own file was removed by its abort (best effort: no list would name it anyway).
    assert {p.name for p in out.iterdir() if not p.name.startswith(".")} == {*listed, COMMITTED_LIST}
    manifest = build_manifest_in(PosixBackend(out), "")
    assert sorted(f["path"] for f in manifest["files"]) == sorted(listed)
    table = pq.ParquetDataset([str(out / name) for name in listed]).read()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(40000))  # every row once: nothing of the failed attempt is named
    assert sum(table.column("v").to_pylist()) == 3 * sum(range(40000))
