"""Throw-away PostgreSQL, Redis and S3 servers on free loopback ports, for the tests, `make ui`, `make run` and bench/.

Nothing here assumes a server that already runs, nor a port: each ``start_*`` call initialises a private
data directory, starts the server bound to 127.0.0.1 on a port the kernel just handed out, waits until it
answers, and returns a handle whose ``stop()`` ends it and removes the directory. The binaries come from the
operating system's packages (Debian: ``postgresql``, ``redis-server``; `make services` installs them where
they are missing). PostgreSQL refuses to run as root, so under root the server runs as the ``postgres``
user (or ``nobody``) through ``runuser``, in a directory that user owns.

Durability is switched off (``fsync``, ``full_page_writes``, ``synchronous_commit``; Redis without RDB or
AOF): these servers hold test and demo data that is thrown away with them, and start and run faster so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_speculative.exceptions import SpeculativeError

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 60.0
# Airflow's components, LocalExecutor workers and Celery workers of one deployment each hold a few connections.
PG_MAX_CONNECTIONS = 300
PG_SUPERUSER = "postgres"


class ServiceUnavailable(SpeculativeError):
    """A server the suite or a make target needs cannot be started here (the message says what to install)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _wait_listening(proc: subprocess.Popen[bytes], port: int, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceUnavailable(f"{what} exited with {proc.returncode} before it listened on "
                                     f"{LOOPBACK}:{port}:\n{_tail(log)}")
        if _accepts(port):
            return
        time.sleep(0.05)
    _kill(proc)
    raise ServiceUnavailable(f"{what} did not listen on {LOOPBACK}:{port} within {timeout:.0f} s:\n{_tail(log)}")


def _launch(argv: list[str], directory: Path, log: Path, port: int, what: str,
            timeout: float) -> subprocess.Popen[bytes]:
    """Start a server in its own session, logging to ``log``, and wait until it listens on ``port``."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=directory)
    _wait_listening(proc, port, what, log, timeout)
    return proc


def _kill(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the server's process group (a fast shutdown for both servers), SIGKILL it after ``grace``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@dataclass
class _Server:
    """A server process this module started, with the directory it owns."""

    port: int
    directory: Path
    proc: subprocess.Popen[bytes]

    @property
    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        _kill(self.proc)
        shutil.rmtree(self.directory, ignore_errors=True)


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """The directory of ``initdb`` and ``postgres``: $SPECULATIVE_PG_BIN, else PATH, else Debian's newest."""
    configured = os.environ.get("SPECULATIVE_PG_BIN")
    if configured:
        return Path(configured)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def _server_user() -> str | None:
    """Under root, the unprivileged user PostgreSQL runs as (it refuses root); None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ServiceUnavailable("PostgreSQL refuses to run as root and neither a 'postgres' nor a 'nobody' user exists")


@dataclass
class PostgresServer(_Server):
    """A running throw-away PostgreSQL: trust authentication for ``postgres`` on ``127.0.0.1:port``."""

    host: str = LOOPBACK
    user: str = PG_SUPERUSER

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for ``dbname``."""
        return f"host={self.host} port={self.port} dbname={dbname} user={self.user}"

    def url(self, dbname: str, scheme: str = "postgresql+psycopg2") -> str:
        """A SQLAlchemy (or, with ``scheme='postgresql'``, an Airflow connection) URL for ``dbname``."""
        return f"{scheme}://{self.user}@{self.host}:{self.port}/{dbname}"

    def create_database(self, dbname: str) -> None:
        """``CREATE DATABASE dbname`` (a fresh, empty database)."""
        self._admin(f'CREATE DATABASE "{dbname}"')

    def drop_database(self, dbname: str) -> None:
        """Drop ``dbname``, closing the connections a killed component left open."""
        self._admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.dsn(), connect_timeout=5)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()


