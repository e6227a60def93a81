"""A TPC-H query as ONE plain PySpark application (the reference of bench/warm.py for Q9, Q10 and Q18).

Reads the eight TPC-H tables as views and runs the official query text (tests/integration/tpch_sql.py,
passed as a file) through Spark SQL, the way a user who does not split a pipeline would; writes the
result as one Parquet directory.

    spark-submit --master 'local[2]' bench/plain_sql.py QUERY.sql TPCH_DIR OUTPUT_DIR
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

TABLES = ("region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem")

query_file, tpch_dir, output_dir = sys.argv[1], sys.argv[2], sys.argv[3]
spark = SparkSession.builder.appName("plain-sql").getOrCreate()
spark.sparkContext.setLogLevel("WARN")
for table in TABLES:
    if os.path.isdir(os.path.join(tpch_dir, table)):
        spark.read.parquet(os.path.join(tpch_dir, table)).createOrReplaceTempView(table)
with open(query_file) as f:
    query = f.read()
spark.sql(query).coalesce(1).write.mode("overwrite").parquet(output_dir)
spark.stop()
