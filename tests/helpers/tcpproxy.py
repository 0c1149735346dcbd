"""A small threaded TCP proxy that a test can cut and restore.

Point a client at ``proxy.address`` instead of the real server. ``cut()``
resets every live connection (RST to both sides) and resets every new one
until ``restore()``; the server itself is never touched::

    with TcpProxy("127.0.0.1", 5432) as proxy:
        dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
        ...
        proxy.cut()      # clients see "connection reset" / "server closed the connection"
        proxy.restore()  # new connections go through again
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time

__all__ = ["TcpProxy"]

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(sock: socket.socket) -> None:
    """Close *sock* with a TCP reset (no FIN, no lingering)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pair:
    """One proxied connection: client <-> upstream, pumped by one thread."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.kill = threading.Event()
        self.done = threading.Event()


class TcpProxy:
    """Forwards ``host:port`` (default: a free port on 127.0.0.1) to an upstream server."""

    def __init__(self, upstream_host: str, upstream_port: int, *,
                 host: str = "127.0.0.1", port: int = 0, connect_timeout: float = 5.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.connect_timeout = connect_timeout
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._cut = threading.Event()
        self._paused = threading.Event()
        self._stop = threading.Event()
        self._accept_thread: threading.Thread | None = None
        #: counters, for test diagnostics
        self.accepted = 0
        self.refused = 0
        self.reset = 0

    # -- lifecycle -----------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self) -> TcpProxy:
        if self._accept_thread is None:
            self._accept_thread = threading.Thread(
                target=self._accept_loop, name=f"tcpproxy-{self.port}", daemon=True)
            self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and reset every live connection."""
        self._stop.set()
        self._kill_all()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        try:
            self._listener.close()
        except OSError:
            pass

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- cutting -------------------------------------------------------------

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    @property
    def live(self) -> int:
        """The number of connections currently forwarded."""
        with self._lock:
            return len(self._pairs)

    def cut(self, timeout: float = 5.0) -> int:
        """Reset every live connection and every new one until :meth:`restore`.

        Returns how many live connections were reset. When it returns, none of
        them carries data any more.
        """
        self._cut.set()
        return self._kill_all(timeout)

    def pause(self) -> None:
        """Every connection, live or new, stays open (and accepted) but carries no byte
        either way until :meth:`unpause`: a hung middlebox, while the kernel still
        acknowledges what each side sends."""
        self._paused.set()

    def unpause(self) -> None:
        self._paused.clear()

    def restore(self) -> None:
        """Forward new connections again (connections reset by the cut stay dead)."""
        self._cut.clear()

    # -- internals -----------------------------------------------------------

    def _kill_all(self, timeout: float = 5.0) -> int:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.kill.set()
        deadline = time.monotonic() + timeout
        for pair in pairs:
            pair.done.wait(max(0.0, deadline - time.monotonic()))
        return len(pairs)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)
                continue
            if self._cut.is_set() or self._stop.is_set():
                self.refused += 1
                _reset(client)
                continue
            self.accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True,
                             name=f"tcpproxy-{self.port}-conn").start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=self.connect_timeout)
        except OSError:
            self.refused += 1
            _reset(client)
            return
        if self._cut.is_set():  # cut while we were connecting
            self.refused += 1
            _reset(upstream)
            _reset(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, upstream)
        with self._lock:
            self._pairs.add(pair)
        try:
            self._pump(pair)
        finally:
            with self._lock:
                self._pairs.discard(pair)
            pair.done.set()

    def _pump(self, pair: _Pair) -> None:
        peer = {pair.client: pair.upstream, pair.upstream: pair.client}
        pending = {pair.client: b"", pair.upstream: b""}  # bytes waiting to be written to key
        open_for_read = {pair.client, pair.upstream}
        try:
            while True:
                if pair.kill.is_set() or self._stop.is_set():
                    self.reset += 1
                    _reset(pair.client)
                    _reset(pair.upstream)
                    return
                if self._paused.is_set():  # a hung middlebox: open, silent both ways
                    time.sleep(0.05)
                    continue
                writers = [s for s, data in pending.items() if data]
                readers = [s for s in open_for_read if not pending[peer[s]]]
                if not readers and not writers:
                    break  # both sides closed and everything flushed
                readable, writable, _ = select.select(readers, writers, [], 0.05)
                for sock in writable:
                    sent = sock.send(pending[sock])
                    pending[sock] = pending[sock][sent:]
                for sock in readable:
                    data = sock.recv(65536)
                    if data:
                        pending[peer[sock]] += data
                    else:  # orderly close from this side: pass it on
                        open_for_read.discard(sock)
                        try:
                            peer[sock].shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
            pair.client.close()
            pair.upstream.close()
        except OSError:
            _reset(pair.client)
            _reset(pair.upstream)
