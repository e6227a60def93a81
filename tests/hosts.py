"""Several hosts on one machine: network namespaces on a bridge, each with its own address (tests, bench/).

``HostNetwork(count)`` builds, as a context manager:

- a bridge ``sph-br`` with the root namespace's address ``10.213.0.1/24`` (where the controller, the
  store's readers and the test itself run: the "scheduler/triggerer host");
- per host ``i`` (1-based) a namespace ``sph-h<i>`` whose ``eth0`` (a veth, root end ``sph-v<i>`` in
  the bridge) has ``10.213.0.<10+i>/24``, and ``lo`` up (Spark's Python workers talk over it).

Hosts share the filesystem, as an NFS-mounted store would be shared. Inside a namespace 127.0.0.1 is
that namespace's own loopback: a service of the root namespace (Postgres, Redis) is reached on the
root's bridge address, bound there or through :meth:`HostNetwork.forward` (a small TCP forwarder from
``10.213.0.1:<port>`` to ``127.0.0.1:<port>``).

Faults are what a real network does: :meth:`kill` SIGKILLs every process in a host's namespace (the
machine is gone), :meth:`partition` / :meth:`heal` take its link down / up, :meth:`netem` adds delay and
loss (``tc qdisc ... netem``) to its link. Teardown kills every process left in the namespaces and
deletes the namespaces, links and bridge, also after a failure; :func:`remove_leftovers` removes
those of a previous crashed run at start. Only names with the prefix ``sph-`` are ever deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.linkshaper import pipe
from tests.processes import wait_for

if TYPE_CHECKING:
    from airflow_provider_speculative.devtools.localcluster import ServerInfo

PREFIX = "sph-"
BRIDGE = PREFIX + "br"
SUBNET = "10.213.0"
ROOT_ADDRESS = f"{SUBNET}.1"
LOCK = Path("/run/lock/speculative-hosts.lock")


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (None: they can): needs root and iproute2's ``ip netns``."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ip netns add failed: {exc}"
    if added.returncode != 0:
        return f"ip netns add failed: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=10)
    return None


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _ours(name: str) -> bool:
    return name.startswith(PREFIX)


def namespace_pids(netns: str) -> list[int]:
    """Pids of the processes whose network namespace is ``netns``."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_namespace(netns: str, timeout: float = 30.0) -> None:
    """SIGKILL every process in ``netns`` until none is left (children forked meanwhile included)."""
    def gone() -> bool:
        pids = namespace_pids(netns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids

    wait_for(gone, timeout, f"every process of namespace {netns} killed", interval=0.2)


def remove_leftovers() -> list[str]:
    """Delete our namespaces (killing their processes) and links left by a crashed run; returns their names."""
    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        if _ours(name):
            kill_namespace(name)
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show").splitlines():
        # "7: sph-v1@if6: <...>": the name is before any '@'.
        name = line.split(":", 2)[1].strip().split("@")[0]
        if _ours(name):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class Host:
    """One simulated machine: its namespace, the root end of its link and its address."""

    index: int

    @property
    def name(self) -> str:
        """``h<index>``: the host's name (and its Spark target's)."""
        return f"h{self.index}"

    @property
    def netns(self) -> str:
        """Its network namespace."""
        return f"{PREFIX}h{self.index}"

    @property
    def veth(self) -> str:
        """The root end of its link (in the bridge): where partitions and netem apply."""
        return f"{PREFIX}v{self.index}"

    @property
    def address(self) -> str:
        """Its only address (``10.213.0.<10 + index>``)."""
        return f"{SUBNET}.{10 + self.index}"

    def command(self, argv: list[str], own_hostname: bool = False) -> list[str]:
        """``argv`` run on this host (``ip netns exec`` execs it: the pid is the command's).

        With ``own_hostname`` it also gets a UTS namespace whose hostname is the host's netns name, so
        ``socket.gethostname()`` tells the hosts apart as it would on real machines (the supervised
        backend uses it to decide whether an attempt's pid is local). Not for JVMs: nothing resolves
        that name, and Java looks its own hostname up.
        """
        if not own_hostname:
            return ["ip", "netns", "exec", self.netns, *argv]
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                f'hostname {self.netns} && exec "$@"', "sh", *argv]


