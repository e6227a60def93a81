"""Supervised attempts: a detached supervisor process per attempt runs its command; state lives in the store.

The supervisor records pid, host, timestamps and the exit code in ``status.json`` and refreshes
``alive_at`` while the command runs. The controller decides liveness from the pid when the
supervisor runs on its own host, and from ``alive_at`` when it runs elsewhere (an HA triggerer on
another machine took the trigger over): nothing here assumes the attempt is a local process.

Every document of the store (claim, status, heartbeat, cancel, admission) is read and written by name through
``layout.store``. What must be local stays out of the store: on a store without paths (S3) the supervisor's log is
written in a local working directory for the attempt (:func:`local_attempt_dir`, under ``$AIRFLOW_HOME`` or the
temporary directory) and uploaded to the attempt's ``spark-submit.log`` name when the attempt ends; the pid and the
process group are recorded in ``status.json`` as on POSIX.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import psutil

from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.backends.identity import same_process
from airflow_provider_speculative.core.contract import LAUNCHED_AT_ENV, inherited_env
from airflow_provider_speculative.core.states import (
    HEARTBEAT_STALE_AFTER,
    LIVE_PHASES,
    TERMINAL,
    Attempt,
    AttemptState,
    heartbeat_alive,
)
from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import (
    CANCEL_FILE,
    CLAIM_FILE,
    FAILURE_FILE,
    HEARTBEAT_FILE,
    INVALIDATED_FILE,
    LOG_FILE,
    STATUS_FILE,
    RunNotOwnedError,
    StageLayout,
    local_attempt_dir,
)

log = logging.getLogger(__name__)

# A claim with no process after this long was lost between claim and launch (controller crash).
LAUNCH_LOST_AFTER = 60.0

_READER: ThreadPoolExecutor | None = None
_READER_LOCK = threading.Lock()


def _reader() -> ThreadPoolExecutor:
    """The threads an object store's polls read with: started on first use, by a controller (which never forks)."""
    global _READER
    with _READER_LOCK:
        if _READER is None:
            _READER = ThreadPoolExecutor(max_workers=8, thread_name_prefix="attempt-poll")
        return _READER
# A supervisor on another host that has not refreshed alive_at for this long is presumed dead.
REMOTE_ALIVE_TIMEOUT = 30.0
HOST = socket.gethostname()
# A pid verified against its create time is trusted, between signal-0 probes, for this long: reading
# /proc through psutil costs ~100 us, and a supervisor's pid cannot be reused while it still runs.
PID_REVERIFY = 30.0
_VERIFIED: dict[tuple[int, Any, Any], float] = {}
# The last status read per attempt directory, shared by every backend instance of the process (a
# controller's observer and its per-target backends): what probe() checks between full polls.
_SEEN: dict[str, dict[str, Any]] = {}
# core.states.TERMINAL as a tuple: a status.json's state may be any JSON value, and a tuple never hashes it.
_ENDED = tuple(TERMINAL)


