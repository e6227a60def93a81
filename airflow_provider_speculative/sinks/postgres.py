"""Postgres sink: attempts write to attempt-scoped staging tables; finalize replaces one partition atomically.

Exactly-once, whatever races happen:

- every attempt writes into its own staging table ``<staging_schema>.st_<run key>_s<subtask>_a<attempt>``,
  so concurrent attempts never touch the same rows;
- ``finalize_global`` runs one transaction that deletes the final table's partition (e.g. the
  logical date), inserts the rows of the admitted attempts only, records the commit in a ledger
  table and drops the staging of every attempt of the stage run;
- a retried finalize after a crash finds either nothing committed (the transaction rolled back,
  staging is intact: it commits now) or its own ledger entry (already committed: nothing to redo).
  A failed finalize rolls back and leaves the partition committed before it untouched.

Attempts reach Postgres with a DSN the controller resolves from the Airflow connection and passes
in their environment; it is never written to the store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from airflow_provider_speculative.exceptions import PipelineError, PlanError
from airflow_provider_speculative.sinks.base import (
    FinalizationContext,
    InitializationContext,
    PlanContext,
    Sink,
    SinkWriter,
    StagingObject,
    StagingScope,
    SupportsConcurrentExecutionAttempts,
)
from airflow_provider_speculative.store.layout import StorePath

_T = TypeVar("_T")

# An unquoted Postgres identifier; quoted exotic names are not supported (they are a typo more often).
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")

# Spark SQL type name (simpleString) -> Postgres column type.
_PG_TYPES = {
    "string": "text", "bigint": "bigint", "int": "integer", "smallint": "smallint", "tinyint": "smallint",
    "double": "double precision", "float": "real", "boolean": "boolean", "date": "date",
    "timestamp": "timestamptz", "timestamp_ntz": "timestamp", "binary": "bytea",
}


def pg_type(spark_type: str) -> str:
    """Map a Spark SQL type to a Postgres type; decimals keep precision and scale."""
    if spark_type.startswith("decimal"):
        return spark_type.replace("decimal", "numeric")
    if spark_type not in _PG_TYPES:
        raise TypeError(f"PostgresSink cannot store Spark type {spark_type!r}")
    return _PG_TYPES[spark_type]


def dsn_env_var(conn_id: str) -> str:
    """Environment variable carrying the DSN of ``conn_id`` to attempts."""
    return "SPECULATIVE_DSN_" + "".join(ch if ch.isalnum() else "_" for ch in conn_id).upper()


def run_key(dag_id: str, run_id: str, stage: str, table: str) -> str:
    """Short stable key of a stage run writing ``table`` (Postgres identifiers are at most 63 bytes)."""
    return hashlib.sha1(f"{dag_id}\0{run_id}\0{stage}\0{table}".encode()).hexdigest()[:16]


class PostgresSink(Sink, SupportsConcurrentExecutionAttempts):
    """Replace partition ``partition_column = partition_value`` of ``table`` with the stage's output."""


    def __init__(self, table: str, *, postgres_conn_id: str = "postgres_default", partition_column: str = "ds",
                 partition_value: str = "{{ ds }}", staging_schema: str = "speculative_staging",
                 ledger_table: str = "speculative_staging.commits", asset_uri: str | None = None) -> None:
        # Names are checked by validate() (DAG parse) and validate_plan() (rendered), naming the stage.
        self.table = table
        self.postgres_conn_id = postgres_conn_id
        self.partition_column = partition_column
        self.partition_value = partition_value
        self.staging_schema = staging_schema
        self.ledger_table = ledger_table
        # Not in describe(): it names the asset at parse time and plays no part in writing or committing.
        self.database_uri = asset_uri

    def asset_uri(self) -> str | None:
        """``postgres://host:port/database/schema/table`` from the ``asset_uri`` argument; None without one.

        ``asset_uri`` is the database part (``postgres://host:5432/db``; the table is appended) or the full
        URI. It is an argument because the host and database are the connection's, which a DAG file must not
        look up while it is parsed.
        """
        if not self.database_uri:
            return None
        parsed = urlsplit(self.database_uri)
        path = [p for p in parsed.path.split("/") if p]
        if len(path) == 1 and isinstance(self.table, str) and "{{" not in self.table:
            schema, _, table = self.table.rpartition(".")
            path += [schema or "public", table]
        return urlunsplit(parsed._replace(path="/" + "/".join(path)))

    def lineage_uri(self) -> str | None:
        """The asset URI, else ``postgres://host:port/database/schema/table`` from the connection (on a worker)."""
        uri = self.asset_uri()
        if uri is not None or "{{" in str(self.table):
            return uri
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(self.postgres_conn_id)
        schema, _, table = str(self.table).rpartition(".")
        return f"postgres://{conn.host}:{conn.port or 5432}/{conn.schema}/{schema or 'public'}/{table}"

    def validate(self, where: str) -> None:
        """``table`` and ``ledger_table`` are ``[schema.]table``; schema and column are identifiers."""
        checks = [("table", self.table, 2), ("ledger_table", self.ledger_table, 2),
                  ("staging_schema", self.staging_schema, 1), ("partition_column", self.partition_column, 1)]
        for name, value, parts in checks:
            if name == "table" and isinstance(value, str) and "{{" in value:
                continue  # rendered at plan time, checked then
            problem = _name_problem(value, parts)
            if problem:
                form = "[schema.]table" if parts == 2 else "an identifier"
                raise PipelineError(f"{where}: {name} {value!r} is not {form}: {problem}")
        table = str(self.table).lower()
        if "{{" not in table:
            schema = table.split(".")[0] if "." in table else "public"
            if schema in _SYSTEM_SCHEMAS or schema.startswith("pg_"):
                raise PipelineError(f"{where}: table {self.table!r} is in the system schema {schema!r}")
            if table == str(self.ledger_table).lower() or schema == str(self.staging_schema).lower():
                raise PipelineError(f"{where}: table {self.table!r} is the provider's own ledger or staging "
                                    f"schema ({self.ledger_table!r}, {self.staging_schema!r}); choose another table")
        if self.database_uri is not None:
            self._check_asset_uri(where)

    def _check_asset_uri(self, where: str) -> None:
        parsed = urlsplit(str(self.database_uri))
        parts = [p for p in parsed.path.split("/") if p]
        problem = None
        if parsed.scheme != "postgres" or not parsed.hostname:
            problem = "expected postgres://host[:port]/database"
        elif parsed.password:
            problem = "it contains a password (asset URIs are shown in the UI)"
        elif len(parts) == 1 and "{{" in str(self.table):
            problem = "the table is templated; give the full URI postgres://host:port/database/schema/table"
        elif len(parts) not in (1, 3):
            problem = "expected postgres://host[:port]/database or postgres://host[:port]/database/schema/table"
        if problem:
            raise PipelineError(f"{where}: asset_uri {self.database_uri!r} is not usable: {problem}")

    def validate_plan(self, context: PlanContext) -> None:
        """Check the rendered names and that the connection exists and is a Postgres one, before any attempt."""
        try:
            self.validate(context.where)
            if "{{" in self.table:
                raise PipelineError(f"{context.where}: table {self.table!r} was not rendered")
        except PipelineError as exc:
            raise PlanError(str(exc)) from None
        conn = _connection(self.postgres_conn_id, context.where)
        if conn.conn_type not in ("postgres", "postgresql"):
            raise PlanError(f"{context.where}: connection {self.postgres_conn_id!r} (postgres_conn_id) has type "
                            f"{conn.conn_type!r}, not 'postgres'")
        try:
            libpq_dsn(conn)  # extras the attempts could not use fail now, not in every attempt
        except PlanError as exc:
            raise PlanError(f"{context.where}: {str(exc).removeprefix('PostgresSink: ')}") from None

    def describe(self) -> dict[str, Any]:
        """Constructor arguments."""
        return {"table": self.table, "postgres_conn_id": self.postgres_conn_id,
                "partition_column": self.partition_column, "partition_value": self.partition_value,
                "staging_schema": self.staging_schema, "ledger_table": self.ledger_table}

    def runtime_connections(self) -> list[str]:
        """Attempts need this connection (as a DSN in their environment)."""
        return [self.postgres_conn_id]

    def runtime_env(self, connections: dict[str, Any]) -> dict[str, str]:
        """Pass the connection to the attempts as a libpq DSN in their environment."""
        return {dsn_env_var(self.postgres_conn_id): libpq_dsn(connections[self.postgres_conn_id])}

    def staging_prefix(self, dag_id: str, run_id: str, stage: str) -> str:
        """Name prefix of every staging table of one stage run."""
        return f"st_{run_key(dag_id, run_id, stage, self.table)}_"

    def create_writer(self, context: InitializationContext) -> SinkWriter:
        """Attempts write into their own staging table."""
        dsn = os.environ.get(dsn_env_var(self.postgres_conn_id))
        if not dsn:
            raise RuntimeError(f"PostgresSink: no DSN for connection {self.postgres_conn_id!r} in the attempt's "
                               f"environment ({dsn_env_var(self.postgres_conn_id)}); the controller sets it")
        table = f"{self.staging_prefix(context.dag_id, context.run_id, context.stage)}" \
                f"s{context.task_number}_a{context.attempt_number}"
        return _PostgresWriter(dsn, self.staging_schema, table, _spool_dir(context, table))

    # -- master side ------------------------------------------------------------------------

    def _connect(self, env: dict[str, str] | None = None) -> Any:
        return with_retries(lambda: connect(self._dsn(env)), f"connecting to {self.postgres_conn_id!r}")

    def _dsn(self, env: dict[str, str] | None = None) -> str:
        """A trigger passes the DSN it resolved asynchronously in ``env``; elsewhere the sync lookup is allowed."""
        dsn = (env or {}).get(dsn_env_var(self.postgres_conn_id))
        if dsn:
            return dsn
        from airflow.providers.postgres.hooks.postgres import PostgresHook

        return libpq_dsn(PostgresHook(postgres_conn_id=self.postgres_conn_id).connection)

    def _staging_names(self, cur: Any, scope: StagingScope) -> list[str]:
        prefix = self.staging_prefix(scope.dag_id, scope.run_id, scope.stage)
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s AND starts_with(tablename, %s) "
                    "ORDER BY tablename", [self.staging_schema, prefix])
        names = [r[0] for r in cur.fetchall()]
        if scope.attempts is not None:
            wanted = {f"{prefix}s{s}_a{a}" for s, a in scope.attempts}
            names = [n for n in names if n in wanted]
        return names

    def staging(self, scope: StagingScope) -> list[StagingObject]:
        """This stage run's staging tables (name ``schema.table``, size on disk)."""
        conn = self._connect(scope.env)
        try:
            with conn, conn.cursor() as cur:
                out = []
                for name in self._staging_names(cur, scope):
                    cur.execute("SELECT pg_total_relation_size(format('%%I.%%I', %s::text, %s::text)::regclass)",
                                [self.staging_schema, name])
                    out.append(StagingObject(f"{self.staging_schema}.{name}", int(cur.fetchone()[0] or 0)))
                return out
        finally:
            conn.close()

    def cleanup_staging(self, scope: StagingScope) -> list[str]:
        """Drop this stage run's staging tables (or only those of ``scope.attempts``) in one transaction."""
        from psycopg2 import sql

        conn = self._connect(scope.env)
        try:
            with conn, conn.cursor() as cur:
                names = self._staging_names(cur, scope)
                for name in names:
                    cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.staging_schema, name)))
        finally:
            conn.close()
        return [f"{self.staging_schema}.{name}" for name in names]

    def finalize_global(self, context: FinalizationContext) -> dict[str, Any]:
        """One transaction: replace the partition with the admitted attempts' rows, record it, drop staging."""

        admitted = {str(s): r.attempt for s, r in sorted(context.attempts.items())}
        infos = {s: r.sink_info for s, r in context.attempts.items()}
        missing = [s for s, info in infos.items() if not info.get("staging_table")]
        if missing:
            raise RuntimeError(f"PostgresSink: admitted attempts of subtasks {missing} recorded no staging table")
        columns = next(iter(infos.values()))["columns"]
        final = _qualified(self.table)
        ledger = _qualified(self.ledger_table)
        prefix = self.staging_prefix(context.dag_id, context.run_id, context.stage)
        # A lost connection retries the whole transaction: it rolled back, or it committed and the
        # ledger says so, so a retry never writes the partition twice.
        return with_retries(lambda: self._finalize_once(context, admitted, infos, columns, final, ledger, prefix),
                            f"committing {self.table} partition {self.partition_value}")

    def _finalize_once(self, context: FinalizationContext, admitted: dict[str, int], infos: dict[int, dict[str, Any]],
                       columns: list[list[str]], final: Any, ledger: Any, prefix: str) -> dict[str, Any]:
        from psycopg2 import sql

        conn = connect(self._dsn())
        try:
            with conn, conn.cursor() as cur:
                # Serialise finalizes of the same table: they replace partitions of it.
                cur.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(self.table)])
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.staging_schema)))
                cur.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (target_table text, partition_value text, dag_id text, "
                    "run_id text, stage text, attempts jsonb, records bigint, committed_at timestamptz DEFAULT now(), "
                    "PRIMARY KEY (target_table, partition_value))").format(ledger))
                cur.execute(sql.SQL("SELECT run_id, stage, attempts FROM {} WHERE target_table = %s "
                                    "AND partition_value = %s").format(ledger), [self.table, self.partition_value])
                row = cur.fetchone()
                already = row is not None and (row[0], row[1], row[2]) == (context.run_id, context.stage, admitted)
                records = None
                if not already:
                    records = self._replace_partition(cur, final, columns, infos, context)
                    cur.execute(sql.SQL(
                        "INSERT INTO {} (target_table, partition_value, dag_id, run_id, stage, attempts, records) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (target_table, partition_value) DO UPDATE "
                        "SET dag_id = EXCLUDED.dag_id, run_id = EXCLUDED.run_id, stage = EXCLUDED.stage, "
                        "attempts = EXCLUDED.attempts, records = EXCLUDED.records, committed_at = now()"
                    ).format(ledger), [self.table, self.partition_value, context.dag_id, context.run_id,
                                       context.stage, json.dumps(admitted), records])
                dropped = self._drop_staging(cur, prefix)
        finally:
            conn.close()
        return {"sink": "postgres", "table": self.table, "partition": {self.partition_column: self.partition_value},
                "records": records, "already_committed": already, "staging_dropped": dropped}

    def _replace_partition(self, cur: Any, final: Any, columns: list[list[str]], infos: dict[int, dict[str, Any]],
                           context: FinalizationContext) -> int:
        from psycopg2 import sql

        defs = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind)) for name, kind in columns]
        defs.append(sql.SQL("{} text NOT NULL").format(sql.Identifier(self.partition_column)))
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(final, sql.SQL(", ").join(defs)))
        cur.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(final, sql.Identifier(self.partition_column)),
                    [self.partition_value])
        names = sql.SQL(", ").join(sql.Identifier(name) for name, _ in columns)
        total = 0
        for subtask in range(context.parallelism):
            staging = sql.Identifier(self.staging_schema, infos[subtask]["staging_table"])
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(staging))
            (count,) = cur.fetchone()
            if count != infos[subtask]["records"]:
                raise RuntimeError(f"PostgresSink: staging {infos[subtask]['staging_table']} of subtask {subtask} "
                                   f"holds {count} rows, its attempt wrote {infos[subtask]['records']}")
            cur.execute(sql.SQL("INSERT INTO {} ({}, {}) SELECT {}, %s FROM {}").format(
                final, names, sql.Identifier(self.partition_column), names, staging), [self.partition_value])
            total += count
        return total

    def _drop_staging(self, cur: Any, prefix: str) -> int:
        from psycopg2 import sql

        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s AND starts_with(tablename, %s)",
                    [self.staging_schema, prefix])
        tables = [r[0] for r in cur.fetchall()]
        for name in tables:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.staging_schema, name)))
        return len(tables)


