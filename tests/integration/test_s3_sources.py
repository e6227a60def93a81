"""Sources on S3, end to end against the suite's own S3 endpoint (devtools/services.py, moto's server).

(a) planning lists a prefix, a glob and one object through pyarrow.fs, checks each footer, and refuses a
missing prefix, a file that is not Parquet and an unknown bucket with messages that name the input and
carry no secret; credentials come from the AWS environment or from an Airflow ``aws`` connection
(``[speculative] s3_conn_id``); (b) the join example (TPC-H Q3, six stages) with its three sources on
``s3://`` runs on the session's Connect servers (s3a, jars from `make jars`) and commits exactly DuckDB's
answer on the same files; no byte of the secret key is in the store, the output or the servers' logs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pendulum
import pytest

from airflow_provider_speculative.control.sources import list_object_files
from airflow_provider_speculative.core.graph import SourceSpec
from airflow_provider_speculative.devtools import services as services_module
from airflow_provider_speculative.exceptions import PlanError
from airflow_provider_speculative.hooks.objectstore import settings_from_environment
from airflow_provider_speculative.sinks.parquet import published_files
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout
from tests import services
from tests.conftest import TEST_ENV
from tests.integration.q3 import Q3_COLUMNS, duckdb_q3, q3_difference, read_q3_output, sort_q3
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
OUTPUT = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"])
BUCKET = "tpch-sources"


@pytest.fixture(scope="module")
def s3_tpch(tmp_path_factory) -> tuple[Path, str]:
    """customer, orders, lineitem at scale factor 0.01 (2 parts each): a local copy and the same on S3."""
    root = tmp_path_factory.mktemp("tpch-s3-sf0.01")
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", "0.01", "--tables",
                    "customer,orders,lineitem", "--parts", "2", "--output-dir", str(root)],
                   check=True, capture_output=True)
    server = services.s3()
    server.create_bucket(BUCKET)
    assert server.upload_tree(root, BUCKET, "sf001") == 6
    return root, f"s3://{BUCKET}/sf001"


@pytest.fixture
def aws_env(monkeypatch):
    """The session's S3 endpoint as the standard AWS environment."""
    server = services.s3()
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    return server


def _source(url: str) -> SourceSpec:
    return SourceSpec(path=url, format="parquet")


def test_planning_lists_and_checks_s3_sources(s3_tpch, aws_env, monkeypatch):
    local, url = s3_tpch
    where = "pipeline 'p', stage 's', input 'orders'"
    listed = list_object_files(_source(url + "/orders"), where)
    want = sorted((f"{url}/orders/{p.name}", p.stat().st_size) for p in (local / "orders").glob("*.parquet"))
    assert listed == want
    # A glob on keys, an s3a:// URL of one object.
    assert list_object_files(_source(url + "/*/*.1.parquet"), where) == sorted(
        (f"{url}/{t}/{t}.1.parquet", (local / t / f"{t}.1.parquet").stat().st_size)
        for t in ("customer", "lineitem", "orders"))
    one = f"s3a://{BUCKET}/sf001/orders/orders.1.parquet"
    assert list_object_files(_source(one), where) == [(one, (local / "orders" / "orders.1.parquet").stat().st_size)]

    with pytest.raises(PlanError, match=r"input 'orders': source 's3://tpch-sources/nothing-here' does not exist"):
        list_object_files(_source(f"s3://{BUCKET}/nothing-here"), where)
    aws_env.client().put_object(Bucket=BUCKET, Key="broken/part-0.parquet", Body=b"not parquet at all, no magic")
    with pytest.raises(PlanError, match=r"broken/part-0.parquet is not a Parquet file: no Parquet magic"):
        list_object_files(_source(f"s3://{BUCKET}/broken"), where)

    # An unknown bucket is refused, and the message carries no key. moto accepts any key pair, so a
    # rejected key (403 on real S3) is not exercised here.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "OtherSecretValue0123456789")
    with pytest.raises(PlanError, match="no-such-bucket-here") as err:
        list_object_files(_source("s3://no-such-bucket-here/x"), where)
    assert "OtherSecretValue" not in str(err.value) and aws_env.secret_key not in str(err.value)


def test_s3_conn_id_supplies_endpoint_and_keys(s3_tpch, monkeypatch):
    _, url = s3_tpch
    server = services.s3()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_S3_SOURCES_TEST", json.dumps({
        "conn_type": "aws", "login": server.access_key, "password": server.secret_key,
        "extra": {"endpoint_url": server.endpoint_url, "region_name": "us-east-1"}}))
    listed = list_object_files(_source(url + "/customer"), "here", s3_conn_id="s3_sources_test")
    assert [p for p, _ in listed] == [f"{url}/customer/customer.1.parquet", f"{url}/customer/customer.2.parquet"]
    with pytest.raises(PlanError, match=r"the S3 connection 'missing_s3_conn' \(\[speculative\] s3_conn_id\)"):
        list_object_files(_source(url + "/customer"), "here", s3_conn_id="missing_s3_conn")


