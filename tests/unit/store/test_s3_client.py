"""The store's boto3 clients: service models parsed once per process, credentials never shared."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

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


def test_clients_resend_a_stalled_request_within_seconds():
    client = backend._client(Settings("http://127.0.0.1:9001", None, "AKIAONE", "secret-one"))
    assert client.meta.config.read_timeout == backend.S3_READ_TIMEOUT <= 15
    assert client.meta.config.connect_timeout == backend.S3_CONNECT_TIMEOUT <= 5


class _LostAnswer:
    """A client whose conditional put reaches the bucket but whose answer is lost, as botocore then resends it."""

    def __init__(self, client: object) -> None:
        self._client = client

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)

    def put_object(self, **kwargs: object) -> object:
        """The first try stores the object; its resend meets the object and gets S3's 412."""
        self._client.put_object(**kwargs)  # type: ignore[attr-defined]
        return self._client.put_object(**kwargs)  # type: ignore[attr-defined]


def test_a_conditional_create_whose_answer_was_lost_is_still_won():
    import boto3
    import moto

    from airflow_provider_speculative.store.backend import S3Backend

    with moto.mock_aws():
        raw = boto3.client("s3", region_name="us-east-1")
        raw.create_bucket(Bucket="lost-answer")
        store = S3Backend("s3://lost-answer/store", client=_LostAnswer(raw))
        # The resend's 412 meets our own first try (its mark): won. Another writer: lost, as before, even with
        # the same bytes (two reclaimers at one clock tick write the same record).
        assert store.create_exclusive("runs/claim.json", b'{"token": "ours"}')
        other = S3Backend("s3://lost-answer/store", client=raw)
        assert not other.create_exclusive("runs/claim.json", b'{"token": "theirs"}')
        assert not other.create_exclusive("runs/claim.json", b'{"token": "ours"}')
        # A writer whose first try already met the object never wrote it: lost too.
        assert not S3Backend("s3://lost-answer/store", client=_LostAnswer(raw)).create_exclusive(
            "runs/claim.json", b'{"token": "ours"}')
        assert store.read("runs/claim.json") == b'{"token": "ours"}'


class _StalledBody:
    """A response body that stalls: reading it times out, as botocore reports a stalled stream."""

    def read(self) -> bytes:
        """Time out."""
        from botocore.exceptions import ReadTimeoutError

        raise ReadTimeoutError(endpoint_url="http://127.0.0.1:9")

    def close(self) -> None:
        """Nothing to release."""


class _StallsOnce:
    """A client whose first GetObject answers with a stalled body, then with the object."""

    def __init__(self, data: bytes, stalls: int = 1) -> None:
        self.data, self.stalls, self.calls = data, stalls, 0

    def get_object(self, **kwargs: object) -> dict[str, object]:
        """A stalled body for the first ``stalls`` calls."""
        import io

        self.calls += 1
        return {"Body": _StalledBody() if self.calls <= self.stalls else io.BytesIO(self.data)}


def test_a_read_whose_body_stalls_is_asked_again_and_a_lasting_stall_fails_naming_the_object():
    import pytest

    from airflow_provider_speculative.exceptions import StoreError
    from airflow_provider_speculative.store.backend import S3Backend

    client = _StallsOnce(b'{"plan": 1}')
    assert S3Backend("s3://b/p", client=client).read("d/plan.json") == b'{"plan": 1}'  # type: ignore[arg-type]
    assert client.calls == 2
    client = _StallsOnce(b"{}", stalls=99)
    with pytest.raises(StoreError, match=r"cannot read s3://b/p/d/plan.json: ReadTimeoutError"):
        S3Backend("s3://b/p", client=client).read("d/plan.json")  # type: ignore[arg-type]
    assert client.calls == backend._BODY_TRIES


def test_a_missing_key_costs_one_request_once_the_bucket_answered():
    import boto3
    import moto

    from airflow_provider_speculative.exceptions import StoreError
    from airflow_provider_speculative.store.backend import S3Backend

    with moto.mock_aws():
        raw = boto3.client("s3", region_name="us-east-1")
        raw.create_bucket(Bucket="probed")
        calls: list[str] = []
        raw.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
        store = S3Backend("s3://probed/store", client=raw)
        # A supervisor probes its absent cancel request every few seconds: a HEAD each, the bucket asked once.
        assert [store.exists("run/attempt=0/cancel.json") for _ in range(5)] == [False] * 5
        assert calls.count("HeadObject") == 5 and calls.count("HeadBucket") == 1
        # A store whose bucket is missing still says so instead of calling every key missing.
        with pytest.raises(StoreError, match=r"no-such-bucket-probe"):
            S3Backend("s3://no-such-bucket-probe/store", client=raw).stat("x.json")
