"""Spark Connect backend: every attempt is a small Python client of a warm, shared Spark Connect server.

An attempt costs a Python start and a gRPC session (~2 s) instead of a driver JVM (12-17 s). The
client still runs under the detached supervisor (so polling, logs and restart-safety are those of
:class:`SupervisedBackend`), but its Spark work runs in the *server*, in a session of its own:

* At launch the backend picks a fresh ``session_id`` (uuid4) for the attempt, keeps the connection's
  ``user_id`` (or uses :data:`DEFAULT_USER_ID`) and records both in ``connect.json`` next to the
  attempt's status (never the token). ``SPECULATIVE_SPARK_REMOTE`` carries the full URL to the client.
* Killing a client does NOT stop its query: the server keeps a reattachable execution running for
  minutes. So cancel interrupts the session's operations on the server first, through the same
  ``user_id`` and ``session_id`` (any other id silently addresses a new, empty session), then ends
  the client like the base class. :meth:`reap` only reports the attempt gone once the client's
  process group is gone *and* the server reports no running operation of the session; then it
  releases the session, so nothing can ever run in it again (a straggling client gets
  ``INVALID_HANDLE.SESSION_CLOSED``). Every step is recorded in ``connect-cancel.json``, so a
  restarted controller continues where the previous one stopped.
* Every RPC has a deadline (:data:`RPC_TIMEOUT`): the controller runs in the triggerer. An
  unreachable server is recorded (``connect-cancel.json`` and the journal) and retried on each reap
  until :data:`UNREACHABLE_GIVE_UP` seconds after the cancel; then the attempt counts as gone (the
  client is dead; if the server is down its work died with it, if it is only unreachable from the
  triggerer its orphaned query ends on its own and its late files are the ``gc`` command's).
* Before any RPC the server's port is probed (:data:`PROBE_TIMEOUT`): a host that does not answer
  costs the controller that short probe, not an RPC deadline per attempt and step (a partitioned
  host with many attempts would otherwise stall the controller for minutes). A port that *refuses*
  the connection on a host that answers has no server: the session and its queries died with the
  server's process, so there is nothing to interrupt or release and the attempt is gone at once
  (``server_gone_at``) instead of after :data:`UNREACHABLE_GIVE_UP`. (A firewall rejecting with a
  TCP reset looks the same; the server's safety net then ends the orphaned query, as after a give-up.)
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from typing import Any, ClassVar
from urllib.parse import quote, unquote, urlparse

from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.backends.supervised import SupervisedBackend
from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.layout import StageLayout

DEFAULT_USER_ID = "speculative"
RPC_TIMEOUT = 5.0
UNREACHABLE_GIVE_UP = 60.0
PROBE_TIMEOUT = 0.5
# The cancel states after which nothing of the session can run on the server any more.
_FINISHED = ("released_at", "gave_up_at", "server_gone_at")
# Parameters of an sc:// URL the backend owns per attempt; the connection's others are kept.
_SESSION_PARAMS = ("session_id",)


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """``sc://host:port/;a=1;b=2`` -> (``sc://host:port/``, {a: 1, b: 2}) with values unquoted."""
    base, _, params = url.partition(";")
    if not base.endswith("/"):
        base += "/"
    out: dict[str, str] = {}
    for item in filter(None, params.split(";")):
        key, _, value = item.partition("=")
        out[key.strip()] = unquote(value)
    return base, out


def compose_url(base_url: str, *, session_id: str, user_id: str | None = None) -> str:
    """The attempt's URL: the connection's URL with its own ``session_id`` (and ``user_id`` if it has none).

    A ``session_id`` already in the connection is replaced: attempts must never share a session.
    """
    base, params = split_url(base_url)
    for key in _SESSION_PARAMS:
        params.pop(key, None)
    if user_id and not params.get("user_id"):
        params["user_id"] = user_id
    params["session_id"] = session_id
    return base + ";" + ";".join(f"{k}={quote(v, safe='')}" for k, v in params.items())


def public_url(url: str) -> str:
    """The URL without secrets (what may be written to the store): base plus ``user_id`` and ``use_ssl``."""
    base, params = split_url(url)
    kept = {k: v for k, v in params.items() if k in ("user_id", "use_ssl")}
    return base + (";" + ";".join(f"{k}={quote(v, safe='')}" for k, v in kept.items()) if kept else "")