class SupervisedBackend:
    """Launch, poll and kill the attempts of one stage run through detached supervisors."""

    kind: ClassVar[str] = "supervised"

    def __init__(self, layout: StageLayout, kill_grace: float = 5.0, env: dict[str, str] | None = None) -> None:
        # ``env``: the target's launch environment; only a backend that reaches its target outside an
        # attempt (a Connect cancel) keeps it.
        self.layout = layout
        self.kill_grace = kill_grace
        # Start supervisors through the per-host fork server (backends/forkserver.py): set from the
        # plan's fork_server option by create_backend.
        self.fork_server = False
        self._dirs: dict[tuple[int, int], str] = {}
        self._stage_dir: str | None = None
        # On a store without paths (S3): how much of an attempt's key string (below) precedes its store name.
        self._name_from: int | None = None

    def cleanup_pending(self, subtask: int, attempt: int) -> bool:
        """False: a supervised attempt leaves nothing to stop once its process group is gone."""
        return False

    def claim(self, subtask: int, attempt: int, record: dict[str, Any]) -> bool:
        """Atomically claim an attempt number; False if someone (a restarted controller) has it."""
        return self.layout.create_json(self.layout.claim(subtask, attempt), record)

    def launch(self, spec: LaunchSpec) -> None:
        """Start the supervisor detached, in its own session; return once its status is recorded."""
        layout = self.layout
        status = layout.status(spec.subtask, spec.attempt)
        manifest = layout.manifest(spec.subtask, spec.attempt)
        env = self.launch_env(spec)
        if isinstance(layout.store, PosixBackend):
            log = os.fspath(layout.log(spec.subtask, spec.attempt))
            args = ["--status", os.fspath(status), "--log", log, "--manifest", os.fspath(manifest)]
        else:
            # The store's URL and names only: its credentials reach the supervisor through its environment.
            local = local_attempt_dir(layout, spec.subtask, spec.attempt)
            local.mkdir(parents=True, exist_ok=True)
            log = os.fspath(local / LOG_FILE)
            args = ["--store", layout.store.url, "--status", layout.name(status), "--log", log,
                    "--log-name", layout.name(layout.log(spec.subtask, spec.attempt)),
                    "--manifest", layout.name(manifest)]
        args = [*args, "--daemonize", "--", *spec.command]
        code = self._launch_forked(spec, args, env, log) if self.fork_server else None
        if code is None:
            with open(log, "ab") as out:
                code = subprocess.call([sys.executable, "-m", "airflow_provider_speculative.backends.supervisor",
                                        *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, env=env, close_fds=True, timeout=60)
        if code != 0 or layout.read_json(status) is None:
            raise RuntimeError(f"could not start attempt {spec.attempt} of subtask {spec.subtask}: "
                               f"supervisor exited {code}; see {log}")

    def _launch_forked(self, spec: LaunchSpec, args: list[str], env: dict[str, str], log: str) -> int | None:
        """The supervisor's exit code through the fork server; None if it was not reached (start it directly)."""
        from airflow_provider_speculative.backends import forkserver

        try:
            return forkserver.launch(args, env, log)
        except forkserver.LaunchUnknown as exc:
            if self.layout.read_json(self.layout.status(spec.subtask, spec.attempt)) is not None:
                return 0  # the supervisor recorded itself before the server died: it runs
            # A supervisor forked just before the server died may still come up: the cancel stops it
            # within a second of its start, and the attempt is reported failed (never started twice).
            self.layout.replace_json(self.layout.cancel(spec.subtask, spec.attempt),
                                     {"reason": f"launch lost: {exc}", "at": time.time()})
            raise RuntimeError(f"could not start attempt {spec.attempt} of subtask {spec.subtask}: {exc}") from None

    def launch_env(self, spec: LaunchSpec) -> dict[str, str]:
        """The attempt's environment: the launcher's, the plan's, and what the runtime needs to know."""
        # The driver's Python must be the one with pyspark and this package: the launcher's own.
        # S3 credentials in ``spec.env`` (the stage's connection, or the target's own) replace the launcher's whole
        # AWS set (core/contract.py ``inherited_env``). Environment only: never argv, which ``ps`` shows.
        return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                **inherited_env(os.environ, spec.env), "SPECULATIVE_NODE": spec.node,
                LAUNCHED_AT_ENV: str(time.time())}

    def poll(self, subtask: int, attempt: int, now: float | None = None) -> Attempt:
        """Read one attempt's state from the store, checking that a live one's process still exists."""
        now = time.time() if now is None else now
        # Plain string paths: a tick may poll thousands of attempts, and pathlib costs more than the reads.
        base = self._dir(subtask, attempt)
        docs = self._read_together(base, (CLAIM_FILE, STATUS_FILE, HEARTBEAT_FILE, CANCEL_FILE))
        claim = docs[CLAIM_FILE] or {}
        status = docs[STATUS_FILE] or {}
        launch = status
        heartbeat = docs[HEARTBEAT_FILE] or {}
        cancel = docs[CANCEL_FILE]
        out = Attempt(subtask=subtask, number=attempt, target=claim.get("target", "?"),
                      speculative=bool(claim.get("speculative")), created_at=claim.get("created_at"),
                      node=heartbeat.get("node") or status.get("node") or claim.get("node"),
                      deploying_at=status.get("deploying_at"),
                      end_at=status.get("end_at"), exit_code=status.get("exit_code"), cause=status.get("cause"),
                      input_bytes=heartbeat.get("input_bytes"), app_id=heartbeat.get("app_id"),
                      launched_at=status.get("launched_at"), ready_at=heartbeat.get("session_ready_at"),
                      input_wait=float(heartbeat.get("input_wait") or 0.0),
                      waiting_since=heartbeat.get("waiting_since"),
                      progress={k: heartbeat[k] for k in ("tasks_done", "tasks_total", "bytes_read", "at", "reads")
                                if k in heartbeat})
        if len(_SEEN) > 100_000:
            _SEEN.clear()
        _SEEN[base] = launch
        state = status.get("state")
        invalidated = self._read(base, INVALIDATED_FILE)
        if invalidated is not None:
            # Withdrawn by a rerun or failover: history only, never admitted again.
            out.state, out.cause = AttemptState.CANCELED, f"invalidated: {invalidated.get('reason')}"
            return out
        if state in _ENDED:
            out.state = AttemptState(state)
            if state == AttemptState.FAILED and status.get("failure_kind") in ("partition", "node_lost"):
                out.failure = self._read(base, FAILURE_FILE) or {"kind": status["failure_kind"]}
            return out
        alive = self.attempt_alive(launch, heartbeat, now)
        if launch and not alive:
            out.state = AttemptState.CANCELED if cancel else AttemptState.FAILED
            out.end_at = out.end_at or now
            out.cause = out.cause or ("cancelled" if cancel else "attempt process disappeared (killed or crashed)")
            return out
        if cancel:
            out.state = AttemptState.CANCELING
        elif not launch:
            created = claim.get("created_at") or now
            out.state = AttemptState.FAILED if now - created > LAUNCH_LOST_AFTER else AttemptState.CREATED
            if out.state == AttemptState.FAILED:
                out.cause, out.end_at = "launch lost: claimed but never started", now
        elif heartbeat.get("phase") in LIVE_PHASES:
            out.state = AttemptState.RUNNING
        else:
            out.state = AttemptState.DEPLOYING
        return out

    def probe(self, subtask: int, attempt: int, now: float) -> bool:
        """A cheap check that a polled live attempt's process still exists (no file read on this host).

        False means "poll it now". On this host it is a signal-0 probe of the supervisor's pid (the pid is
        re-verified against its create time by every full poll); on another host, the supervisor's
        ``alive_at`` as last read.
        """
        launch = _SEEN.get(self._dir(subtask, attempt))
        if not launch or not launch.get("pid"):
            return False
        if launch.get("host") not in (None, HOST):
            seen = max(float(launch.get("alive_at") or 0), float(launch.get("deploying_at") or 0))
            return now - seen < REMOTE_ALIVE_TIMEOUT / 2
        try:
            os.kill(int(launch["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _dir(self, subtask: int, attempt: int) -> str:
        key = (subtask, attempt)
        path = self._dirs.get(key)
        if path is None:
            # layout.attempt_dir as a string, without its pathlib and safe_component work per attempt.
            if self._stage_dir is None:
                self._stage_dir = self._stage_base()
            path = self._dirs[key] = os.path.join(self._stage_dir, f"subtask={subtask}", f"attempt={attempt}")
        return path

    def _stage_base(self) -> str:
        """The stage directory as a string on POSIX; elsewhere the store's URL and the stage's name (read by name)."""
        store = self.layout.store
        if isinstance(store, PosixBackend):
            return os.fspath(self.layout.dir)
        self._name_from = len(store.url) + 1
        return f"{store.url}/{self.layout.name(self.layout.dir)}"

    def _read(self, base: str, file: str) -> Any:
        """The JSON document ``file`` of the attempt at ``base`` (``_dir``); None if it is missing."""
        if self._name_from is None:
            return read_json(os.path.join(base, file))
        return self.layout.store.read_json(f"{base[self._name_from:]}/{file}")

    def _read_together(self, base: str, files: tuple[str, ...]) -> dict[str, Any]:
        """Several documents of one attempt: one after the other on a file system, at once on an object store.

        On S3 each read is a request of tens of milliseconds, and a poll is on the controller's path from an
        attempt's end to its admission: read together they cost one round trip, not four. The invalidation
        marker is read after them (``poll``): a withdrawal is never older than the status it is judged with.
        """
        if self._name_from is None or self.layout.store.parallel_reads <= 1:
            return {file: self._read(base, file) for file in files}
        return dict(zip(files, _reader().map(lambda file: self._read(base, file), files), strict=True))

    def attempt_alive(self, status: dict[str, Any], heartbeat: dict[str, Any], now: float) -> bool:
        """Whether a launched, not yet ended attempt is still alive (here: its process; see the read model)."""
        return self._alive(status, now)

    def cancel(self, subtask: int, attempt: int, reason: str) -> None:
        """Ask the attempt's process group to stop (SIGTERM); :meth:`reap` escalates to SIGKILL."""
        layout = self.layout
        path = layout.cancel(subtask, attempt)
        if layout.read_json(path) is None:
            layout.replace_json(path, {"reason": reason, "at": time.time()})
            self._notify(subtask, attempt)
        launch = layout.read_json(layout.status(subtask, attempt)) or {}
        if launch.get("host") not in (None, HOST):
            # Another host's process group id means nothing (or another process) here: the remote
            # supervisor sees cancel.json and stops the attempt itself.
            return
        if launch.get("state") not in _ENDED and self._alive(launch):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(launch["pgid"], signal.SIGTERM)

    def reap(self, subtask: int, attempt: int, now: float | None = None) -> bool:
        """SIGKILL a cancelled attempt's group once the grace period is over; True when nothing is left."""
        now = time.time() if now is None else now
        cancel = self.layout.read_json(self.layout.cancel(subtask, attempt)) or {}
        launch = self.layout.read_json(self.layout.status(subtask, attempt)) or {}
        if not launch.get("pgid"):
            return True
        if launch.get("host") not in (None, HOST):
            # The remote supervisor escalates by itself (cancel.json); done once it recorded the end.
            return launch.get("state") in _ENDED or not self._alive(launch, now)
        if not self._group_alive(launch["pgid"]):
            return True
        if now - cancel.get("at", now) >= self.kill_grace:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(launch["pgid"], signal.SIGKILL)
        return not self._group_alive(launch["pgid"])

    def invalidate(self, subtask: int, attempt: int, reason: str) -> None:
        """Withdraw an attempt for good (its admission too, if it had it, by an owned delete).

        Raises RunNotOwnedError when the admission is to go in a run another store owns. A run without any
        ownership marker (planned by an older version, docs/store.md "Runs without a marker") has its
        admission withdrawn by ``unlink``: keeping it would leave a withdrawn attempt admitted.
        """
        layout = self.layout
        layout.replace_json(layout.invalidated(subtask, attempt), {"reason": reason, "at": time.time()})
        self._notify(subtask, attempt)
        admitted = layout.admitted(subtask)
        marker = layout.read_json(admitted)
        if marker is None or marker.get("attempt") != attempt:
            return
        try:
            layout.delete(admitted)
        except RunNotOwnedError:
            # Only a POSIX store holds runs of versions before the markers; elsewhere an unmarked run is not ours.
            if _marked(layout) or not isinstance(layout.store, PosixBackend):
                raise
            log.warning("DAG %r run %r stage %r: admission of subtask %d attempt %d withdrawn by unlink: the run "
                        "has no %s (planned by an older version)", layout.dag_id, layout.run_id, layout.stage,
                        subtask, attempt, OWNER_FILE)
            admitted.unlink(missing_ok=True)

    def _notify(self, subtask: int, attempt: int) -> None:
        """Leave a change notice for the attempt, by name."""
        changes.post(self.layout.store, self.layout.name(self.layout.dir), subtask, attempt)

    @staticmethod
    def _alive(launch: dict[str, Any], now: float | None = None) -> bool:
        pid = launch.get("pid")
        if not pid:
            return False
        if launch.get("host") not in (None, HOST):
            # Another host's pid means nothing here: trust the supervisor's own refresh.
            seen = max(float(launch.get("alive_at") or 0), float(launch.get("deploying_at") or 0))
            return (time.time() if now is None else now) - seen < REMOTE_ALIVE_TIMEOUT
        try:
            os.kill(int(pid), 0)  # the cheap negative answer first
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        key = (int(pid), launch.get("start_ticks"), launch.get("create_time"))
        checked = _VERIFIED.get(key)
        now_mono = time.monotonic()
        if checked is not None and now_mono - checked < PID_REVERIFY:
            return True
        try:
            proc = psutil.Process(pid)
            if not same_process(int(pid), launch, proc.create_time()):
                return False  # the pid was reused by another process
            alive = proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        if alive:
            if len(_VERIFIED) > 100_000:  # a long-lived triggerer: forget, re-verifying costs little
                _VERIFIED.clear()
            _VERIFIED[key] = now_mono
        return alive

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        for proc in psutil.process_iter(["pid"]):
            # A process may exit between listing and inspection: that is not an error here.
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
        return False


class HeartbeatObserver(SupervisedBackend):
    """Reads attempts like the backends do, but decides liveness from heartbeat age, never from a pid."""

    def __init__(self, layout: StageLayout, stale_after: float = HEARTBEAT_STALE_AFTER) -> None:
        super().__init__(layout)
        self.stale_after = stale_after

    def attempt_alive(self, status: dict[str, Any], heartbeat: dict[str, Any], now: float) -> bool:
        """Alive while the last sign of life is younger than ``stale_after``."""
        return heartbeat_alive(status, heartbeat, now, self.stale_after)

    def poll(self, subtask: int, attempt: int, now: float | None = None) -> Attempt:
        """The attempt as the store shows it; a stale one is reported as presumed lost, not as killed."""
        out = super().poll(subtask, attempt, now)
        if out.cause == "attempt process disappeared (killed or crashed)":
            out.cause = f"presumed lost: no heartbeat for {self.stale_after:.0f} s"
        return out


def _marked(layout: StageLayout) -> bool:
    """True if an ownership marker (anyone's) is at or above the DAG run's prefix, the store root's aside.

    The root is claimed when the store is created, so its marker says nothing about a run an older version
    planned there (store/layout.py ``owns_run``).
    """
    parts = layout.run_prefix.split("/")
    return any(layout.store.exists("/".join([*parts[:end], OWNER_FILE])) for end in range(len(parts), 0, -1))