@dataclass
class HostNetwork:
    """``count`` hosts on a bridge; a context manager that builds them and always tears them down."""

    count: int
    hosts: list[Host] = field(default_factory=list)
    _forwarders: list[TcpForwarder] = field(default_factory=list)
    _relays: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _lock: int | None = None

    def __enter__(self) -> HostNetwork:
        if not 1 <= self.count <= 200:
            raise ValueError(f"1..200 hosts, not {self.count}")
        # One network per machine: a second session (another engineer's) waits, it does not tear ours down.
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        wait_for(lambda: self._try_lock(), 600, f"the host network lock {LOCK}", interval=1.0)
        try:
            remove_leftovers()
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _try_lock(self) -> bool:
        assert self._lock is not None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _build(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{ROOT_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for index in range(1, self.count + 1):
            host = Host(index)
            _ip("netns", "add", host.netns)
            self.hosts.append(host)
            peer = f"{PREFIX}p{index}"
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.netns)
            _ip("link", "set", peer, "name", "eth0", netns=host.netns)
            _ip("addr", "add", f"{host.address}/24", "dev", "eth0", netns=host.netns)
            _ip("link", "set", "eth0", "up", netns=host.netns)
            _ip("link", "set", "lo", "up", netns=host.netns)
            _ip("link", "set", host.veth, "master", BRIDGE)
            _ip("link", "set", host.veth, "up")
        for host in self.hosts:
            wait_for(lambda h=host: _reachable(h), 30, f"{host.address} answering from the root namespace",
                     interval=0.2)

    def __exit__(self, *exc: object) -> None:
        for host in list(self.hosts):
            self.unshape(host)
        for forwarder in self._forwarders:
            forwarder.close()
        self._forwarders.clear()
        try:
            for host in self.hosts:
                with contextlib.suppress(AssertionError):
                    kill_namespace(host.netns)
            remove_leftovers()
        finally:
            self.hosts.clear()
            if self._lock is not None:
                os.close(self._lock)  # releases the flock
                self._lock = None

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def kill(self, host: Host) -> None:
        """The machine is gone: every process on it is killed at once (SIGKILL, no shutdown hooks)."""
        kill_namespace(host.netns)

    def partition(self, host: Host) -> None:
        """Cut the host off the network (its link down); its processes keep running."""
        _ip("link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        """Reconnect a partitioned host."""
        _ip("link", "set", host.veth, "up")
        wait_for(lambda: _reachable(host), 30, f"{host.address} reachable again", interval=0.2)

    def netem(self, host: Host, spec: str) -> None:
        """Shape the host's link (e.g. ``delay 300ms loss 5%``): every packet sent to the host."""
        _tc("qdisc", "replace", "dev", host.veth, "root", "netem", *spec.split())

    def clear_netem(self, host: Host) -> None:
        """Remove the shaping of :meth:`netem`."""
        if shutil.which("tc") is None:
            return
        _tc("qdisc", "del", "dev", host.veth, "root", check=False)

    def shape(self, host: Host, port: int, delay_ms: int = 300, loss_percent: float = 5.0) -> tuple[int, str]:
        """Make the link to ``host``'s service on ``port`` slow and lossy; returns (port to dial, how).

        With netem: ``delay <delay_ms>ms loss <loss_percent>%`` on the host's link (every service of the
        host), and the port is unchanged. On a kernel without netem: a user-space relay on the host
        (tests/linkshaper.py) at ``port + 1`` that delays what is sent to ``port`` the same way, and
        the loss is the kernel's where nftables is installed (a rule in the host's namespace drops
        that share of the packets it receives), else the relay's emulation of it.
        """
        if netem_unavailable_reason() is None:
            self.netem(host, f"delay {delay_ms}ms loss {loss_percent}%")
            return port, "netem"
        import sys

        kernel_loss = shutil.which("nft") is not None and loss_percent > 0
        if kernel_loss:
            # In the host's own namespace: the rule goes with it, nothing is added to the root's ruleset.
            for rule in (["add", "table", "inet", "sph"],
                         ["add", "chain", "inet", "sph", "input", "{ type filter hook input priority 0; }"],
                         ["add", "rule", "inet", "sph", "input", "numgen", "random", "mod", "100", "<",
                          str(int(loss_percent)), "drop"]):
                done = subprocess.run(host.command(["nft", *rule]), capture_output=True, text=True, timeout=30)
                if done.returncode != 0:
                    raise RuntimeError(f"nft {' '.join(rule)} on {host.netns} failed: {done.stderr.strip()}")
        relay_port = port + 1
        relay_loss = 0.0 if kernel_loss else loss_percent / 100
        argv = [sys.executable, "-m", "tests.linkshaper", "--listen", f"{host.address}:{relay_port}",
                "--to", f"{host.address}:{port}", "--delay", str(delay_ms / 1000), "--loss", str(relay_loss)]
        self._relays[host.name] = subprocess.Popen(host.command(argv), cwd=Path(__file__).resolve().parents[1],
                                                   stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: accepts(host.address, relay_port), 30, f"the link shaper on {host.address}:{relay_port}",
                 interval=0.2)
        return relay_port, "relay + nft loss" if kernel_loss else "relay"

    def unshape(self, host: Host) -> None:
        """Undo :meth:`shape`."""
        self.clear_netem(host)
        if shutil.which("nft") is not None:
            subprocess.run(host.command(["nft", "delete", "table", "inet", "sph"]), capture_output=True, timeout=30)
        relay = self._relays.pop(host.name, None)
        if relay is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(relay.pid, signal.SIGKILL)
            relay.wait(timeout=10)

    def forward(self, port: int) -> TcpForwarder:
        """Expose the root namespace's ``127.0.0.1:port`` to the hosts as ``10.213.0.1:port``."""
        forwarder = TcpForwarder((ROOT_ADDRESS, port), ("127.0.0.1", port))
        self._forwarders.append(forwarder)
        return forwarder


def _tc(*args: str, netns: str | None = None, check: bool = True) -> None:
    cmd = [*(["ip", "netns", "exec", netns] if netns else []), "tc", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


def accepts(address: str, port: int) -> bool:
    """True if ``address:port`` accepts a TCP connection within 0.5 s."""
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _reachable(host: Host) -> bool:
    # An ARP-resolved connect that is refused proves the address answers; a timeout does not.
    try:
        with socket.create_connection((host.address, 9), timeout=0.5):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class TcpForwarder:
    """Accepts on ``listen`` and pipes each connection to ``target`` (one thread per direction)."""

    def __enter__(self) -> TcpForwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen, reuse_port=False)
        self.server.settimeout(0.2)
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name=f"forward-{listen[1]}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        """Stop accepting and close every forwarded connection."""
        self._stop.set()
        self.server.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self._thread.join(timeout=2)


@contextlib.contextmanager
def host_network(count: int) -> Iterator[HostNetwork]:
    """``count`` hosts for the duration of the context (see :class:`HostNetwork`)."""
    with HostNetwork(count) as network:
        yield network


def netem_unavailable_reason() -> str | None:
    """Why ``tc qdisc ... netem`` cannot shape a link here (None: it can); e.g. a kernel without sch_netem."""
    if shutil.which("tc") is None:
        return "iproute2's tc is not installed"
    done = subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                          capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        return f"tc netem unusable ({done.stderr.strip()}): the kernel lacks CONFIG_NET_SCH_NETEM"
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True, timeout=10)
    return None


def start_connect_servers(network: HostNetwork, directory: Path, cores: int = 1,
                          hosts: list[Host] | None = None, warm_up: bool = True) -> list[ServerInfo]:
    """One Spark Connect server per host (``local[cores]``), bound to the host's address, as a real pool.

    Each is the target named after its host with ``node`` = the host's address; ports are the same on
    every host (15002 gRPC, 4040 UI), as on separate machines. ``warm_up=False`` skips the warm-up
    queries (devtools/warmup.py): the first attempts then pay the JVM's class loading instead.
    """
    from airflow_provider_speculative.devtools.localcluster import LocalCluster, ServerInfo

    chosen = hosts if hosts is not None else network.hosts
    servers = [ServerInfo(name=h.name, port=15002, ui_port=4040, master=f"local[{cores}]", host=h.address)
               for h in chosen]
    by_host = {h.address: h for h in chosen}
    return LocalCluster(directory).start_servers(servers, warm_up=warm_up,
                                                 launcher=lambda s: by_host[s.host].command([]))
