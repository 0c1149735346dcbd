"""PostgreSQL's part of the one-offs: the clock in the statement, psycopg connections
of the caller (outbox), and LISTEN/NOTIFY.

``add_one_off`` sends ``pg_notify(<channel>, '')`` in the transaction that writes
the row, so the nodes hear of it when it commits (never of a rolled-back one). The
channel is named after the one-offs table. Each beat node LISTENs on a dedicated
autocommit connection (:class:`PgOneOffListener`) that the runner polls without
blocking at each wake. The listener never breaks a tick: when its connection fails
it reconnects (every few seconds) and says "maybe" meanwhile. Behind PgBouncer in
transaction mode a LISTEN does not survive the transaction: no listener, the runner
polls the next due time instead.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from ..exceptions import StoreError
from ..settings import Settings
from .base import OneOffWakeups

__all__ = ["PgOneOffListener", "PgOneOffs", "channel_of"]

logger = logging.getLogger(__name__)

#: Seconds between reconnection attempts of a listener whose connection failed.
RECONNECT_EVERY = 5.0


def channel_of(qualified_table: str) -> str:
    """The NOTIFY channel of a one-offs table (an identifier: at most 63 bytes)."""
    return f"elarion:{qualified_table}"[:63]


class PgOneOffs:
    """The PostgreSQL hooks of :class:`~.sql_oneoffs.SqlOneOffs`."""

    engine: Engine
    settings: Settings
    round_trips: int

    if TYPE_CHECKING:  # provided by PostgresClaimStore
        def _translate(self, exc: BaseException) -> StoreError: ...

    @property
    def one_off_channel(self) -> str:
        s = self.settings
        return channel_of(f"{s.schema}.{s.one_offs_table}" if s.schema else s.one_offs_table)

    def _oo_now(self, conn: Connection) -> Any:
        # stable within the statement, so it bounds an index scan (clock_timestamp()
        # is volatile); the database clock either way
        return func.statement_timestamp()

    def _oo_raw(self, conn: Any, stmt: Any) -> list[dict[str, Any]]:
        if not isinstance(conn, psycopg.Connection):
            raise _not_a_connection(conn)
        compiled = stmt.compile(dialect=self.engine.dialect)
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(str(compiled), compiled.params)
                return list(cur.fetchall()) if cur.description is not None else []
        except psycopg.Error as exc:
            raise self._translate(exc) from exc

    def _oo_added(self, conn: Any) -> None:
        stmt = select(func.pg_notify(self.one_off_channel, ""))
        if isinstance(conn, Connection):
            self.round_trips += 1
            conn.execute(stmt)
        else:
            self._oo_raw(conn, stmt)

    def one_off_wakeups(self) -> OneOffWakeups | None:
        if self.settings.pgbouncer:
            return None
        engine = self.engine

        def connect() -> psycopg.Connection[Any]:
            args, params = engine.dialect.create_connect_args(engine.url)
            params = {**params, "autocommit": True,
                      "connect_timeout": max(2, int(self.settings.claim_timeout)),
                      "application_name": f"celery-elarion-beat listen {self.settings.node}"[:63],
                      "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 5,
                      "keepalives_count": 3}
            return psycopg.connect(*args, **params)

        return PgOneOffListener(connect, self.one_off_channel)


def _not_a_connection(conn: Any) -> Exception:
    from ..exceptions import ConfigurationError

    return ConfigurationError(
        "schedule_once(connection=...) takes a SQLAlchemy Connection (Session.connection()) "
        f"or a psycopg 3 Connection, not {type(conn).__name__}")


class PgOneOffListener(OneOffWakeups):
    """LISTEN on a dedicated autocommit connection, polled without blocking."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._connect = connect
        self.channel = channel
        self._monotonic = monotonic
        self._conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0
        self._closer: weakref.finalize[Any, Any] | None = None
        self.connects = 0

    @property
    def listening(self) -> bool:
        return self._conn is not None

    def poll(self) -> bool | None:
        if self._conn is None:
            if self._monotonic() < self._retry_at:
                return None  # cannot tell: the runner checks the table
            try:
                conn = self._connect()
                conn.execute(f'LISTEN "{self.channel}"')
            except Exception as exc:
                self._retry_at = self._monotonic() + RECONNECT_EVERY
                logger.debug("beat: one-offs listener not connected (polling instead): %s", exc)
                return None
            self._conn = conn
            # a scheduler nobody closed must not leave the connection open until exit
            self._closer = weakref.finalize(self, _close_quietly, conn)
            self.connects += 1
            return True  # anything may have been scheduled while it was away
        try:
            pgconn = self._conn.pgconn
            pgconn.consume_input()
            got = False
            while pgconn.notifies() is not None:
                got = True
            return got
        except Exception as exc:
            logger.debug("beat: one-offs listener lost its connection: %s", exc)
            self.close()
            self._retry_at = self._monotonic() + RECONNECT_EVERY
            return None

    def close(self) -> None:
        self._conn = None
        if self._closer is not None:
            self._closer()


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except Exception:  # closing a broken connection
        pass