def test_q3_with_sources_on_s3_equals_duckdb(airflow_db, s3_tpch, connect_pool, monkeypatch):
    local, url = s3_tpch
    monkeypatch.setenv("SPECULATIVE_TEST_TPCH", url)  # read when the DAG folder is parsed
    run = load_dag("connect_q3", HERE / "dags").test(logical_date=pendulum.datetime(2026, 5, 4, tz="UTC"))
    assert run.state == "success"

    got = read_q3_output(OUTPUT / "connect_q3" / "2026-05-04")
    want = duckdb_q3(local)
    assert len(want) == 10
    assert q3_difference(got, want) is None, q3_difference(got, want)

    plan = read_json(StageLayout(STORE, "connect_q3", run.run_id, "scan_lineitem").plan)
    files = [f["path"] for sub in plan["subtasks"] for f in sub["inputs"]["lineitem"]["files"]]
    assert sorted(files) == [f"{url}/lineitem/lineitem.1.parquet", f"{url}/lineitem/lineitem.2.parquet"]

    secret = services.s3().secret_key.encode()
    where = [STORE / "connect_q3" / run.run_id, OUTPUT / "connect_q3" / "2026-05-04",
             *(Path(s.log).parent for s in connect_pool.values())]
    leaked = [str(p) for root in where for p in Path(root).rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert not leaked, f"the S3 secret key is written in {leaked}"


def test_q3_with_its_sink_on_s3_publishes_duckdbs_answer_once_per_run(airflow_db, s3_tpch, aws_env, connect_pool,
                                                                      monkeypatch):
    """The sink on S3: each run publishes a new version by ``_CURRENT`` and deletes the one it replaced."""
    import pyarrow.parquet as pq
    from pyarrow.fs import S3FileSystem

    local, _ = s3_tpch
    aws_env.create_bucket("q3-sink")
    monkeypatch.setenv("SPECULATIVE_TEST_TPCH", str(local))
    monkeypatch.setenv("SPECULATIVE_EXAMPLE_OUTPUT", "s3://q3-sink/out")  # read when the DAG folder is parsed
    settings = settings_from_environment()
    endpoint = str(settings.endpoint_url).split("://", 1)
    fs = S3FileSystem(access_key=settings.access_key, secret_key=settings.secret_key, region="us-east-1",
                      endpoint_override=endpoint[1], scheme=endpoint[0])
    want = duckdb_q3(local)
    published: list[list[str]] = []
    for logical in (pendulum.datetime(2026, 5, 4, tz="UTC"), pendulum.datetime(2026, 5, 4, 1, tz="UTC")):
        dag = load_dag("connect_q3", HERE / "dags")
        run = dag.test(logical_date=logical, run_conf={})
        assert run.state == "success"
        files = published_files("s3://q3-sink/out/connect_q3/2026-05-04", credentials=settings)
        assert files and all(f.startswith("s3://q3-sink/out/connect_q3/2026-05-04/_v=") for f in files)
        rows = [r for f in files for r in pq.read_table(f.removeprefix("s3://"), filesystem=fs).to_pylist()]
        got = sort_q3([{c: r[c] for c in Q3_COLUMNS} for r in rows])
        assert q3_difference(got, want) is None, q3_difference(got, want)
        published.append(files)
    # The second run of the same date published a new version, and the first version's files are gone.
    assert set(published[0]).isdisjoint(published[1])
    left = {info.path for info in fs.get_file_info(pyarrow_selector("q3-sink/out/connect_q3/2026-05-04"))
            if info.path.endswith(".parquet")}
    assert left == {f.removeprefix("s3://") for f in published[1]}
    secret = services.s3().secret_key.encode()
    leaked = [str(p) for p in (STORE / "connect_q3").rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert not leaked, f"the S3 secret key is written in {leaked}"


def pyarrow_selector(prefix: str):
    """Every object below ``prefix`` (bucket/key), recursively."""
    from pyarrow.fs import FileSelector

    return FileSelector(prefix, recursive=True)


def test_the_endpoint_gives_one_winner_to_racing_conditional_creates():
    """What a store on S3 relies on (docs/store.md): of racing `If-None-Match: *` writers exactly one wins."""
    from concurrent.futures import ThreadPoolExecutor

    import botocore.exceptions

    server = services.s3()
    server.create_bucket("claims")
    client = server.client()

    def put(i: int) -> int:
        try:
            client.put_object(Bucket="claims", Key="subtask=0/admitted.json", Body=str(i).encode(), IfNoneMatch="*")
            return 200
        except botocore.exceptions.ClientError as exc:
            return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])

    with ThreadPoolExecutor(32) as pool:
        codes = list(pool.map(put, range(64)))
    assert sorted(set(codes)) == [200, 412] and codes.count(200) == 1, codes
    winner = client.get_object(Bucket="claims", Key="subtask=0/admitted.json")["Body"].read().decode()
    assert codes[int(winner)] == 200


def test_racing_conditional_creates_stay_exclusive_when_the_server_switches_threads_often(monkeypatch):
    """moto alone checks If-None-Match and stores later, unlocked: with threads switching every microsecond
    two racers could both win. The suite's endpoint (devtools/moto_s3.py) serializes puts, as S3 is atomic."""
    from concurrent.futures import ThreadPoolExecutor

    import botocore.exceptions

    from airflow_provider_speculative.devtools.moto_s3 import SWITCH_INTERVAL_ENV

    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "0.000001")
    server = services_module.start_s3()
    try:
        server.create_bucket("claims")
        client = server.client()

        def put(args: tuple[int, int]) -> int:
            round_, i = args
            try:
                client.put_object(Bucket="claims", Key=f"r{round_}/admitted.json", Body=str(i).encode(),
                                  IfNoneMatch="*")
                return 200
            except botocore.exceptions.ClientError as exc:
                return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])

        with ThreadPoolExecutor(32) as pool:
            for round_ in range(20):
                codes = list(pool.map(put, [(round_, i) for i in range(32)]))
                assert codes.count(200) == 1 and set(codes) <= {200, 412}, (round_, codes)
    finally:
        server.stop()