def _spool_dir(context: InitializationContext, table: str) -> Path:
    """Where Spark writes the CSV files COPY loads: the attempt's data directory on a POSIX store.

    A store without paths (S3: ``data_dir`` is a ``StorePath``) has no directory the driver can list and read, so
    the spool is a local directory named by the attempt's staging table (unique per stage run, subtask and attempt);
    Spark's executors must then write the driver's disk (a local master, or a Connect server on the same host).
    """
    if isinstance(context.data_dir, StorePath):
        return Path(tempfile.gettempdir()) / "speculative-postgres-spool" / table
    return Path(context.data_dir) / "_postgres_copy"


class _PostgresWriter(SinkWriter):
    def __init__(self, dsn: str, schema: str, table: str, spool: Path) -> None:
        self.dsn = dsn
        self.schema = schema
        self.table = table
        self.spool = spool

    def write(self, df: Any) -> dict[str, Any]:
        """Spark writes the rows as CSV files (in the JVM, in parallel); COPY loads them into the staging table.

        Only the load is retried: it is one transaction (drop, create, copy), so a retry cannot double rows.
        """
        columns = [[f.name, pg_type(f.dataType.simpleString())] for f in df.schema.fields]
        shutil.rmtree(self.spool, ignore_errors=True)  # a retried attempt's leftovers
        try:
            copy_frame(df).write.options(**COPY_CSV).csv(str(self.spool))
            parts = sorted(p for p in self.spool.iterdir() if p.name.startswith("part-"))
            records = with_retries(lambda: self._load(columns, parts), f"loading staging table {self.table}")
        finally:
            shutil.rmtree(self.spool, ignore_errors=True)
        return {"staging_table": self.table, "staging_schema": self.schema, "columns": columns, "records": records}

    def _load(self, columns: list[list[str]], parts: list[Path]) -> int:
        from psycopg2 import sql

        staging = sql.Identifier(self.schema, self.table)
        conn = connect(self.dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(self.schema)])
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            with conn, conn.cursor() as cur:
                defs = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns)
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staging))
                cur.execute(sql.SQL("CREATE TABLE {} ({})").format(staging, defs))
                copy = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
                    staging, sql.SQL(", ").join(sql.Identifier(n) for n, _ in columns)).as_string(cur)
                records = 0
                for part in parts:
                    with open(part, "rb") as data:
                        cur.copy_expert(copy, data, size=COPY_CHUNK)
                    records += cur.rowcount  # the server's own count ("COPY n")
                return records
        finally:
            conn.close()


