"""Ports for the servers a test starts, and ports nobody listens on.

``bind(0)`` hands out a port from the kernel's ephemeral range, and a port released
to be bound again seconds later by a child (a Flower, a private broker restarted on
the same port, PgBouncer) can be taken meanwhile by any other test's ``bind(0)`` or
outgoing connection. So each xdist worker draws from a block of its own *below* the
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range`` starts at 32768 here),
which the kernel never hands out by itself: ``20000 + 500 * worker``.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator

from tests.helpers.lanes import worker_index

__all__ = ["DeadPort", "free_port"]

BASE = 20000
BLOCK = 500
_next: Iterator[int] | None = None


def _candidates() -> Iterator[int]:
    start = BASE + BLOCK * worker_index()
    return itertools.cycle(range(start, start + BLOCK))


def free_port() -> int:
    """A port no one listens on now, from this worker's own block (never the same one
    twice in a row: the block is walked round)."""
    global _next
    if _next is None:
        _next = _candidates()
    for _ in range(BLOCK):
        port = next(_next)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {BASE + BLOCK * worker_index()}+{BLOCK}")


class DeadPort:
    """A port that refuses connections for as long as it is held: bound, never
    listening, so no other process can start listening on it meanwhile."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> DeadPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
