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

import math
import os
import socket
import threading
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine

from ..settings import Settings

__all__ = ["LOCAL_SETTINGS_SQL", "local_settings", "postgres_engine"]

#: The claim timeout, and no JIT, for one transaction only (``SET LOCAL``): safe
#: through PgBouncer.
LOCAL_SETTINGS_SQL = ("SELECT set_config('statement_timeout', %(ms)s, true), "
                      "set_config('lock_timeout', %(ms)s, true), set_config('jit', 'off', true)")


#: Seconds past elarion_beat_claim_timeout after which the client cuts a statement's
#: connection itself. The server's statement_timeout ends a statement the server got;
#: tcp_user_timeout ends a wait for bytes nobody acknowledges; neither ends the wait for
#: an answer to a statement that a hung proxy acknowledged and never passed on.
CLIENT_GRACE = 0.5


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


class Watchdog:
    """Cuts a connection whose statement (or commit) outlasts *seconds*."""

    def __init__(self, dbapi_connection: Any, seconds: float) -> None:
        self._conn = dbapi_connection
        self.seconds = seconds
        self._timer: threading.Timer | None = None
        self.fired = False

    def arm(self) -> None:
        self.disarm()
        self._timer = threading.Timer(self.seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
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
        if dog is not None:
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
