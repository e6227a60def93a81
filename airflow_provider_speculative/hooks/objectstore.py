"""S3 access for sources: credentials, a ``pyarrow.fs`` file system and the Spark (s3a) settings.

Credentials come from the Airflow connection named by ``[speculative] s3_conn_id`` (an ``aws``
connection: login = access key id, password = secret access key, extras ``endpoint_url``,
``region_name``, ``aws_session_token``) or, when that option is empty, from the standard AWS
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``).
Secrets live only in :class:`S3Settings` (hidden from ``repr``) and in the file system object built
from them: nothing here logs, formats or returns them, and :func:`spark_s3_conf` (what is handed to
Spark as configuration, which Spark shows in its UI and event logs) carries no secret: Spark's s3a
reads the keys from the environment of its own process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_speculative.core.paths import split_object_url
from airflow_provider_speculative.core.plan import plan_uses_s3
from airflow_provider_speculative.exceptions import PlanError

# Defined with the store (an attempt's runtime opens an S3 store from the environment without this layer).
from airflow_provider_speculative.store.roots import (
    S3Settings,
    environment_of,
    settings_from_environment,
    spark_s3_conf,
)

__all__ = ["S3Settings", "attempt_s3_env", "fs_path", "s3_filesystem", "s3_settings", "settings_from_connection",
           "settings_from_environment", "spark_s3_conf"]

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem


def settings_from_connection(conn: Any, conn_id: str) -> S3Settings:
    """An Airflow ``aws`` connection as :class:`S3Settings` (extras as the Amazon provider names them)."""
    extra = conn.extra_dejson if isinstance(getattr(conn, "extra_dejson", None), dict) else {}
    return S3Settings(
        endpoint_url=extra.get("endpoint_url") or None,
        region=extra.get("region_name") or None,
        access_key=conn.login or extra.get("aws_access_key_id") or None,
        secret_key=conn.password or extra.get("aws_secret_access_key") or None,
        session_token=extra.get("aws_session_token") or None,
        source=f"connection {conn_id!r}")


def s3_settings(conn_id: str, where: str) -> S3Settings:
    """Settings from the Airflow connection ``conn_id``, or from the environment when it is empty."""
    if not conn_id:
        return settings_from_environment()
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # Airflow raises AirflowNotFoundException (or a backend's own error)
        # The exception text can quote the connection's URI, secrets included: name only its type.
        raise PlanError(f"{where}: the S3 connection {conn_id!r} ([speculative] s3_conn_id) cannot be read "
                        f"({type(exc).__name__})") from None
    return settings_from_connection(conn, conn_id)


async def attempt_s3_env(plan: Mapping[str, Any]) -> dict[str, str]:
    """The AWS environment a stage run's attempts get from ``[speculative] s3_conn_id`` (empty: they inherit theirs).

    Resolved once per stage run in the controller's process (the triggerer: the async lookup), only when the
    stage's store or one of its sources is on S3. The values go into the launch environment only (core/contract.py
    ``attempt_env``): never plan.json, a journal, argv or a log; the secrets are registered with Airflow's masker.
    """
    config = plan.get("config")
    conn_id = str(config.get("s3_conn_id") or "") if isinstance(config, Mapping) else ""
    if not conn_id or not plan_uses_s3(plan):
        return {}
    from airflow.sdk import BaseHook

    try:
        conn = await BaseHook.aget_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or a secrets backend's own error
        # Its text can quote the connection's URI, secrets included: name only its type.
        raise PlanError(f"pipeline {plan.get('pipeline')!r}, stage {plan.get('stage')!r}: the S3 connection "
                        f"{conn_id!r} ([speculative] s3_conn_id) for the attempts cannot be read "
                        f"({type(exc).__name__})") from None
    settings = settings_from_connection(conn, conn_id)
    _mask(settings.secrets)
    return environment_of(settings)


def _mask(secrets: tuple[str, ...]) -> None:
    """Register ``secrets`` with Airflow's masker, so a log line of this process that quotes one shows ``***``."""
    try:
        from airflow.sdk._shared.secrets_masker import mask_secret
    except ImportError:  # pragma: no cover - another Airflow layout: the values are never logged here anyway
        return
    for secret in secrets:
        mask_secret(secret)


def s3_filesystem(settings: S3Settings) -> FileSystem:
    """A ``pyarrow.fs.S3FileSystem`` for ``settings`` (path-style addressing with a custom endpoint)."""
    from urllib.parse import urlsplit

    from pyarrow.fs import S3FileSystem

    kwargs: dict[str, Any] = {"region": settings.region or "us-east-1"}
    if settings.access_key and settings.secret_key:
        kwargs.update(access_key=settings.access_key, secret_key=settings.secret_key,
                      session_token=settings.session_token)
    if settings.endpoint_url:
        endpoint = urlsplit(settings.endpoint_url)
        kwargs.update(endpoint_override=endpoint.netloc or endpoint.path, scheme=endpoint.scheme or "https",
                      force_virtual_addressing=False)
    return S3FileSystem(**kwargs)


def fs_path(url: str) -> str:
    """The ``bucket/key`` path ``pyarrow.fs`` takes for an ``s3://`` or ``s3a://`` URL."""
    bucket, key = split_object_url(url)
    return f"{bucket}/{key}".rstrip("/")