class ConnectSession:
    """Bounded-time RPCs on one server-side session (Interrupt, GetStatus, ReleaseSession) with the raw stub.

    The pyspark client retries for minutes on an unreachable server; the controller cannot wait that
    long, so each call here is a single RPC with a deadline.
    """

    def __init__(self, url: str, timeout: float = RPC_TIMEOUT) -> None:
        from pyspark.sql.connect.client.core import DefaultChannelBuilder
        from pyspark.sql.connect.proto import base_pb2_grpc

        self.builder = DefaultChannelBuilder(url)
        self.session_id = self.builder.session_id
        self.user_id = self.builder.userId
        self.timeout = timeout
        self.channel = self.builder.toChannel()
        self.stub = base_pb2_grpc.SparkConnectServiceStub(self.channel)

    def __enter__(self) -> ConnectSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def _fill(self, req: Any) -> Any:
        req.session_id = self.session_id
        req.client_type = "airflow-provider-speculative"
        if self.user_id:
            req.user_context.user_id = self.user_id
        return req

    def interrupt_all(self) -> list[str]:
        """Interrupt every operation of the session; the ids of those interrupted."""
        from pyspark.sql.connect.proto import base_pb2 as pb2

        req = self._fill(pb2.InterruptRequest())
        req.interrupt_type = pb2.InterruptRequest.InterruptType.INTERRUPT_TYPE_ALL
        resp = self.stub.Interrupt(req, metadata=self.builder.metadata(), timeout=self.timeout)
        return list(resp.interrupted_ids)

    def running_operations(self) -> list[str]:
        """Operations of the session the server still reports running or terminating."""
        from pyspark.sql.connect.proto import base_pb2 as pb2

        req = self._fill(pb2.GetStatusRequest())
        req.operation_status.SetInParent()
        resp = self.stub.GetStatus(req, metadata=self.builder.metadata(), timeout=self.timeout)
        states = pb2.GetStatusResponse.OperationStatus
        live = (states.OPERATION_STATE_RUNNING, states.OPERATION_STATE_TERMINATING)
        return [s.operation_id for s in resp.operation_statuses if s.state in live]

    def run_sql(self, query: str) -> None:
        """Run ``query`` in the session and read its whole answer (one RPC, with the deadline)."""
        from pyspark.sql.connect.proto import base_pb2 as pb2

        req = self._fill(pb2.ExecutePlanRequest())
        req.plan.root.sql.query = query
        for _ in self.stub.ExecutePlan(req, metadata=self.builder.metadata(), timeout=self.timeout):
            pass

    def release(self) -> None:
        """Close the session on the server: it can never run anything again."""
        from pyspark.sql.connect.proto import base_pb2 as pb2

        req = self._fill(pb2.ReleaseSessionRequest())
        self.stub.ReleaseSession(req, metadata=self.builder.metadata(), timeout=self.timeout)


# The speed check (control/speedcheck.py): CPU work in the server's codegen'd pipeline, one task, a
# small answer; 0.2-0.26 s (median) on an idle 1-core server in a warm session, so its time is the
# server's speed, not the network's. Its CPU must span several kernel quota periods (CFS: 100 ms, as
# Kubernetes CPU limits use): a query of 10M rows needed so little that a throttled server could
# answer in 1.66-1.97x the fastest (4 of 40 slow rows of the slow-node benchmark), under the 2x that
# counts as slow; with 30M rows it was found in 32 of 32. 30M rows cost 0.045 s more on a healthy
# server alone on the host.
SPEED_CHECK_QUERY = "SELECT sum(hash(id)) FROM range(0, 30000000, 1, 1)"
# One check session per connection URL and process (kept in memory only: the URL may hold a token).
# A fresh session's first query costs 0.1-0.4 s, varying by 2x between idle servers; a warm session's
# by 1.4x. The server drops it when idle (spark.connect.session.manager.defaultSessionTimeout);
# nothing runs in it between checks.
_CHECK_SESSIONS: dict[str, _CheckSession] = {}
_CHECK_LOCK = threading.Lock()


class _CheckSession:
    """A check session of this process, its open channel, and whether its untimed first query ran (``warm``)."""

    def __init__(self) -> None:
        self.session_id = str(uuid.uuid4())
        self.warm = threading.Event()
        self.failed = False
        # Kept open: a timed query on a new channel would count the connection's handshake as slowness.
        self.channel: ConnectSession | None = None


def _warm_up(url: str, entry: _CheckSession, timeout: float) -> None:
    """Open ``entry``'s session and run its untimed first query; forget the session if that fails."""
    try:
        entry.channel = ConnectSession(compose_url(url, session_id=entry.session_id, user_id=DEFAULT_USER_ID),
                                       timeout=timeout)
        entry.channel.run_sql(SPEED_CHECK_QUERY)
    except Exception:
        entry.failed = True
        _forget(url, entry)
        raise
    finally:
        entry.warm.set()


def _forget(url: str, entry: _CheckSession) -> None:
    with _CHECK_LOCK:
        if _CHECK_SESSIONS.get(url) is entry:
            del _CHECK_SESSIONS[url]  # closed, expired or broken: the next check starts a new one
    if entry.channel is not None:
        with contextlib.suppress(Exception):
            entry.channel.channel.close()


