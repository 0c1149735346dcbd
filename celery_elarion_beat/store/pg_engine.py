"""The PostgreSQL engine: how the claim store connects, directly or through PgBouncer.

Directly, each connection carries the claim timeout and ``jit=off`` in its startup
packet (``options=-c statement_timeout=... -c lock_timeout=... -c jit=off``), and psycopg prepares
a statement on the server after its fifth execution on a connection.

PgBouncer in transaction mode (``elarion_beat_pgbouncer = True``) hands each
transaction whichever server connection is free, so neither survives:

* PgBouncer refuses the ``options`` startup parameter ("unsupported startup
  parameter: options"); ignoring it (``ignore_startup_parameters``) would drop
  the timeouts silently. They are set per transaction instead, with
  ``set_config(..., is_local => true)`` (``SET LOCAL``): in the claim's pipeline
  (no extra round trip) and at the start of every other transaction;
* a statement prepared on one server connection is missing on the next
  ("prepared statement "_pg3_0" does not exist") or already there under the same
  name ("... already exists"): prepares are switched off (``prepare_threshold=None``).

Unprepared, every claim is planned with its actual arrays, and the planner's
estimate of a chunk of 1,000 passes ``jit_above_cost``: PostgreSQL then compiles
the statement at every execution, which tripled the database CPU of a claim
(benchmarks/capacity.py). The same ``SET LOCAL`` turns JIT off: a claim is index
probes, which JIT never speeds up.

Everything else the store does is per transaction already: the advisory locks are
``pg_advisory_xact_lock``, nothing LISTENs, and no session state is set.
"""

from __future__ import annotations

import heapq
import math
import os
import socket
import threading
import time
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine

from ..config.settings import Settings

__all__ = ["LOCAL_SETTINGS_SQL", "UNBOUNDED", "local_settings", "postgres_engine",
           "release_deadlines"]

#: The claim timeout, and no JIT, for one transaction only (``SET LOCAL``): safe
#: through PgBouncer.
LOCAL_SETTINGS_SQL = ("SELECT set_config('statement_timeout', %(ms)s, true), "
                      "set_config('lock_timeout', %(ms)s, true), set_config('jit', 'off', true)")


#: Seconds past elarion_beat_claim_timeout after which the client cuts a statement's
#: connection itself. The server's statement_timeout ends a statement the server got;
#: tcp_user_timeout ends a wait for bytes nobody acknowledges; neither ends the wait for
#: an answer to a statement that a hung proxy acknowledged and never passed on.
CLIENT_GRACE = 0.5
#: Set in a connection's ``info`` while it runs statements the claim timeout must not
#: cut (``init-db`` building an index on a big table): the watchdog leaves it alone.
UNBOUNDED = "elarion_unbounded"


def cut_socket(dbapi_connection: Any) -> None:
    """Shut *dbapi_connection*'s socket down: its pending read fails at once."""
    try:
        sock = socket.socket(fileno=os.dup(dbapi_connection.pgconn.socket))
    except Exception:  # closed already
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class _Deadlines:
    """The one thread of a process that cuts connections whose statement outlasts its
    deadline: a heap of deadlines and a condition, instead of a timer thread started per
    statement (which cost about 30 us per claim, and a thread each).

    The thread starts at the first deadline armed and ends once nothing has been armed
    for :data:`IDLE_EXIT` seconds (a quiet beat leaves no thread behind), or at once
    when a store closes with nothing armed (:meth:`release`: a closed beat leaves no
    thread behind); a process forked with one running starts its own.
    """

    IDLE_EXIT = 5.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._released = False

    def arm(self, dog: Watchdog, seconds: float) -> None:
        with self._cond:
            self._released = False
            self._seq += 1
            dog.armed = self._seq
            deadline = time.monotonic() + seconds
            heapq.heappush(self._heap, (deadline, self._seq, dog))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="elarion-watchdog",
                                                daemon=True)
                self._thread.start()
            elif self._heap[0][1] == self._seq:  # the new earliest deadline
                self._cond.notify()

    def disarm(self, dog: Watchdog) -> None:
        dog.armed = 0  # its heap entry is skipped when it comes up (no search, no lock)

    def release(self) -> None:
        """A store closed: end the thread now if no deadline is pending (the next one
        armed starts it again)."""
        with self._cond:
            if self._thread is None or any(dog.armed == seq for _, seq, dog in self._heap):
                return
            self._released = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][0] <= now
                                      or self._heap[0][2].armed != self._heap[0][1]):
                    _, seq, dog = heapq.heappop(self._heap)
                    if dog.armed == seq:
                        dog.armed = 0
                        dog.fire()
                if self._heap:
                    self._cond.wait(self._heap[0][0] - now)
                elif self._released or (not self._cond.wait(self.IDLE_EXIT)
                                        and not self._heap):
                    self._thread = None
                    self._released = False
                    return

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition()
        self._heap = []
        self._thread = None
        self._released = False


