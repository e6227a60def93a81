"""The suite's moto S3 endpoint (devtools/moto_s3.py) serves a ranged GET reading only the range, as S3 does."""

from __future__ import annotations

import concurrent.futures
import http.client
import random
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import moto
import pytest

from airflow_provider_speculative.devtools import moto_s3, services

BUCKET = "ranges"
MIB = 1024 * 1024
# moto keeps a value under about 5 MiB in memory and a larger one in a file on disk: one object of each,
# and one from a multipart upload (two 5 MiB parts and a short last one).
SIZES = {"small": 300 * 1024 + 17, "large": 6 * MIB + 123}
MULTIPART = "multipart"


def _data(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[services.S3Server, dict[str, bytes]]]:
    """A patched moto server with a small, a large and a multipart-uploaded object; yields it and the objects."""
    server = services.start_s3()
    try:
        client: Any = server.client()
        client.create_bucket(Bucket=BUCKET)
        objects = {name: _data(size, seed) for seed, (name, size) in enumerate(SIZES.items())}
        for name, data in objects.items():
            client.put_object(Bucket=BUCKET, Key=name, Body=data)
        objects[MULTIPART] = _data(11 * MIB + 7, 99)
        upload = client.create_multipart_upload(Bucket=BUCKET, Key=MULTIPART)["UploadId"]
        parts = []
        for number, start in enumerate(range(0, len(objects[MULTIPART]), 5 * MIB), start=1):
            body = objects[MULTIPART][start : start + 5 * MIB]
            etag = client.upload_part(Bucket=BUCKET, Key=MULTIPART, UploadId=upload, PartNumber=number, Body=body)
            parts.append({"PartNumber": number, "ETag": etag["ETag"]})
        client.complete_multipart_upload(
            Bucket=BUCKET, Key=MULTIPART, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        yield server, objects
    finally:
        server.stop()


def _ranges(size: int) -> list[tuple[str, slice]]:
    """S3's range forms against the slice of the object each must return."""
    return [
        ("bytes=0-0", slice(0, 1)),  # first byte
        (f"bytes={size - 1}-{size - 1}", slice(size - 1, size)),  # last byte
        (f"bytes={size // 3}-{size // 3 + 65535}", slice(size // 3, size // 3 + 65536)),  # middle
        (f"bytes={size - 1000}-", slice(size - 1000, size)),  # open-ended
        ("bytes=-8", slice(size - 8, size)),  # suffix: the last 8 bytes
        (f"bytes={size - 10}-{size + 5000}", slice(size - 10, size)),  # past the end: clipped
        (f"bytes=-{size + 5000}", slice(0, size)),  # a suffix longer than the object: all of it
        ("bytes=0-", slice(0, size)),
    ]


@pytest.mark.parametrize("name", [*SIZES, MULTIPART])
def test_ranged_gets_return_the_slice_with_s3s_status_and_headers(
    endpoint: tuple[services.S3Server, dict[str, bytes]], name: str
) -> None:
    server, objects = endpoint
    client: Any = server.client()
    data = objects[name]
    etag = client.head_object(Bucket=BUCKET, Key=name)["ETag"]

    for header, part in _ranges(len(data)):
        got = client.get_object(Bucket=BUCKET, Key=name, Range=header)
        body = got["Body"].read()
        first, last = part.indices(len(data))[0], part.indices(len(data))[1] - 1
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206, header
        assert got["ContentRange"] == f"bytes {first}-{last}/{len(data)}", header
        assert got["ContentLength"] == last - first + 1 == len(body), header
        assert body == data[part], header
        assert got["ETag"] == etag, header


@pytest.mark.parametrize("name", [*SIZES, MULTIPART])
def test_unsatisfiable_ranges_are_416(endpoint: tuple[services.S3Server, dict[str, bytes]], name: str) -> None:
    server, objects = endpoint
    client: Any = server.client()
    size = len(objects[name])

    for header in (f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=-0"):
        with pytest.raises(botocore.exceptions.ClientError) as failure:
            client.get_object(Bucket=BUCKET, Key=name, Range=header)
        assert failure.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416, header
        assert failure.value.response["Error"]["Code"] == "InvalidRange", header


@pytest.mark.parametrize("name", [*SIZES, MULTIPART])
def test_unranged_get_returns_the_whole_object(endpoint: tuple[services.S3Server, dict[str, bytes]], name: str) -> None:
    server, objects = endpoint
    got: Any = server.client().get_object(Bucket=BUCKET, Key=name)  # type: ignore[attr-defined]

    assert got["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert "ContentRange" not in got
    assert got["Body"].read() == objects[name]


def test_ranges_read_by_threads_at_once_are_each_their_own_slice(
    endpoint: tuple[services.S3Server, dict[str, bytes]],
) -> None:
    server, objects = endpoint
    data = objects["large"]
    local = threading.local()

    def read(seed: int) -> bool:
        if not hasattr(local, "client"):
            local.client = server.client()
        start = random.Random(seed).randrange(len(data))
        got = local.client.get_object(Bucket=BUCKET, Key="large", Range=f"bytes={start}-{start + 32767}")
        return bool(got["Body"].read() == data[start : start + 32768])

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        assert all(pool.map(read, range(120)))


def _answers(port: int, client: Any, name: str, headers: list[str]) -> list[tuple[Any, ...]]:
    """Status, headers a server's clock and request id leave alone, and body of a GET and a HEAD per range."""
    varying = {"date", "last-modified", "x-amzn-requestid", "x-amz-request-id", "x-amz-id-2", "server"}
    answers = []
    for header in headers:
        for method, operation in (("GET", "get_object"), ("HEAD", "head_object")):
            url = client.generate_presigned_url(operation, Params={"Bucket": BUCKET, "Key": name})
            conn = http.client.HTTPConnection(services.LOOPBACK, port, timeout=60)
            try:
                conn.request(method, url.split(f":{port}", 1)[1], headers={"Range": header})
                response = conn.getresponse()
                body = response.read().split(b"<RequestId>")[0]
            finally:
                conn.close()
            kept = sorted((k.lower(), v) for k, v in response.getheaders() if k.lower() not in varying)
            answers.append((header, method, response.status, kept, body))
    return answers


def test_every_ranged_answer_is_unpatched_motos(endpoint: tuple[services.S3Server, dict[str, bytes]]) -> None:
    server, objects = endpoint
    data = objects["large"]
    size = len(data)
    # The forms above plus those moto answers with the whole object (several ranges, first after last,
    # unparsable) or 416: moto's own range handling still decides each answer.
    headers = [h for h, _ in _ranges(size)] + [
        f"bytes={size}-",
        "bytes=-0",
        "bytes=0-1,5-6",
        "bytes=9-3",
        "bytes=-",
        "bytes=a-b",
        "bytes=5",
    ]
    directory = Path(tempfile.mkdtemp(prefix="speculative-s3-"))
    port = services.free_port()
    plain = services._launch(
        [sys.executable, "-m", "moto.server", "-H", services.LOOPBACK, "-p", str(port)],
        directory,
        directory / "s3.log",
        port,
        "unpatched moto",
        services.START_TIMEOUT,
    )
    try:
        client: Any = boto3.client(
            "s3",
            endpoint_url=f"http://{services.LOOPBACK}:{port}",
            region_name="us-east-1",
            aws_access_key_id=server.access_key,
            aws_secret_access_key=server.secret_key,
        )
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="large", Body=data)
        expected = _answers(port, client, "large", headers)
    finally:
        services._kill(plain)
        shutil.rmtree(directory, ignore_errors=True)

    assert _answers(server.port, server.client(), "large", headers) == expected


def _request_lines(server: services.S3Server) -> list[str]:
    """The server's log lines about the test bucket, without werkzeug's terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", (server.directory / "s3.log").read_text())
    return [line for line in text.splitlines() if f"/{BUCKET}" in line]


def test_no_line_per_request_is_logged_by_default(endpoint: tuple[services.S3Server, dict[str, bytes]]) -> None:
    server, _ = endpoint
    client: Any = server.client()
    client.get_object(Bucket=BUCKET, Key="small", Range="bytes=0-9")["Body"].read()

    # werkzeug writes a request's line before the response's headers, so it would be there by now.
    assert _request_lines(server) == []


def test_the_line_per_request_is_logged_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(moto_s3.REQUEST_LOG_ENV, "1")
    server = services.start_s3()
    try:
        client: Any = server.client()
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="k", Body=b"0123456789")
        client.get_object(Bucket=BUCKET, Key="k", Range="bytes=2-5")["Body"].read()

        lines = _request_lines(server)
    finally:
        server.stop()
    assert [line.split('"')[1:3] for line in lines] == [
        [f"PUT /{BUCKET} HTTP/1.1", " 200 -"],
        [f"PUT /{BUCKET}/k HTTP/1.1", " 200 -"],
        [f"GET /{BUCKET}/k HTTP/1.1", " 206 -"],
    ]


# -- in this process: the patch itself ------------------------------------------------------------


def test_patching_twice_wraps_once() -> None:
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    moto_s3.patch()
    moto_s3.patch()
    for method in (S3Response.get_object, S3Response.key_response, FakeKey.dispose):
        assert method._speculative_ranged and not getattr(method.__wrapped__, "_speculative_ranged", False)


@pytest.mark.parametrize("size", [SIZES["small"], SIZES["large"]])
def test_a_ranged_get_never_reads_the_whole_value(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    from moto.s3.models import FakeKey

    moto_s3.patch()
    whole_reads: list[str] = []
    value = FakeKey.__dict__["value"]

    def counted(key: Any) -> bytes:
        whole_reads.append(key.name)
        return bytes(value.fget(key))

    monkeypatch.setattr(FakeKey, "value", property(counted, value.fset))
    data = _data(size, 7)
    with moto.mock_aws():
        client: Any = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="k", Body=data)
        whole_reads.clear()

        ranged = client.get_object(Bucket=BUCKET, Key="k", Range="bytes=100-4195")["Body"].read()
        assert (ranged, whole_reads) == (data[100:4196], [])
        # Several ranges: moto sends the whole object, read as before.
        assert client.get_object(Bucket=BUCKET, Key="k", Range="bytes=0-1,5-6")["Body"].read() == data
        assert whole_reads == ["k"]
        assert client.get_object(Bucket=BUCKET, Key="k")["Body"].read() == data
        assert whole_reads == ["k", "k"]


def _key(data: bytes, max_buffer_size: int) -> Any:
    from moto.s3.models import FakeKey

    return FakeKey("k", data, account_id="123456789012", region_name="us-east-1", max_buffer_size=max_buffer_size)


@pytest.mark.parametrize("in_memory", [True, False])
def test_read_range_reads_the_bytes_at_an_offset_and_leaves_the_file_position(in_memory: bool) -> None:
    data = _data(200_000, 3)
    key = _key(data, max_buffer_size=len(data) + 1 if in_memory else 1024)
    try:
        assert key._value_buffer._rolled is not in_memory
        key._value_buffer.seek(123)
        for offset, count in ((0, 1), (5000, 70_000), (len(data) - 3, 3), (len(data) - 3, 100), (len(data), 10)):
            assert moto_s3.read_range(key, offset, count) == data[offset : offset + count]
        assert key._value_buffer.tell() == 123
    finally:
        key.dispose()


def test_a_key_is_disposed_only_while_no_range_is_read_from_it() -> None:
    moto_s3.patch()
    key = _key(b"x" * 4096, max_buffer_size=1024)
    disposed = threading.Event()

    def dispose() -> None:
        key.dispose()
        disposed.set()

    with key.lock:  # what read_range holds while it reads the file's descriptor
        thread = threading.Thread(target=dispose)
        thread.start()
        assert not disposed.wait(0.3), "the key's file was closed while a range was being read from it"
    assert disposed.wait(10)
    thread.join()
    assert key._value_buffer.closed
