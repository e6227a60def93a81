#!/bin/sh
# Spark worker resource discovery: this worker is node spark-worker-b.
echo '{"name": "node_spark_worker_b", "addresses": ["0", "1"]}'
