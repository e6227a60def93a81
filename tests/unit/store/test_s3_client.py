"""The store's boto3 clients: service models parsed once per process, credentials never shared."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from airflow_provider_speculative.store import backend
from airflow_provider_speculative.store.backend import warm_s3_client


@dataclass
class Settings:
    """S3 settings as ``hooks/objectstore.py`` gives them."""

    endpoint_url: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None = None


def test_clients_share_the_model_loader_but_not_credentials_or_endpoints():
    one = backend._client(Settings("http://127.0.0.1:9001", "eu-west-1", "AKIAONE", "secret-one"))
    two = backend._client(Settings("http://127.0.0.1:9002", None, "AKIATWO", "secret-two"))
    assert one._loader is two._loader is backend._LOADER
    assert (one._request_signer._credentials.access_key, two._request_signer._credentials.access_key) == (
        "AKIAONE", "AKIATWO")
    assert one.meta.endpoint_url == "http://127.0.0.1:9001" and two.meta.endpoint_url == "http://127.0.0.1:9002"
    assert (one.meta.region_name, two.meta.region_name) == ("eu-west-1", "us-east-1")


def test_warming_sends_nothing_and_starts_no_thread(monkeypatch):
    # The fork server forks after warming: a thread or a resolved credential would be copied into attempts.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/speculative-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/speculative-credentials")
    threads = threading.active_count()
    warm_s3_client()  # port 9 is closed: a request would fail
    assert threading.active_count() == threads
    assert backend._LOADER is not None