# Bytes handed to COPY per read: large enough that the per-call cost vanishes, small enough to stay flat.
COPY_CHUNK = 1 << 20
# Spark's CSV as COPY (FORMAT csv) reads it back: NULL unquoted and empty, an empty string "", quotes
# doubled, whitespace kept, timestamps to the microsecond with their offset (timestamptz).
COPY_CSV = {
    "header": "false", "sep": ",", "quote": '"', "escape": '"', "escapeQuotes": "true", "nullValue": "",
    "emptyValue": '""', "ignoreLeadingWhiteSpace": "false", "ignoreTrailingWhiteSpace": "false",
    "dateFormat": "yyyy-MM-dd", "timestampFormat": "yyyy-MM-dd HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd HH:mm:ss.SSSSSS", "lineSep": "\n", "encoding": "UTF-8",
    "compression": "none",
}


def copy_frame(df: Any) -> Any:
    """``df`` with what CSV cannot hold as text turned into Postgres's text form: binary as ``\\x`` + hex."""
    from pyspark.sql import functions as F

    binary = {f.name for f in df.schema.fields if f.dataType.simpleString() == "binary"}
    if not binary:
        return df
    return df.select(*[F.concat(F.lit("\\x"), F.lower(F.hex(F.col(f"`{name}`")))).alias(name) if name in binary
                       else F.col(f"`{name}`") for name in df.columns])


