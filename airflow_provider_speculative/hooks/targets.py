"""Resolve a stage's targets from their Airflow connections into launch templates for plan.json.

Runs in the operator (on a worker, where connections can be read synchronously). The connection type
picks the backend kind (``spark`` -> spark-submit, ``spark_connect`` -> Spark Connect). Secrets never
enter the plan: a Connect URL may carry a token, so the trigger resolves it again with the async
connection API and hands it to attempts through their environment only (:func:`connect_env`).
"""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from airflow_provider_speculative.backends.registry import kind_for_conn_type
from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.exceptions import TargetError


def _connection(target: Target, where: str) -> Any:
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(target.conn_id)
    except Exception as exc:  # AirflowNotFoundException and friends: never fall back to a default master
        raise TargetError(f"{where}: target {target.name!r} uses connection {target.conn_id!r}, which cannot be "
                          f"found ({type(exc).__name__}: {exc}); define it (e.g. AIRFLOW_CONN_"
                          f"{target.conn_id.upper()}) or change [speculative] targets") from None


def resolve_targets(config: SpeculativeConfig, *, application: str, spark_conf: dict[str, str], app_name: str,
                    where: str) -> dict[str, dict[str, Any]]:
    """Each target's launch template: ``{kind, conn_id, node, command, env, spark_conf}``."""
    out: dict[str, dict[str, Any]] = {}
    for target in config.targets:
        conn = _connection(target, where)
        try:
            kind = kind_for_conn_type(conn.conn_type, target=target.name, conn_id=target.conn_id)
        except TargetError as exc:
            raise TargetError(f"{where}: {exc}") from None
        conf = {**target.conf, **spark_conf}
        if kind == "spark_connect":
            connect_address(conn, f"{where}: target {target.name!r}: connection {target.conn_id!r}")
        if kind == "spark_submit":
            command = _spark_submit_command(target, conf, application, app_name)
        else:
            # The attempt is a small Python client; its Spark conf is applied to its remote session.
            command = [sys.executable, application]
        out[target.name] = {"kind": kind, "conn_id": target.conn_id, "node": target.node_label,
                            "command": command, "env": {}, "spark_conf": conf if kind == "spark_connect" else {}}
        if target.auto_slots:
            out[target.name]["master_ui"] = _master_ui(target, conn, kind, where)
    return out


def _master_ui(target: Target, conn: Any, kind: str, where: str) -> str:
    """The standalone master's web UI a reactive target reads: the target's ``master_ui`` or the connection's."""
    extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else {}
    url = target.master_ui or str(extra.get("master_ui") or "")
    if kind != "spark_submit" or not str(conn.host or "").startswith("spark://"):
        raise TargetError(f"{where}: target {target.name!r} has slots 'auto', which reads a Spark standalone "
                          f"master's workers, but connection {target.conn_id!r} is {conn.conn_type!r} with host "
                          f"{conn.host!r} (expected a 'spark' connection to spark://…)")
    if not url:
        raise TargetError(f"{where}: target {target.name!r} has slots 'auto' but no master web UI URL: set "
                          f"'master_ui' on the target or in connection {target.conn_id!r}'s extra "
                          "(e.g. {\"master_ui\": \"http://master:8080\"})")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise TargetError(f"{where}: target {target.name!r}: master_ui {url!r} of connection {target.conn_id!r} "
                          "is not an http(s) URL")
    return url.rstrip("/")


def _spark_submit_command(target: Target, conf: dict[str, str], application: str, app_name: str) -> list[str]:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    hook = SparkSubmitHook(conn_id=target.conn_id, conf=conf, name=app_name)
    cmd = hook._build_spark_submit_command(application)
    if cmd and "/" not in cmd[0] and not shutil.which(cmd[0]):
        # Workers started from a venv without activating it: use the venv's spark-submit.
        local = Path(sys.executable).parent / cmd[0]
        if local.exists():
            cmd[0] = str(local)
    return cmd