def prepare_speed_check(url: str, timeout: float = 2 * RPC_TIMEOUT) -> None:
    """Warm this process's check session on ``url`` in a background thread, unless one exists or is warming.

    The session's set-up and first query then overlap the stage's planning instead of delaying its first
    wave; :func:`speed_check` waits for a warm-up still running rather than starting a second one.
    """
    with _CHECK_LOCK:
        if url in _CHECK_SESSIONS:
            return
        entry = _CHECK_SESSIONS[url] = _CheckSession()

    def run() -> None:
        # A server that cannot answer now is reported by the check itself, which starts a new session.
        with contextlib.suppress(Exception):
            _warm_up(url, entry, timeout)

    threading.Thread(target=run, name="speed-check-warm-up", daemon=True).start()


def speed_check(url: str, timeout: float = 2 * RPC_TIMEOUT, retry: bool = True) -> float:
    """Seconds the server at ``url`` takes for :data:`SPEED_CHECK_QUERY` in this process's check session.

    A session new to this process runs the query once untimed first (its set-up is noise, not speed); a
    warm-up started by :func:`prepare_speed_check` is waited for instead. A session the server closed (idle
    timeout) or a warm-up that failed is replaced and the check tried once more.
    """
    with _CHECK_LOCK:
        entry = _CHECK_SESSIONS.get(url)
        fresh = entry is None
        if entry is None:
            entry = _CHECK_SESSIONS[url] = _CheckSession()
    if fresh:
        _warm_up(url, entry, timeout)
    elif not entry.warm.wait(timeout) or entry.failed:
        _forget(url, entry)
        if retry:
            return speed_check(url, timeout, retry=False)
        raise TimeoutError(f"the speed check session on {public_url(url)} did not start within {timeout:g}s")
    assert entry.channel is not None
    try:
        started = time.monotonic()
        entry.channel.run_sql(SPEED_CHECK_QUERY)
        return time.monotonic() - started
    except Exception as exc:
        _forget(url, entry)
        if retry and session_closed(exc):
            return speed_check(url, timeout, retry=False)
        raise


def probe_server(url: str, timeout: float = PROBE_TIMEOUT) -> tuple[str, str] | None:
    """None if the ``sc://`` URL's port accepts a connection, else ("refused" | "unreachable", why)."""
    parsed = urlparse(split_url(url)[0].replace("sc://", "http://", 1))
    address = (parsed.hostname or "", parsed.port or 15002)
    try:
        with socket.create_connection(address, timeout=timeout):
            return None
    except ConnectionRefusedError as exc:
        return "refused", f"{address[0]}:{address[1]} refused the connection ({exc})"
    except OSError as exc:
        return "unreachable", f"{address[0]}:{address[1]} does not answer ({type(exc).__name__}: {exc})"


def session_closed(exc: BaseException) -> bool:
    """True if the server answered that the session is already released (a cancel done before)."""
    return "SESSION_CLOSED" in str(exc)