_DEADLINES = _Deadlines()
os.register_at_fork(after_in_child=_DEADLINES.reset_after_fork)


def release_deadlines() -> None:
    """A store closed: the deadline thread ends now unless a statement is running."""
    _DEADLINES.release()


class Watchdog:
    """Cuts a connection whose statement (or commit) outlasts *seconds* (armed on the
    process's one deadline thread, :class:`_Deadlines`)."""

    def __init__(self, dbapi_connection: Any, seconds: float) -> None:
        self._conn = dbapi_connection
        self.seconds = seconds
        #: the sequence number of its pending deadline (0: none)
        self.armed = 0
        self.fired = False

    def arm(self) -> None:
        _DEADLINES.arm(self, self.seconds)

    def disarm(self) -> None:
        _DEADLINES.disarm(self)

    def fire(self) -> None:
        self.fired = True
        cut_socket(self._conn)

    def __enter__(self) -> Watchdog:
        self.arm()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()


def watchdog(record_info: dict[str, Any]) -> Watchdog | None:
    return record_info.get("elarion_watchdog")


def _watch(engine: Engine, seconds: float) -> None:
    """Bound every statement and commit of *engine* on the client side too."""
    @event.listens_for(engine.pool, "connect")
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        record.info["elarion_watchdog"] = Watchdog(dbapi_connection, seconds)

    @event.listens_for(engine.pool, "checkin")
    def on_checkin(dbapi_connection: Any, record: Any) -> None:
        dog = watchdog(record.info) if record is not None else None
        if dog is not None:
            dog.disarm()

    def dog_of(conn: Connection) -> Watchdog | None:
        if conn.invalidated:  # cut already: the rollback that follows sends nothing
            return None
        return watchdog(conn.connection.info)

    def arm(conn: Connection, *_: Any) -> None:
        dog = dog_of(conn)
        if dog is not None and not conn.info.get(UNBOUNDED):
            dog.arm()

    def disarm(conn: Connection, *_: Any) -> None:
        dog = dog_of(conn)
        if dog is not None:
            dog.disarm()

    event.listen(engine, "before_cursor_execute", arm)
    event.listen(engine, "after_cursor_execute", disarm)
    event.listen(engine, "commit", arm)
    event.listen(engine, "rollback", arm)


def _milliseconds(settings: Settings) -> int:
    return int(settings.claim_timeout * 1000)


def local_settings(settings: Settings) -> dict[str, Any] | None:
    """The parameters of :data:`LOCAL_SETTINGS_SQL` when every transaction must set
    them itself (PgBouncer mode), else None (the session carries the timeouts)."""
    return {"ms": str(_milliseconds(settings))} if settings.pgbouncer else None


def postgres_engine(settings: Settings) -> Engine:
    """A small pool of psycopg 3 connections to the claims database."""
    timeout = settings.claim_timeout
    ms = _milliseconds(settings)
    connect_args: dict[str, Any] = {
        "connect_timeout": max(2, math.ceil(timeout)),
        "application_name": f"celery-elarion-beat {settings.node}"[:63],
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
    }
    if settings.pgbouncer:
        connect_args["prepare_threshold"] = None  # never prepare server-side
    else:
        # no JIT either: past jit_above_cost (a chunk of 1,000 on a big table) every
        # re-planned claim paid a compilation, up to 1.9 s at 10 million rows
        connect_args["options"] = f"-c statement_timeout={ms} -c lock_timeout={ms} -c jit=off"
    engine = create_engine(settings.require_dsn(), pool_size=1, max_overflow=4,
                           pool_timeout=timeout, pool_recycle=1800, connect_args=connect_args)
    _watch(engine, timeout + CLIENT_GRACE)
    params = local_settings(settings)
    if params is not None:
        def set_local(conn: Connection) -> None:
            conn.exec_driver_sql(LOCAL_SETTINGS_SQL, params)

        event.listen(engine, "begin", set_local)
    return engine