# Transient failures worth another try: the server restarting, a dropped connection, a failover.
RETRIES = 3
RETRY_WAIT_SECONDS = (1.0, 8.0)  # exponential backoff between tries: first, at most


def with_retries(action: Callable[[], _T], what: str) -> _T:
    """Run ``action``, retrying a lost or refused connection (``RETRIES`` tries, backing off 1-8 s)."""
    import psycopg2
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    def report(state: Any) -> None:
        # In the attempt's log (or the task log at finalize): what failed and that it is tried again.
        print(f"[speculative] PostgresSink: {what} failed ({state.outcome.exception()}); "
              f"try {state.attempt_number + 1} of {RETRIES}", file=sys.stderr)

    for attempt in Retrying(retry=retry_if_exception_type((psycopg2.OperationalError, psycopg2.InterfaceError)),
                            stop=stop_after_attempt(RETRIES),
                            wait=wait_exponential(multiplier=RETRY_WAIT_SECONDS[0], min=RETRY_WAIT_SECONDS[0],
                                                  max=RETRY_WAIT_SECONDS[1]),
                            before_sleep=report, reraise=True):
        with attempt:
            return action()
    raise AssertionError("unreachable: tenacity reraises the last failure")


def connect(dsn: str) -> Any:
    """A psycopg2 connection (both sides: the postgres provider's hook may hand out psycopg 3 connections)."""
    import psycopg2

    return psycopg2.connect(dsn)


