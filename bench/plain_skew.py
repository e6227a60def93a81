"""The skewed-key query of bench/skew.py as ONE plain PySpark application, with Spark's adaptive execution on.

Same input files, same per-row work (``ROUNDS`` SHA-256 rounds of ``v``), same aggregation as the
pipeline's partial-sum stage (tests/integration/apps/partial_sum.py): per key ``k`` the sum of ``v``, the
row count and the largest digest. One output row per key (Spark merges what the pipeline leaves as
partial rows of a split key), so the result compares exactly with the pipeline's partials added up.

Spark plans ``groupBy`` as a partial aggregate before the shuffle and a final one after it: the hashing
runs in the scan tasks, one per input split, so the hot key costs the reduce side a single row per map
task. AQE's skew handling (``spark.sql.adaptive.skewJoin.enabled``) only splits skewed sort-merge JOIN
partitions; for an aggregation the map-side combine is what keeps the skew harmless.

    spark-submit --master 'local[2]' bench/plain_skew.py SOURCE_DIR OUTPUT_DIR ROUNDS
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

source_dir, output_dir, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = SparkSession.builder.appName("plain-skew").getOrCreate()
spark.sparkContext.setLogLevel("WARN")
digest = F.col("v").cast("string")
for _ in range(rounds):
    digest = F.sha2(digest, 256)
aggregates = [F.sum("v").alias("sum_v"), F.count(F.lit(1)).alias("cnt")]
if rounds:
    aggregates.append(F.max(digest).alias("work"))
spark.read.parquet(source_dir).groupBy("k").agg(*aggregates).write.mode("overwrite").parquet(output_dir)
spark.stop()