class SparkConnectBackend(SupervisedBackend):
    """Attempts as Spark Connect clients of a shared server, each in its own session."""

    kind: ClassVar[str] = "spark_connect"

    def __init__(self, layout: StageLayout, kill_grace: float = 5.0, env: dict[str, str] | None = None) -> None:
        super().__init__(layout, kill_grace)
        # The target's URL as the trigger resolved it (may hold a token): kept in memory only.
        self.remote = (env or {}).get(REMOTE_ENV)

    def connect_record(self, subtask: int, attempt: int) -> dict[str, Any] | None:
        """The attempt's recorded session (``server``, ``user_id``, ``session_id``), if it was launched here."""
        return self.layout.read_json(self.layout.connect(subtask, attempt))

    def launch(self, spec: LaunchSpec) -> None:
        """Give the attempt its own session on the server, record it, then start the client supervised."""
        remote = spec.env.get(REMOTE_ENV) or self.remote
        if not remote:
            raise RuntimeError(f"target {spec.target!r} is a Spark Connect target but no server URL was passed "
                               f"({REMOTE_ENV} is unset): the trigger resolves it from the target's connection")
        self.remote = self.remote or remote
        session_id = str(uuid.uuid4())
        url = compose_url(remote, session_id=session_id, user_id=DEFAULT_USER_ID)
        _, params = split_url(url)
        self.layout.replace_json(self.layout.connect(spec.subtask, spec.attempt),
                                 {"server": public_url(url), "user_id": params["user_id"], "session_id": session_id,
                                  "at": time.time()})
        super().launch(LaunchSpec(spec.subtask, spec.attempt, spec.target, spec.node, spec.speculative,
                                  spec.command, {**spec.env, REMOTE_ENV: url}))

    def _session_url(self, record: dict[str, Any]) -> str:
        # The in-memory URL carries the token; after a restart without it, the recorded one (no token).
        return compose_url(self.remote or record["server"], session_id=record["session_id"],
                           user_id=record["user_id"])

    def cancel(self, subtask: int, attempt: int, reason: str) -> None:
        """Record the cancel, interrupt the session's work on the server, then end the client."""
        path = self.layout.cancel(subtask, attempt)
        if self.layout.read_json(path) is None:
            # First, so that a client dying of the interrupt is classified as cancelled, not failed.
            self.layout.replace_json(path, {"reason": reason, "at": time.time()})
        record = self.connect_record(subtask, attempt)
        if record is not None and not (self._cancel_state(subtask, attempt).get("interrupted_at")):
            self._server_step(subtask, attempt, record, release=False)
        super().cancel(subtask, attempt, reason)

    def reap(self, subtask: int, attempt: int, now: float | None = None) -> bool:
        """True once the client's group is gone and the server runs nothing of the session (then released)."""
        now = time.time() if now is None else now
        client_gone = super().reap(subtask, attempt, now)
        record = self.connect_record(subtask, attempt)
        if record is None:
            return client_gone
        state = self._cancel_state(subtask, attempt)
        if any(state.get(key) for key in _FINISHED):
            return client_gone
        if not client_gone:
            # A live client could still start operations; interrupt (again) only once it is gone.
            return False
        return self._server_step(subtask, attempt, record, release=True, now=now)

    def cleanup_pending(self, subtask: int, attempt: int) -> bool:
        """True if the attempt was cancelled but its session on the server is not released yet.

        A controller restarted after the client died (but before the release) keeps reaping it.
        """
        if self.connect_record(subtask, attempt) is None:
            return False
        state = self._cancel_state(subtask, attempt)
        return not any(state.get(key) for key in _FINISHED)

    def _cancel_state(self, subtask: int, attempt: int) -> dict[str, Any]:
        return self.layout.read_json(self.layout.connect_cancel(subtask, attempt)) or {}

    def _server_step(self, subtask: int, attempt: int, record: dict[str, Any], *, release: bool,
                     now: float | None = None) -> bool:
        """Interrupt the session's running operations; with ``release``, close it once nothing runs.

        Returns True when the server runs nothing of the session any more (or the server stayed
        unreachable past :data:`UNREACHABLE_GIVE_UP`).
        """
        now = time.time() if now is None else now
        path = self.layout.connect_cancel(subtask, attempt)
        state = self.layout.read_json(path) or {"server": record["server"], "user_id": record["user_id"],
                                    "session_id": record["session_id"], "started_at": now, "interrupted": []}
        done = False
        try:
            down = probe_server(self._session_url(record))
            if down is not None and down[0] == "refused":
                # No server on that port: the session and its queries ended with the server's process.
                state.update(server_gone_at=state.get("server_gone_at") or time.time(), running=[],
                             error=down[1])
                journal.record_stage(self.layout, Event.CONNECT_SERVER_GONE, subtask=subtask, attempt=attempt,
                               server=record["server"], error=down[1])
                self.layout.replace_json(path, state)
                return True
            if down is not None:
                raise ConnectionError(down[1])  # as an RPC to it would, without its deadline
            with ConnectSession(self._session_url(record)) as session:
                ids = session.interrupt_all()
                state["interrupted"] = sorted(set(state.get("interrupted") or []) | set(ids))
                state["interrupted_at"] = state.get("interrupted_at") or time.time()
                if release:
                    running = session.running_operations()
                    state["running"] = running
                    if not running:
                        session.release()
                        state["released_at"] = time.time()
                        done = True
            state.pop("error", None)
        except Exception as exc:
            if session_closed(exc):
                # Released by an earlier cancel (another controller): nothing can run in it.
                state.update(released_at=state.get("released_at") or time.time(), running=[])
                state.pop("error", None)
                done = True
            else:
                first = state.get("error") is None
                state["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                state["errors"] = int(state.get("errors") or 0) + 1
                if first:
                    journal.record_stage(self.layout, Event.CONNECT_UNREACHABLE, subtask=subtask, attempt=attempt,
                                   server=record["server"], error=state["error"])
                if release and now - float(state.get("started_at") or now) >= UNREACHABLE_GIVE_UP:
                    state["gave_up_at"] = time.time()
                    journal.record_stage(self.layout, Event.CONNECT_CANCEL_GAVE_UP, subtask=subtask, attempt=attempt,
                                   server=record["server"], error=state["error"])
                    done = True
        self.layout.replace_json(path, state)
        return done
