"""``airflow speculative local-cluster|fork-server``: a local pool of Spark Connect servers; fork servers."""

from __future__ import annotations

import shlex
import sys
from typing import Any

from airflow_provider_speculative.cli.output import emit
from airflow_provider_speculative.core.paths import redact_url


def server_conf(pairs: list[str], jars: str | None, s3: bool) -> dict[str, str]:
    """Spark settings for the servers from ``--conf``, ``--jars`` and ``--s3``; LocalClusterError if bad."""
    from airflow_provider_speculative.devtools.localcluster import LocalClusterError, jar_paths, s3a_jars
    from airflow_provider_speculative.hooks.objectstore import settings_from_environment, spark_s3_conf

    conf: dict[str, str] = {}
    if s3:
        conf.update(spark_s3_conf(settings_from_environment()))
        jars = jars or s3a_jars()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise LocalClusterError(f"--conf {pair.split('=', 1)[0]!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    if jars:
        conf["spark.jars"] = ",".join(jar_paths(jars))
    return conf


def warm_up_store(explicit: str | None, s3: bool) -> str | None:
    """The S3 store root the servers' warm-up also writes to: ``--warm-up-store``, else an s3:// store_path.

    Only a pool started with ``--s3`` serves S3; LocalClusterError if ``explicit`` is not an s3:// URL.
    """
    from airflow_provider_speculative.devtools.localcluster import LocalClusterError
    from airflow_provider_speculative.store.roots import is_s3_root

    if explicit is not None:
        if not s3:
            raise LocalClusterError("--warm-up-store needs --s3: only then do the servers serve s3:// paths")
        if not is_s3_root(explicit):
            raise LocalClusterError(f"--warm-up-store {explicit!r}: expected an s3://bucket/prefix URL")
        return explicit
    if not s3:
        return None
    from airflow_provider_speculative.exceptions import ConfigError
    from airflow_provider_speculative.settings import airflow_config, store_location

    try:
        location = store_location(airflow_config())
    except ConfigError as exc:
        raise LocalClusterError(f"--s3: cannot tell whether [speculative] store_path is on S3: {exc}") from exc
    return location if is_s3_root(location) else None


def local_cluster(args: Any) -> None:
    """CLI entry: start, stop or list the local Connect servers (see devtools/localcluster.py)."""
    from airflow_provider_speculative.devtools.localcluster import (
        LocalCluster,
        LocalClusterError,
        connection_definitions,
        targets_json,
    )

    cluster = LocalCluster(args.directory)
    try:
        if args.action == "start":
            rounds = getattr(args, "warm_up_rounds", None)
            if rounds is not None and rounds < 0:
                raise LocalClusterError(f"--warm-up-rounds {rounds}: expected 0 or more (0: no warm-up query)")
            s3 = bool(getattr(args, "s3", False))
            conf = server_conf(getattr(args, "conf", None) or [], getattr(args, "jars", None), s3)
            store = warm_up_store(getattr(args, "warm_up_store", None), s3)
            started, already = cluster.start(servers=args.servers, base_port=args.base_port,
                                             ui_base_port=args.ui_base_port, cores=args.cores, conf=conf or None,
                                             warm_up_store=store,
                                             warm_up_rounds=rounds)
            for info in already:
                print(f"{info.name}: already running (pid {info.pid}, port {info.port})")
            for info in started:
                warm = info.extra.get("warm_up")
                print(f"{info.name}: started (pid {info.pid}, port {info.port}, UI {info.ui_port}, "
                      f"app {info.app_id}, log {info.log}, warm-up "
                      f"{f'{warm}s' if isinstance(warm, int | float) else warm}"
                      f"{f' with rounds on {redact_url(store)}' if store and isinstance(warm, int | float) else ''})")
            servers = sorted(already + started, key=lambda s: s.name)
            print("\n# Airflow connections for the servers:")
            for name, value in connection_definitions(servers).items():
                print(f"export {name}={shlex.quote(value)}")
            print("\n# and the targets that use them ([speculative] targets):")
            print(f"export AIRFLOW__SPECULATIVE__TARGETS={shlex.quote(targets_json(servers))}")
        elif args.action == "stop":
            results = cluster.stop()
            if not results:
                print(f"no local Connect server recorded under {cluster.dir}")
            for info, what in results:
                print(f"{info.name}: {what} (pid {info.pid}, port {info.port})")
        else:
            rows = cluster.status()
            if not rows and args.output in ("table", "plain"):
                print(f"no local Connect server recorded under {cluster.dir}")
                return
            emit(args.output, document=rows, rows=[
                {"server": row["name"], "state": "alive" if row["alive"] else "DEAD", "port": row["port"],
                 "UI": row["ui_port"], "pid": row["pid"], "app": row["app_id"] or "-", "connection": row["conn_id"]}
                for row in rows])
    except LocalClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def fork_server(args: Any) -> None:
    """CLI entry: list or stop this user's fork servers on this host (see backends/forkserver.py)."""
    from airflow_provider_speculative.backends import forkserver

    rows = forkserver.stop_servers() if args.action == "stop" else forkserver.servers()
    if not rows and args.output in ("table", "plain"):
        print(f"no fork server running under {forkserver.runtime_dir()}")
    elif rows or args.output in ("json", "yaml"):
        table = []
        for row in rows:
            if args.action == "stop":
                state = "stopped" if row["stopped"] else "STILL RUNNING (it finishes the launch it serves)"
            else:
                state = (("serving" if row["serving"] else "draining") if row["running"] else "not running")
            table.append({"socket": row["socket"], "state": state, "pid": row["pid"] or "-", "log": row["log"],
                          "this interpreter's": "yes" if row["current"] else ""})
        emit(args.output, rows=table, document=rows)
    if args.action == "stop" and not all(row["stopped"] for row in rows):
        sys.exit(1)