def libpq_dsn(conn: Any) -> str:
    """A libpq keyword DSN with the arguments PostgresHook connects with, for the attempts' environment.

    Those are host, port, schema as dbname, login, password, and every extra the hook does not use itself
    (``sslmode``, ``sslrootcert``, ``options``, ...). Runs on the Airflow side; the attempts only read the DSN.
    Cloud IAM authentication is refused: its token expires while an attempt runs, and the attempts could not
    ask for another.
    """
    import psycopg2.extensions

    extras = dict(getattr(conn, "extra_dejson", None) or {})
    if extras.get("iam"):  # the hook's own test: any truthy value asks it for an IAM token
        raise PlanError(f"PostgresSink: connection {conn.conn_id!r} uses IAM authentication (extra 'iam'), which "
                        "the sink does not support; use a password or a client certificate")
    args = _hook_connect_args(conn)
    unknown = sorted(key for key in args if not _libpq_keyword(key))
    if unknown:
        raise PlanError(f"PostgresSink: connection {conn.conn_id!r} has extras {unknown} that are not libpq "
                        "connection parameters (PostgresHook passes every extra it does not use itself to libpq)")
    return str(psycopg2.extensions.make_dsn(**{key: value for key, value in args.items() if value not in (None, "")}))


def _hook_connect_args(conn: Any) -> dict[str, Any]:
    """The keyword arguments PostgresHook.get_conn would hand the driver for ``conn``, without connecting."""
    hook = _args_hook_class()(postgres_conn_id=conn.conn_id, connection=conn)
    hook.get_conn()
    # Cursor classes are Python objects of the hook's driver, not connection parameters.
    return {key: value for key, value in hook.connect_args.items() if key not in ("cursor_factory", "row_factory")}