def start_postgres(port: int | None = None, timeout: float = START_TIMEOUT) -> PostgresServer:
    """Initialise a private cluster in a new temporary directory and start it on ``port`` (a free one if None)."""
    bindir = postgres_bin()
    if bindir is None or not (bindir / "initdb").exists() or not (bindir / "postgres").exists():
        raise ServiceUnavailable(
            "PostgreSQL's server binaries (initdb, postgres) were not found on PATH, under /usr/lib/postgresql/*/bin "
            "or at $SPECULATIVE_PG_BIN: `make services` installs Debian's postgresql (as root), or install your "
            "distribution's PostgreSQL server package")
    user = _server_user()
    directory = Path(tempfile.mkdtemp(prefix="speculative-pg-"))
    data, log = directory / "data", directory / "postgres.log"
    as_user = ["runuser", "-u", user, "--"] if user else []
    if user:
        # The directory must be the server user's own; mkdtemp made it 0700 for root.
        info = pwd.getpwnam(user)
        os.chown(directory, info.pw_uid, info.pw_gid)
    try:
        init = subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", PG_SUPERUSER,
                               "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
                              capture_output=True, text=True, timeout=120, cwd=directory)
        if init.returncode != 0:
            raise ServiceUnavailable(f"initdb failed ({init.returncode}): {init.stderr.strip()[-2000:]}")
        port = port or free_port()
        argv = [*as_user, str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(directory),
                "-c", f"listen_addresses={LOOPBACK}", "-c", f"max_connections={PG_MAX_CONNECTIONS}",
                "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]
        proc = _launch(argv, directory, log, port, "PostgreSQL", timeout)
        _wait_accepting_sessions(bindir, proc, port, log, timeout)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return PostgresServer(port=port, directory=directory, proc=proc)


def _wait_accepting_sessions(bindir: Path, proc: subprocess.Popen[bytes], port: int, log: Path,
                             timeout: float) -> None:
    """Wait until PostgreSQL accepts sessions, not only connections (``pg_isready`` exits 0 then).

    It listens while it still answers "the database system is starting up", and a client connecting
    in that window fails.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceUnavailable(f"PostgreSQL exited with {proc.returncode} while starting:\n{_tail(log)}")
        ready = subprocess.run([str(bindir / "pg_isready"), "-q", "-h", LOOPBACK, "-p", str(port),
                                "-U", PG_SUPERUSER, "-t", "2"], capture_output=True, timeout=30)
        if ready.returncode == 0:
            return
        time.sleep(0.05)
    _kill(proc)
    raise ServiceUnavailable(f"PostgreSQL listened on {LOOPBACK}:{port} but did not accept sessions within "
                             f"{timeout:.0f} s:\n{_tail(log)}")


# -- Redis --------------------------------------------------------------------------------------


@dataclass
class RedisServer(_Server):
    """A running throw-away Redis on ``127.0.0.1:port`` (no persistence, no password)."""

    host: str = LOOPBACK

    def url(self, db: int = 0, host: str | None = None) -> str:
        """A ``redis://`` URL for database ``db`` (``host`` overrides the address, e.g. a bridge's)."""
        return f"redis://{host or self.host}:{self.port}/{db}"


def start_redis(port: int | None = None, timeout: float = START_TIMEOUT) -> RedisServer:
    """Start ``redis-server`` on ``port`` (a free one if None), bound to 127.0.0.1, persisting nothing."""
    binary = os.environ.get("SPECULATIVE_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        raise ServiceUnavailable("redis-server was not found on PATH or at $SPECULATIVE_REDIS_SERVER: `make services` "
                                 "installs Debian's redis-server (as root), or install your distribution's package")
    directory = Path(tempfile.mkdtemp(prefix="speculative-redis-"))
    log = directory / "redis.log"
    port = port or free_port()
    argv = [binary, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--daemonize", "no", "--protected-mode", "no"]
    try:
        proc = _launch(argv, directory, log, port, "redis-server", timeout)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return RedisServer(port=port, directory=directory, proc=proc)


# -- S3 ------------------------------------------------------------------------------------------


_WARM_KEY = ".speculative-warm"


@dataclass
class S3Server(_Server):
    """A running throw-away S3 endpoint (moto's server, or SeaweedFS's) on ``127.0.0.1:port`` with its own keys.

    moto keeps objects in memory and implements S3's conditional create (``If-None-Match: *``: one
    writer of a key wins, the others get 412), which is what a store on object storage relies on.
    SeaweedFS (``kind="seaweedfs"``, for the benchmarks) is compiled and keeps objects in the directory.
    """

    access_key: str = ""
    secret_key: str = ""
    host: str = LOOPBACK
    region: str = "us-east-1"
    stop_grace: float = 10.0
    # SeaweedFS grows a bucket's volumes on its first object write (0.2 s here, against 4 ms for the next):
    # create_bucket writes and deletes a probe then, so that wait is not in the first write a benchmark times.
    warm_buckets: bool = False
    # Files the server makes outside its directory (SeaweedFS's gRPC sockets in /tmp), removed on stop.
    outside_files: tuple[Path, ...] = ()

    def stop(self) -> None:
        """Stop the server and remove its directory and the files it made elsewhere."""
        _kill(self.proc, self.stop_grace)
        for path in self.outside_files:
            path.unlink(missing_ok=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:port``."""
        return f"http://{self.host}:{self.port}"

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point a client (boto3, pyarrow, Spark's s3a) at this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL_S3": self.endpoint_url, "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region}

    def client(self) -> object:
        """A boto3 S3 client for this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (an existing one is kept)."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
        except client.exceptions.BucketAlreadyOwnedByYou:  # type: ignore[attr-defined]
            pass
        if self.warm_buckets:
            client.put_object(Bucket=name, Key=_WARM_KEY, Body=b"warm")  # type: ignore[attr-defined]
            client.delete_object(Bucket=name, Key=_WARM_KEY)  # type: ignore[attr-defined]

    def upload_tree(self, local: str | Path, bucket: str, prefix: str) -> int:
        """Upload every file under ``local`` to ``s3://bucket/prefix/<relative path>``; returns the count."""
        client = self.client()
        count = 0
        for path in sorted(Path(local).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                key = f"{prefix.rstrip('/')}/{path.relative_to(local).as_posix()}"
                client.upload_file(str(path), bucket, key)  # type: ignore[attr-defined]
                count += 1
        return count


S3_KINDS = ("moto", "seaweedfs")
# The benchmarks' compiled endpoint: SeaweedFS's ``weed``, which `make s3-compiled` builds into .tools/bin.
WEED_ENV = "SPECULATIVE_WEED"
_REPO = Path(__file__).resolve().parents[2]
# The identity the benchmark's clients sign as; SeaweedFS grants these actions on every bucket.
_SEAWEEDFS_ACTIONS = ("Admin", "Read", "List", "Tagging", "Write")
# The ports ``weed server`` listens on, each given a free loopback port (its defaults are fixed and public).
_SEAWEEDFS_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                    "filer.port.grpc", "s3.port", "s3.port.grpc")


def start_s3(port: int | None = None, timeout: float = START_TIMEOUT, kind: str = "moto") -> S3Server:
    """Start an S3 endpoint of ``kind`` (moto or seaweedfs) on ``port`` (a free one if None), on 127.0.0.1."""
    if kind == "moto":
        return _start_moto(port, timeout)
    if kind == "seaweedfs":
        return _start_seaweedfs(port, timeout)
    raise ValueError(f"unknown S3 endpoint kind {kind!r}: one of {', '.join(S3_KINDS)}")


def _random_keys() -> tuple[str, str]:
    import secrets

    # Random keys let a test prove that no secret reaches a file or a log.
    return "AKIA" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30)


def _start_moto(port: int | None, timeout: float) -> S3Server:
    """moto's S3 server (the suite's endpoint): objects in memory, any key pair accepted."""
    import importlib.util
    import sys

    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise ServiceUnavailable("moto's server is not installed in this Python: pip install 'moto[server]' "
                                 "(the provider's [test] extra has it)")
    directory = Path(tempfile.mkdtemp(prefix="speculative-s3-"))
    log = directory / "s3.log"
    port = port or free_port()
    # moto's server through a wrapper that makes its conditional writes atomic, reads only the range of a ranged
    # GET and logs no line per request unless SPECULATIVE_MOTO_REQUEST_LOG=1 (devtools/moto_s3.py).
    argv = [sys.executable, "-m", "airflow_provider_speculative.devtools.moto_s3", "-H", LOOPBACK, "-p", str(port)]
    try:
        proc = _launch(argv, directory, log, port, "moto S3 server", timeout)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    access_key, secret_key = _random_keys()
    return S3Server(port=port, directory=directory, proc=proc, access_key=access_key, secret_key=secret_key)


def weed_binary() -> Path:
    """Where SeaweedFS's ``weed`` is expected: $SPECULATIVE_WEED, else .tools/bin/weed of the checkout."""
    configured = os.environ.get(WEED_ENV)
    return Path(configured) if configured else _REPO / ".tools" / "bin" / "weed"


def seaweedfs_config(access_key: str, secret_key: str) -> dict[str, object]:
    """SeaweedFS's ``-s3.config`` document: one identity with the key pair, allowed every action."""
    return {"identities": [{"name": "speculative",
                            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": list(_SEAWEEDFS_ACTIONS)}]}


def write_seaweedfs_config(directory: Path, access_key: str, secret_key: str) -> Path:
    """Write the ``-s3.config`` JSON into ``directory``, readable by its owner only (it holds the secret)."""
    import json

    # Not a .json name: those are the store's files (tests/unit/test_contracts.py); weed parses it as JSON anyway.
    path = directory / "s3-identities.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(seaweedfs_config(access_key, secret_key), out)
    return path


def seaweedfs_argv(binary: Path, directory: Path, config: Path, ports: dict[str, int]) -> list[str]:
    """``weed server`` with master, volume, filer and S3 in one process, every listener on loopback.

    The keys stay in ``config`` (never on the command line, which ``ps`` shows). Iceberg and Lance
    catalogs are off, the volume server stops without its default 10 s heartbeat drain, volumes are
    1 GiB (not 30) so the data directory stays small, and nothing is reported to SeaweedFS's telemetry.
    """
    return [str(binary), "server", f"-dir={directory / 'data'}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
            *(f"-{name}={ports[name]}" for name in _SEAWEEDFS_PORTS),
            "-filer", "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={directory / 'filer.sock'}", f"-s3.localSocket={directory / 's3.sock'}",
            "-master.telemetry=false", "-master.volumeSizeLimitMB=1024", "-volume.max=0",
            "-volume.preStopSeconds=0"]


def seaweedfs_sockets(ports: dict[str, int]) -> tuple[Path, ...]:
    """The Unix sockets ``weed server`` binds beside its gRPC ports, at paths it fixes under /tmp."""
    return tuple(Path(f"/tmp/seaweedfs-{name}-grpc-{ports[f'{name}.port.grpc']}.sock")
                 for name in ("master", "volume", "filer", "s3"))


def _start_seaweedfs(port: int | None, timeout: float) -> S3Server:
    """SeaweedFS's ``weed server`` with its S3 gateway: the benchmarks' compiled endpoint."""
    binary = weed_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise ServiceUnavailable(f"SeaweedFS's weed binary was not found at {binary}: `make s3-compiled` builds it "
                                 f"(Go and the Go module proxy needed), or set ${WEED_ENV} to one")
    directory = Path(tempfile.mkdtemp(prefix="speculative-s3-"))
    (directory / "data").mkdir()
    log = directory / "s3.log"
    access_key, secret_key = _random_keys()
    ports = {name: free_port() for name in _SEAWEEDFS_PORTS}
    if port:
        ports["s3.port"] = port
    port = ports["s3.port"]
    try:
        config = write_seaweedfs_config(directory, access_key, secret_key)
        argv = seaweedfs_argv(binary, directory, config, ports)
        proc = _launch(argv, directory, log, port, "SeaweedFS S3 server", timeout)
        # A graceful stop takes SeaweedFS about 15 s; its data is thrown away, so a kill soon after loses nothing.
        server = S3Server(port=port, directory=directory, proc=proc, access_key=access_key, secret_key=secret_key,
                          stop_grace=2.0, outside_files=seaweedfs_sockets(ports), warm_buckets=True)
        _wait_writable(server, log, timeout)
    except BaseException:
        if "proc" in locals():
            _kill(proc, 2.0)
        for path in seaweedfs_sockets(ports):
            path.unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return server


def _wait_writable(server: S3Server, log: Path, timeout: float) -> None:
    """Wait until an object can be written: SeaweedFS's S3 port listens before its filer and volumes serve."""
    import boto3
    import botocore.config
    import botocore.exceptions

    # Quick failures: the loop retries, and boto3's own retries would outlast the deadline.
    client = boto3.client(
        "s3", endpoint_url=server.endpoint_url, region_name=server.region, aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=botocore.config.Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10))
    bucket = "speculative-probe"
    deadline = time.monotonic() + timeout
    problem = ""
    while time.monotonic() < deadline:
        if not server.alive:
            raise ServiceUnavailable(f"SeaweedFS exited with {server.proc.returncode} while starting:\n{_tail(log)}")
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="probe", Body=b"probe")
            client.delete_object(Bucket=bucket, Key="probe")
            client.delete_bucket(Bucket=bucket)
            return
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            problem = str(exc)
            time.sleep(0.2)
    raise ServiceUnavailable(f"SeaweedFS's S3 gateway did not accept a write within {timeout:.0f} s ({problem}):\n"
                             f"{_tail(log)}")
