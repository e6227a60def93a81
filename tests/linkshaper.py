"""A slow, lossy link in user space, for kernels without ``sch_netem`` (tests/hosts.py ``HostNetwork.shape``).

``python -m tests.linkshaper --listen HOST:PORT --to HOST:PORT --delay 0.3 --loss 0.05`` relays TCP
connections and delivers every chunk sent towards ``--to`` ``delay`` seconds after it arrived, in
order (netem ``delay`` on the link towards the host); a chunk is "lost" with probability ``loss`` and
then arrives one retransmission timeout later (TCP's minimum RTO, 200 ms, after the delay), which is
what a lost segment costs a TCP stream. Replies are not delayed, as with netem on one veth end. Run
it on the host (``ip netns exec``) so that it dies with the host.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
import socket
import threading
import time

RTO = 0.2


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _delayed(source: socket.socket, sink: socket.socket, delay: float, loss: float, rng: random.Random) -> None:
    # Chunks are due in arrival order plus delay; a lost one delays every later chunk (TCP is in order).
    due: list[tuple[float, int, bytes]] = []
    ready = threading.Condition()
    closed = threading.Event()

    def send() -> None:
        last = 0.0
        with contextlib.suppress(OSError):
            while True:
                with ready:
                    while not due and not closed.is_set():
                        ready.wait()
                    if not due:
                        break
                    at, _, data = heapq.heappop(due)
                # The emulated wire: hold the chunk until it is due (not a synchronisation).
                time.sleep(max(0.0, max(at, last) - time.monotonic()))
                last = max(at, last)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sequence = 0
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            extra = RTO if rng.random() < loss else 0.0
            with ready:
                sequence += 1
                heapq.heappush(due, (time.monotonic() + delay + extra, sequence, data))
                ready.notify()
    closed.set()
    with ready:
        ready.notify()
    sender.join()


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until it closes, then close ``sink``'s writing side (also tests/hosts.py)."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def serve(listen: tuple[str, int], target: tuple[str, int], delay: float, loss: float, seed: int = 0) -> None:
    """Relay connections from ``listen`` to ``target`` through the shaped link, until killed."""
    rng = random.Random(seed)
    with socket.create_server(listen) as server:
        while True:
            client, _ = server.accept()
            try:
                upstream = socket.create_connection(target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=_delayed, args=(client, upstream, delay, loss, rng), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--loss", type=float, default=0.0)
    args = parser.parse_args()
    serve(_address(args.listen), _address(args.to), args.delay, args.loss)


if __name__ == "__main__":
    main()
