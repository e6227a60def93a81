#!/usr/bin/env bash
# `make demo`: run the example TPC-H Q1 pipeline through `airflow dags test` and print its status.
# `make run`: the same for the user's DAG_ID from their DAGs folder (no example output to print).
#
# DEMO_TARGETS=connect (default): attempts are clients of a local pool of two warm Spark Connect
# servers (targets local-a, local-b), started here and stopped on exit, also on failure.
# DEMO_TARGETS=spark-submit: every attempt is its own spark-submit (the built-in local targets).
# The caller (the Makefile) exports AIRFLOW_HOME, the store and the example's data/output paths.
set -euo pipefail

VENV=${VENV:-.venv}
DEMO=${DEMO:?DEMO (the demo directory) must be set}
DEMO_DATE=${DEMO_DATE:-2026-01-01}
DEMO_TARGETS=${DEMO_TARGETS:-connect}
DAG_ID=${DAG_ID:-tpch_q1}
CONNECT_PORT=${DEMO_CONNECT_PORT:-15130}
CONNECT_UI_PORT=${DEMO_CONNECT_UI_PORT:-4130}
AIRFLOW="$VENV/bin/airflow"
mkdir -p "$DEMO"

# The demo's fork server (warm attempt starts, docs/connect.md "Warm attempt start") is its own: it runs in a
# private directory and is stopped on exit instead of idling on for ten minutes.
export XDG_RUNTIME_DIR
XDG_RUNTIME_DIR=$(mktemp -d /tmp/spec-demo.XXXXXX)
cleanup() {
    if [ "$DEMO_TARGETS" = connect ]; then
        # Stop exactly the servers started here (pid files), whatever happened.
        "$AIRFLOW" speculative local-cluster stop --directory "$DEMO/local-cluster" || true
    fi
    "$VENV/bin/python" -c 'from airflow_provider_speculative.backends import forkserver; forkserver.stop_servers()' \
        || true
    rm -rf "$XDG_RUNTIME_DIR"
}
trap cleanup EXIT

if [ "$DEMO_TARGETS" = connect ]; then
    "$AIRFLOW" speculative local-cluster start --servers 2 --base-port "$CONNECT_PORT" \
        --ui-base-port "$CONNECT_UI_PORT" --directory "$DEMO/local-cluster" \
        ${WARM_UP_ROUNDS:+--warm-up-rounds "$WARM_UP_ROUNDS"} > "$DEMO/local-cluster.out"
    grep -v '^export ' "$DEMO/local-cluster.out" | grep -v '^#' | grep -v '^$' || true
    # The connections (AIRFLOW_CONN_SPARK_CONNECT_LOCAL_A/B) and [speculative] targets it printed.
    eval "$(grep '^export ' "$DEMO/local-cluster.out")"
elif [ "$DEMO_TARGETS" != spark-submit ]; then
    echo "error: DEMO_TARGETS must be connect or spark-submit, not '$DEMO_TARGETS'" >&2
    exit 2
fi

"$AIRFLOW" db migrate > /dev/null
"$AIRFLOW" dags reserialize > /dev/null 2>&1  # so that `airflow dags list` shows the example afterwards
if ! "$AIRFLOW" dags test "$DAG_ID" "$DEMO_DATE" > "$DEMO/dags-test.log" 2>&1; then
    tail -50 "$DEMO/dags-test.log"
    # A DAG file that fails to import only shows up as "not found" above: say why.
    "$AIRFLOW" dags list-import-errors 2>/dev/null | grep -v 'graphviz' || true
    echo "error: airflow dags test $DAG_ID failed (log: $DEMO/dags-test.log)" >&2
    exit 1
fi
"$AIRFLOW" speculative status --dag-id "$DAG_ID"
[ "$DAG_ID" = tpch_q1 ] || exit 0
echo; echo "Committed output: $SPECULATIVE_EXAMPLE_OUTPUT/tpch_q1/$DEMO_DATE"; ls "$SPECULATIVE_EXAMPLE_OUTPUT/tpch_q1/$DEMO_DATE"
"$VENV/bin/python" -c "import pyarrow.parquet as pq, sys; print(pq.read_table(sys.argv[1]).to_pandas().sort_values(['l_returnflag','l_linestatus']).to_string(index=False))" \
    "$SPECULATIVE_EXAMPLE_OUTPUT/tpch_q1/$DEMO_DATE"