@functools.cache
def _args_hook_class() -> type[Any]:
    # Imported here: attempts import this module without Airflow's postgres provider.
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    if not callable(getattr(PostgresHook, "_create_connection", None)):
        # Without it get_conn would connect to the database here (setup.cfg bounds the provider's version).
        raise RuntimeError("PostgresSink needs apache-airflow-providers-postgres>=7.1 "
                           "(PostgresHook._create_connection)")

    class _ConnectArgsHook(PostgresHook):
        """PostgresHook that records the driver's arguments instead of connecting."""

        connect_args: dict[str, Any]

        def _create_connection(self, conn_args: dict[str, Any]) -> Any:
            self.connect_args = dict(conn_args)
            return None

    return _ConnectArgsHook


@functools.cache
def _libpq_keyword(key: str) -> bool:
    """True if libpq knows ``key`` as a connection parameter (asked with a dummy value: no secret in errors)."""
    import psycopg2
    import psycopg2.extensions

    try:
        psycopg2.extensions.parse_dsn(f"{key}=x")
    except psycopg2.ProgrammingError:
        return False
    return True


def _name_problem(value: Any, parts: int) -> str | None:
    """Why ``value`` is not a dotted name of at most ``parts`` unquoted identifiers; None if it is."""
    if not isinstance(value, str) or not value:
        return "it is empty" if value in ("", None) else f"expected a string, got {type(value).__name__}"
    pieces = value.split(".")
    if len(pieces) > parts:
        return f"at most {parts - 1} dot{'s' if parts > 2 else ''} allowed (database-qualified names are not)" \
            if parts > 1 else "no dots allowed"
    for piece in pieces:
        if not _IDENTIFIER.match(piece):
            return f"{piece!r} is not an unquoted identifier (letters, digits, _ and $, at most 63, not a digit first)"
        if piece != piece.lower():
            # The sink quotes names; unquoted SQL folds to lower case, so "Sales" and sales are two tables.
            return (f"{piece!r} has upper-case letters: the sink writes it quoted, so SELECT ... FROM {piece} "
                    f"(folded to {piece.lower()!r}) would not find it; write {piece.lower()!r}")
    return None


def _qualified(name: str) -> Any:
    from psycopg2 import sql

    return sql.Identifier(*name.split(".", 1))


def _lock_id(name: str) -> int:
    return int.from_bytes(hashlib.sha1(name.encode()).digest()[:8], "big", signed=True)


_SYSTEM_SCHEMAS = {"pg_catalog", "information_schema", "pg_toast"}


def _connection(conn_id: str, where: str) -> Any:
    """An Airflow connection (on the worker, at plan), or a PlanError naming it if there is none."""
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or a secrets backend's own error
        raise PlanError(f"{where}: connection {conn_id!r} (postgres_conn_id) cannot be found: "
                        f"{type(exc).__name__}: {str(exc)[:200]}") from None
