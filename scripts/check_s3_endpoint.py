"""Check an S3 endpoint devtools/services.py starts against what the provider's S3 store and sources use.

Starts the endpoint (``--kind seaweedfs`` by default: `make s3-compiled` builds it; ``moto`` for the
suite's), runs each check with boto3 and prints one line per check, PASS or FAIL with what it saw:
buckets, put and get, ranged get, listing with prefix and delimiter, delete, a multipart upload of
three 5 MiB parts, conditional create (``If-None-Match: *``) on an existing key, and 64 threads
racing a conditional create of one new key (exactly one may win). Not a test CI runs: a tool to
judge an endpoint before a benchmark relies on it. Exits 1 when a check fails.

    PYTHONPATH=. .venv/bin/python scripts/check_s3_endpoint.py [--kind seaweedfs|moto] [--racers 64]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_speculative.devtools.services import S3_KINDS, S3Server, start_s3

BUCKET = "check"
PART = 5 * 1024 * 1024


def _code(exc: Exception) -> str:
    """The HTTP status and S3 error code of a botocore ClientError, e.g. ``412 PreconditionFailed``."""
    response = getattr(exc, "response", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return f"{status} {response.get('Error', {}).get('Code')}"


def check_put_get(client: Any) -> str:
    """Put an object and read it back."""
    client.put_object(Bucket=BUCKET, Key="plain/object", Body=b"hello, object store")
    body = client.get_object(Bucket=BUCKET, Key="plain/object")["Body"].read()
    assert body == b"hello, object store", body
    return f"{len(body)} bytes back"


def check_ranged_get(client: Any) -> str:
    """Read bytes 7-12 of the object; the answer is 206 with exactly those bytes."""
    got = client.get_object(Bucket=BUCKET, Key="plain/object", Range="bytes=7-12")
    body = got["Body"].read()
    status = got["ResponseMetadata"]["HTTPStatusCode"]
    assert (status, body) == (206, b"object"), (status, body)
    return f"206 {body!r}, Content-Range {got.get('ContentRange')}"


def check_list(client: Any) -> str:
    """list_objects_v2 with a prefix and a delimiter: direct keys as contents, deeper ones as common prefixes."""
    for key in ("tree/a/1", "tree/a/2", "tree/a/b/3", "tree/a/b/4", "tree/c/5"):
        client.put_object(Bucket=BUCKET, Key=key, Body=key.encode())
    got = client.list_objects_v2(Bucket=BUCKET, Prefix="tree/a/", Delimiter="/")
    keys = [item["Key"] for item in got.get("Contents", [])]
    prefixes = [item["Prefix"] for item in got.get("CommonPrefixes", [])]
    assert (keys, prefixes) == (["tree/a/1", "tree/a/2"], ["tree/a/b/"]), (keys, prefixes)
    flat = client.list_objects_v2(Bucket=BUCKET, Prefix="tree/")
    assert flat["KeyCount"] == 5, flat["KeyCount"]
    return f"contents {keys}, common prefixes {prefixes}; without delimiter {flat['KeyCount']} keys"


def check_delete(client: Any) -> str:
    """Delete an object; a head of it then answers 404."""
    client.delete_object(Bucket=BUCKET, Key="tree/c/5")
    try:
        client.head_object(Bucket=BUCKET, Key="tree/c/5")
    except client.exceptions.ClientError as exc:
        assert _code(exc).startswith("404"), _code(exc)
        return f"head after delete: {_code(exc)}"
    raise AssertionError("the object is still there after delete")


def check_multipart(client: Any) -> str:
    """Upload three 5 MiB parts, complete, and read the whole object back."""
    parts_data = [os.urandom(PART) for _ in range(3)]
    upload = client.create_multipart_upload(Bucket=BUCKET, Key="multi/object")
    parts = []
    for number, data in enumerate(parts_data, start=1):
        got = client.upload_part(Bucket=BUCKET, Key="multi/object", UploadId=upload["UploadId"],
                                 PartNumber=number, Body=data)
        parts.append({"PartNumber": number, "ETag": got["ETag"]})
    client.complete_multipart_upload(Bucket=BUCKET, Key="multi/object", UploadId=upload["UploadId"],
                                     MultipartUpload={"Parts": parts})
    body = client.get_object(Bucket=BUCKET, Key="multi/object")["Body"].read()
    want = b"".join(parts_data)
    assert hashlib.sha256(body).digest() == hashlib.sha256(want).digest(), (len(body), len(want))
    etag = client.head_object(Bucket=BUCKET, Key="multi/object")["ETag"]
    return f"{len(body)} bytes equal to the parts, ETag {etag}"


def check_conditional_existing(client: Any) -> str:
    """``put_object(IfNoneMatch='*')`` on an existing key is refused with 412 and leaves the object."""
    try:
        client.put_object(Bucket=BUCKET, Key="plain/object", Body=b"overwritten", IfNoneMatch="*")
    except client.exceptions.ClientError as exc:
        body = client.get_object(Bucket=BUCKET, Key="plain/object")["Body"].read()
        assert _code(exc) == "412 PreconditionFailed", _code(exc)
        assert body == b"hello, object store", body
        return f"{_code(exc)}, object unchanged"
    raise AssertionError("the conditional put on an existing key succeeded (If-None-Match not honoured)")


def check_conditional_race(client: Any, racers: int) -> str:
    """``racers`` threads create one new key with ``IfNoneMatch='*'`` at once: exactly one gets 200."""
    key = f"race/{time.time_ns()}"
    start = threading.Barrier(racers)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def race(index: int) -> None:
        start.wait()
        try:
            client.put_object(Bucket=BUCKET, Key=key, Body=f"racer {index}".encode(), IfNoneMatch="*")
            outcome = "200"
        except client.exceptions.ClientError as exc:
            outcome = _code(exc)
        except Exception as exc:
            outcome = type(exc).__name__
        with lock:
            outcomes.append((index, outcome))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = collections.Counter(outcome for _, outcome in outcomes)
    winners = [index for index, outcome in outcomes if outcome == "200"]
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    summary = ", ".join(f"{count} x {outcome}" for outcome, count in sorted(counts.items()))
    assert len(winners) == 1, f"{len(winners)} winners: {summary}"
    assert body == f"racer {winners[0]}".encode(), f"stored {body!r}, winner racer {winners[0]}: {summary}"
    return f"{summary}; the stored object is the winner's"


def process_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(server: S3Server, racers: int) -> bool:
    """Run every check against ``server``; True when all pass."""
    import boto3
    import botocore.config

    # One connection per racer, and no retries: a retried conditional put would blur who won.
    client = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=server.region,
                          aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
                          config=botocore.config.Config(max_pool_connections=racers,
                                                        retries={"max_attempts": 1}))
    checks: list[tuple[str, Callable[[], str]]] = [
        ("create bucket", lambda: (client.create_bucket(Bucket=BUCKET), "created")[1]),
        ("put/get", lambda: check_put_get(client)),
        ("ranged get", lambda: check_ranged_get(client)),
        ("list_objects_v2 prefix+delimiter", lambda: check_list(client)),
        ("delete", lambda: check_delete(client)),
        ("multipart 3 x 5 MiB", lambda: check_multipart(client)),
        ("IfNoneMatch=* on existing key", lambda: check_conditional_existing(client)),
        (f"IfNoneMatch=* race of {racers}", lambda: check_conditional_race(client, racers)),
    ]
    ok = True
    for name, check in checks:
        started = time.monotonic()
        try:
            detail, verdict = check(), "PASS"
        except Exception as exc:
            detail, verdict, ok = f"{type(exc).__name__}: {exc}", "FAIL", False
        print(f"{verdict}  {name}: {detail} ({time.monotonic() - started:.2f} s)", flush=True)
    return ok


def main() -> int:
    """Start the endpoint, run the checks, stop it; exit status 1 when a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=S3_KINDS, default="seaweedfs")
    parser.add_argument("--racers", type=int, default=64)
    args = parser.parse_args()
    started = time.monotonic()
    server = start_s3(kind=args.kind)
    print(f"{args.kind} S3 endpoint {server.endpoint_url} ready in {time.monotonic() - started:.1f} s", flush=True)
    try:
        cpu_before = process_cpu(server.proc.pid)
        ok = run(server, args.racers)
        print(f"endpoint CPU during the checks: {process_cpu(server.proc.pid) - cpu_before:.1f} s")
    finally:
        server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
