"""Opening a store root: one backend per root URL and credentials in each process.

Every layout of an S3 store shares one :class:`~airflow_provider_speculative.store.backend.S3Backend` (one boto3
client, one connection pool, one journal numbering) per process: :func:`open_store` keeps it in a process-wide
cache keyed by the root's URL and where its credentials come from. A POSIX root holds nothing to share (a
:class:`~airflow_provider_speculative.store.backend.PosixBackend` is its path), so it is built for each call, from
the path as given, exactly as layouts always built it.

**Credentials** of an S3 root come from the same place as the credentials of S3 sources:

- explicit ``credentials`` (any object with the fields of :class:`S3Credentials`), when a caller has them;
- else, with a connection id (``[speculative] s3_conn_id``) in a process whose Airflow layer registered a
  resolver (:func:`resolve_connections_with`: the operator, the triggerer, the CLI and the UI), that connection;
- else the standard AWS environment (:func:`settings_from_environment`): an attempt's runtime, which runs
  without Airflow, always takes this one.

Credentials are resolved once per root and source, when the root is first opened, and stay in the backend
(the boto3 client): the cache's keys carry a SHA-256 of explicit credentials, never the credentials, and
nothing here logs, formats or raises them.

Tests (and embedders) put a backend of their own in front of the cache with :func:`install_store`: every open
of its URL returns it, whatever the credentials; :func:`forget_stores` empties both.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend, S3Credentials, StoreBackend

# Root URL schemes served by S3Backend.
S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True)
class S3Settings:
    """Where the S3 endpoint is and who we are there (secrets never shown by ``repr``)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    source: str = "environment"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values, so a caller can check that none of them appears in what it writes."""
        return tuple(s for s in (self.secret_key, self.session_token) if s)


def settings_from_environment(environ: Mapping[str, str] | None = None) -> S3Settings:
    """The standard AWS environment variables as :class:`S3Settings`."""
    env = os.environ if environ is None else environ
    return S3Settings(
        endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        access_key=env.get("AWS_ACCESS_KEY_ID") or None,
        secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        session_token=env.get("AWS_SESSION_TOKEN") or None,
        source="environment")


def environment_of(credentials: S3Credentials) -> dict[str, str]:
    """``credentials`` as the standard AWS environment (what :func:`settings_from_environment` reads back).

    For an attempt's launch environment only (never a document, an argument or a log line). The endpoint goes in
    ``AWS_ENDPOINT_URL_S3`` and ``AWS_ENDPOINT_URL``, the region in ``AWS_REGION`` and ``AWS_DEFAULT_REGION``, so
    every AWS client reads the same; a field that is not set is absent.
    """
    values = {"AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
              "AWS_SESSION_TOKEN": credentials.session_token, "AWS_ENDPOINT_URL_S3": credentials.endpoint_url,
              "AWS_ENDPOINT_URL": credentials.endpoint_url, "AWS_REGION": credentials.region,
              "AWS_DEFAULT_REGION": credentials.region}
    return {name: str(value) for name, value in values.items() if value}


def spark_s3_conf(settings: S3Credentials) -> dict[str, str]:
    """Spark settings that let s3a serve ``s3://`` and ``s3a://`` paths at ``settings``' endpoint (no secret).

    The keys reach s3a through the environment of the Spark process (its default credential chain reads
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), never through Spark configuration.
    """
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            # s3a skips its probes before a create (is the path a directory? does a file exist?) and its walk
            # up the parents on mkdir: 12 of the 45 requests of one exchange write. Every path an attempt
            # writes is new and its own (its attempt's prefix, a sink's version prefix), so the checks find
            # nothing; what they would refuse (a file over a directory, an overwrite) the layout never asks.
            "spark.hadoop.fs.s3a.performance.flags": "create,mkdir"}
    if settings.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = settings.region
    if settings.endpoint_url:
        endpoint = urlsplit(settings.endpoint_url)
        conf.update({
            "spark.hadoop.fs.s3a.endpoint": settings.endpoint_url,
            # A private endpoint (MinIO, Ceph, a test server) serves buckets as paths, not as host names.
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "true" if endpoint.scheme == "https" else "false",
        })
        conf.setdefault("spark.hadoop.fs.s3a.endpoint.region", settings.region or "us-east-1")
    return conf


ConnectionResolver = Callable[[str], S3Credentials]

_lock = threading.Lock()
_opened: dict[tuple[str, str], StoreBackend] = {}
_installed: dict[str, StoreBackend] = {}
_resolver: ConnectionResolver | None = None


def resolve_connections_with(resolver: ConnectionResolver | None) -> None:
    """Let S3 roots opened with a connection id take that connection's credentials through ``resolver``.

    The Airflow layer registers its resolver (``settings.py``, reading Airflow connections); without one (an
    attempt's runtime) a connection id is ignored and the AWS environment serves.
    """
    global _resolver
    with _lock:
        _resolver = resolver


def is_s3_root(root: str | Path) -> bool:
    """True if ``root`` is an ``s3://`` or ``s3a://`` URL (else a path or ``file://`` URL: POSIX)."""
    return isinstance(root, str) and urlsplit(root).scheme.lower() in S3_SCHEMES


def root_url(root: str | Path) -> str:
    """The URL naming ``root`` in the cache: ``s3://bucket/prefix`` (``s3a`` as ``s3``), or ``file://`` and the path."""
    if is_s3_root(root):
        parts = urlsplit(str(root))
        return f"s3://{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
    text = str(root)
    if urlsplit(text).scheme.lower() == "file":
        text = unquote(urlsplit(text).path)
    return PosixBackend(Path(text)).url


def _fingerprint(credentials: S3Credentials) -> str:
    fields = (credentials.endpoint_url, credentials.region, credentials.access_key, credentials.secret_key,
              credentials.session_token)
    return "explicit:" + hashlib.sha256(repr(fields).encode()).hexdigest()


def open_store(root: str | Path, *, conn_id: str = "", credentials: S3Credentials | None = None) -> StoreBackend:
    """The backend of store ``root`` (a path, a ``file://`` URL or ``s3://bucket/prefix``), from the process's cache.

    ``credentials`` (else the connection ``conn_id``, else the AWS environment: module docstring) serve an S3 root
    the first time it is opened with them; a POSIX root ignores both.
    """
    url = root_url(root)
    with _lock:
        installed = _installed.get(url)
        if installed is not None:
            return installed
        resolver = _resolver
    if not is_s3_root(root):
        text = str(root)
        return PosixBackend(Path(unquote(urlsplit(text).path) if urlsplit(text).scheme.lower() == "file" else text))
    if credentials is not None:
        source = _fingerprint(credentials)
    elif conn_id and resolver is not None:
        source = f"connection:{conn_id}"
    else:
        source = "environment"
    key = (url, source)
    with _lock:
        opened = _opened.get(key)
    if opened is not None:
        return opened
    if credentials is None:
        # Resolved outside the lock: reading an Airflow connection may take a round trip.
        credentials = resolver(conn_id) if source.startswith("connection:") and resolver is not None \
            else settings_from_environment()
    backend = S3Backend(url, credentials)
    with _lock:
        # Two first opens may race: the first one kept is the one every caller gets.
        return _opened.setdefault(key, backend)


def opened_store(url: str) -> StoreBackend:
    """The backend this process opened (or had installed) for root ``url``; opened with the environment if none was.

    For a layout path that carries only its root's URL (``layout.StorePath``): the backend of the layout it came
    from was opened before it, so this finds that one.
    """
    key = root_url(url)
    with _lock:
        found = _installed.get(key) or next((b for (u, _), b in _opened.items() if u == key), None)
    return found if found is not None else open_store(url)


def split_plan_url(location: str) -> tuple[str, str]:
    """(store root, the plan's name) of a plan's URL (``str(layout.plan)`` on S3): the name is its last four segments.

    ``<root>/<dag>/<run>/<stage>/plan.json``: the layout's names (``store/layout.py``) never hold a ``/``.
    """
    segments = location.rstrip("/").split("/")
    if len(segments) < 8 or segments[-1] != "plan.json":  # s3:, "", bucket, dag, run, stage, plan.json at least
        raise StoreError(f"{location!r} is not the URL of a stage's plan.json in a store")
    return "/".join(segments[:-4]), "/".join(segments[-4:])


def read_plan_url(location: str, *, conn_id: str = "") -> tuple[StoreBackend, str, Any]:
    """(the store, the plan's name, the plan document or None) of a plan's ``s3://`` URL, read by name.

    The store is opened through the cache with ``conn_id``'s credentials where a resolver is registered, else the
    AWS environment (an attempt's runtime).
    """
    root, name = split_plan_url(location)
    store = open_store(root, conn_id=conn_id)
    return store, name, store.read_json(name)


def install_store(backend: StoreBackend, url: str | None = None) -> None:
    """Make ``backend`` what every open of ``url`` (default: its own URL) returns in this process (tests)."""
    key = root_url(url or backend.url)
    if not is_s3_root(key) and not isinstance(backend, PosixBackend):
        raise StoreError(f"a backend installed for a POSIX root must be a PosixBackend, not {backend!r}")
    with _lock:
        _installed[key] = backend


def forget_stores() -> None:
    """Empty the cache and the installed backends (tests; a process never needs to)."""
    with _lock:
        _opened.clear()
        _installed.clear()