def connect_address(conn: Any, where: str) -> str:
    """``host:port`` of a ``spark_connect`` connection; TargetError (naming no secret) if it is unusable.

    Unusable: no host, the port given twice, or a path after the host (SparkConnectHook builds no working URL
    from those).
    """
    host = str(conn.host or "").strip()
    if "://" not in host:
        host = f"sc://{host}"
    try:
        url = urlparse(host)
        port = conn.port or url.port
        twice = bool(conn.port and url.port)
    except ValueError:
        url, port, twice = None, None, False
    if url is None or not url.hostname:
        raise TargetError(f"{where} is a spark_connect connection without a host (expected host sc://<server> "
                          "and a port); its token, if any, was not used")
    if twice:
        raise TargetError(f"{where} gives the Spark Connect port twice (in host {conn.host!r} and as port "
                          f"{conn.port}); keep one")
    if url.path or url.query:
        # Not echoed: URL parameters there may hold a token.
        raise TargetError(f"{where} has a path or parameters after the Spark Connect host; give only "
                          "sc://<server> (user, token and use_ssl go in login, password and extra)")
    name = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{name}:{port}" if port else name


def connect_url(conn: Any) -> str:
    """``sc://host:port/;user_id=..;token=..`` of a fetched ``spark_connect`` connection, by SparkConnectHook."""
    conn_id = str(getattr(conn, "conn_id", None) or "spark_connect_default")
    connect_address(conn, f"connection {conn_id!r}")
    try:
        return str(_fetched_connect_hook_class()(conn_id, conn).get_connection_url())
    except ValueError as exc:
        raise TargetError(f"connection {conn_id!r}: SparkConnectHook cannot build its URL "
                          f"({type(exc).__name__})") from None


@functools.cache
def _fetched_connect_hook_class() -> type[Any]:
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    class _FetchedConnectHook(SparkConnectHook):
        """SparkConnectHook on a connection already fetched (asynchronously, in the triggerer)."""

        def __init__(self, conn_id: str, conn: Any) -> None:
            super().__init__(conn_id=conn_id)
            self._fetched = conn

        def get_connection(self, conn_id: str) -> Any:  # type: ignore[override]
            return self._fetched

    return _FetchedConnectHook


async def connect_env(plan: StagePlan) -> dict[str, dict[str, str]]:
    """Per Connect target, the environment carrying its server URL (resolved in the triggerer, never stored)."""
    from airflow.sdk import BaseHook

    out: dict[str, dict[str, str]] = {}
    for name, spec in plan["targets"].items():
        if spec["kind"] == "spark_connect":
            conn = await BaseHook.aget_connection(spec["conn_id"])
            out[name] = {REMOTE_ENV: connect_url(conn)}
    return out


def connect_env_sync(plan: StagePlan) -> dict[str, dict[str, str]]:
    """:func:`connect_env` with synchronous lookups, skipping a connection that cannot be read or used.

    For stopping a stage's attempts (replanning, a worker's kill): a target whose URL cannot be resolved
    is still stopped, through the session recorded at launch (without the connection's token).
    """
    from airflow.sdk import BaseHook

    out: dict[str, dict[str, str]] = {}
    for name, spec in plan["targets"].items():
        if spec["kind"] == "spark_connect":
            try:
                out[name] = {REMOTE_ENV: connect_url(BaseHook.get_connection(spec["conn_id"]))}
            except Exception:
                continue
    return out


async def target_connect_urls(targets: Iterable[Target]) -> dict[str, str]:
    """The server URL of every target whose connection is a usable ``spark_connect`` one; others left out.

    For warming up before planning: a connection that is missing or unusable is reported by planning, with
    the pipeline and stage named, not here.
    """
    from airflow.sdk import BaseHook

    out: dict[str, str] = {}
    for target in targets:
        try:
            url = _connect_url_or_none(target, await BaseHook.aget_connection(target.conn_id))
        except Exception:
            continue
        if url is not None:
            out[target.name] = url
    return out


def target_connect_urls_sync(targets: Iterable[Target]) -> dict[str, str]:
    """:func:`target_connect_urls` where connections are read synchronously (an operator on a worker)."""
    from airflow.sdk import BaseHook

    out: dict[str, str] = {}
    for target in targets:
        try:
            url = _connect_url_or_none(target, BaseHook.get_connection(target.conn_id))
        except Exception:
            continue
        if url is not None:
            out[target.name] = url
    return out


def _connect_url_or_none(target: Target, conn: Any) -> str | None:
    if kind_for_conn_type(conn.conn_type, target=target.name, conn_id=target.conn_id) != "spark_connect":
        return None
    return connect_url(conn)
