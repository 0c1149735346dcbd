"""PostgreSQL's part of the one-offs and the database entries: the clock in the
statement, psycopg connections of the caller (outbox), and LISTEN/NOTIFY.

``add_one_off`` sends ``pg_notify(<channel>, '')`` in the transaction that writes
the row, so the nodes hear of it when it commits (never of a rolled-back one). The
channel is named after the one-offs table and the cluster (:func:`channel_of`): an
app's nodes wake for its own one-offs only. While the table may still have nodes of
0.2 (its keys are 0.2's), the channel of 0.2 (the table's alone) is notified and
listened on as well. The entries table's triggers notify on a channel named after
that table, the cluster as the payload. Each beat node LISTENs on ONE dedicated
autocommit connection (:class:`PgOneOffListener`, made once per store) that the
one-offs runner and the entries follower poll without blocking, each for its own
channels (:class:`ChannelWakeups`). The listener never breaks a tick: when its
connection fails it reconnects (every few seconds) and says "maybe" meanwhile.
Behind PgBouncer in transaction mode a LISTEN does not survive the transaction: no
listener, the runner polls the next due time and the follower the entries' version.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from ..config.settings import Settings
from ..exceptions import StoreError
from .interface import OneOffWakeups

__all__ = ["ChannelWakeups", "PgOneOffListener", "PgOneOffs", "channel_of"]

logger = logging.getLogger(__name__)

#: Seconds between reconnection attempts of a listener whose connection failed.
RECONNECT_EVERY = 5.0


def channel_of(qualified_table: str, cluster: str | None = None) -> str:
    """The NOTIFY channel of a one-offs table and *cluster* (an identifier: at most 63
    bytes; a longer name is hashed). Without *cluster*: the channel of 0.2."""
    if cluster is None:
        return f"elarion:{qualified_table}"[:63]
    name = f"elarion:{qualified_table}:{cluster}"
    if len(name.encode()) <= 63:
        return name
    return "elarion:" + hashlib.sha1(f"{qualified_table}\x00{cluster}".encode()).hexdigest()


class PgOneOffs:
    """The PostgreSQL hooks of :class:`~.sql_one_offs.SqlOneOffs`."""

    engine: Engine
    settings: Settings
    round_trips: int
    cluster: str
    legacy_locks: bool
    _listener: PgOneOffListener | None = None

    if TYPE_CHECKING:  # provided by PostgresClaimStore
        def _translate(self, exc: BaseException) -> StoreError: ...

        @property
        def entries_channel(self) -> str: ...

    @property
    def one_off_channel(self) -> str:
        """This cluster's channel."""
        return channel_of(self._one_offs_name, self.cluster)

    @property
    def one_off_channels(self) -> list[str]:
        """The channels a one-off is notified on: this cluster's, and 0.2's while the
        tables may have nodes of 0.2."""
        legacy = [channel_of(self._one_offs_name)] if self.legacy_locks else []
        return [self.one_off_channel, *legacy]

    @property
    def _one_offs_name(self) -> str:
        s = self.settings
        return f"{s.schema}.{s.one_offs_table}" if s.schema else s.one_offs_table

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
        stmt = select(*[func.pg_notify(channel, "") for channel in self.one_off_channels])
        if isinstance(conn, Connection):
            self.round_trips += 1
            conn.execute(stmt)
        else:
            self._oo_raw(conn, stmt)

    # -- the database entries on a caller's psycopg connection ---------------------

    def _entry_rows(self, conn: Any, stmt: Any) -> list[dict[str, Any]]:
        if isinstance(conn, psycopg.Connection):
            self.round_trips += 1
            compiled = stmt.compile(dialect=self.engine.dialect,
                                    compile_kwargs={"render_postcompile": True})
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    cur.execute(str(compiled), compiled.params)
                    return list(cur.fetchall()) if cur.description is not None else []
            except psycopg.Error as exc:
                raise self._translate(exc) from exc
        return super()._entry_rows(conn, stmt)  # type: ignore[misc, no-any-return]

    @contextlib.contextmanager
    def _entry_savepoint(self, conn: Any) -> Iterator[None]:
        if isinstance(conn, psycopg.Connection):
            try:
                if not conn.autocommit and \
                        conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                    conn.execute("SELECT 1")  # the caller's transaction begins, as it would
                with conn.transaction():  # a savepoint inside the caller's transaction
                    yield
            except psycopg.Error as exc:
                raise self._translate(exc) from exc
            return
        with super()._entry_savepoint(conn):  # type: ignore[misc]
            yield

    # -- LISTEN ----------------------------------------------------------------------

    def one_off_wakeups(self) -> OneOffWakeups | None:
        return self._shared_listener()

    def entry_wakeups(self, cluster: str) -> OneOffWakeups | None:
        listener = self._shared_listener()
        if listener is None:
            return None
        return ChannelWakeups(listener, self.entries_channel, cluster)

    def _shared_listener(self) -> PgOneOffListener | None:
        """The store's one LISTEN connection (made at the first call)."""
        if self.settings.pgbouncer:
            return None
        if self._listener is None:
            self._listener = self._make_listener()
        return self._listener

    def _make_listener(self) -> PgOneOffListener:
        engine = self.engine

        def connect() -> psycopg.Connection[Any]:
            args, params = engine.dialect.create_connect_args(engine.url)
            params = {**params, "autocommit": True,
                      "connect_timeout": max(2, int(self.settings.claim_timeout)),
                      "application_name": f"celery-elarion-beat listen {self.settings.node}"[:63],
                      "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 5,
                      "keepalives_count": 3}
            return psycopg.connect(*args, **params)

        return PgOneOffListener(connect, *self.one_off_channels)


def _not_a_connection(conn: Any) -> Exception:
    from ..exceptions import ConfigurationError

    return ConfigurationError(
        "schedule_once(connection=...) takes a SQLAlchemy Connection (Session.connection()) "
        f"or a psycopg 3 Connection, not {type(conn).__name__}")


#: What a channel's listener heard: (channel, payload), payload None for any.
_Key = tuple[str, "str | None"]


class PgOneOffListener(OneOffWakeups):
    """LISTEN on a dedicated autocommit connection, polled without blocking.

    Its own :meth:`poll` answers for the one-offs *channels* (this cluster's, and 0.2's
    while the tables may have nodes of 0.2); more channels are listened to through
    :meth:`listen` (the database entries: :class:`ChannelWakeups`). Every notification
    is kept per channel (and payload) until the poll of that channel.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], *channels: str,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._connect = connect
        self.channels = channels
        self._monotonic = monotonic
        self._conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0
        self._closer: weakref.finalize[Any, Any] | None = None
        self.connects = 0
        self._channels: list[str] = list(channels)
        self._heard: dict[_Key, bool] = {(channel, None): False for channel in channels}

    @property
    def listening(self) -> bool:
        return self._conn is not None

    def listen(self, channel: str, payload: str | None = None) -> None:
        """Listen to *channel* too (its notifications of *payload*, or all)."""
        self._heard.setdefault((channel, payload), False)
        if channel in self._channels:
            return
        self._channels.append(channel)
        if self._conn is not None:
            try:
                self._conn.execute(_listen(channel))
            except Exception as exc:  # the next poll reconnects, listening to all
                logger.debug("beat: listener lost its connection: %s", exc)
                self.close()

    def poll(self) -> bool | None:
        heard = [self.poll_channel(channel) for channel in self.channels]
        return None if None in heard else any(heard)

    def poll_channel(self, channel: str, payload: str | None = None) -> bool | None:
        """Whether *channel* (with *payload*) was notified since its last poll: True also
        just after (re)connecting; None when not connected (the caller polls itself)."""
        key = (channel, payload)
        if self._conn is None:
            if self._monotonic() < self._retry_at:
                return None  # cannot tell: the runner checks the table
            conn = None
            try:
                conn = self._connect()
                for name in self._channels:
                    conn.execute(_listen(name))
            except Exception as exc:
                if conn is not None:  # connected, but not listening: not kept, so closed
                    _close_quietly(conn)
                self._retry_at = self._monotonic() + RECONNECT_EVERY
                logger.debug("beat: listener not connected (polling instead): %s", exc)
                return None
            self._conn = conn
            # a scheduler nobody closed must not leave the connection open until exit
            self._closer = weakref.finalize(self, _close_quietly, conn)
            self.connects += 1
            for heard in self._heard:
                self._heard[heard] = True  # anything may have happened while it was away
        try:
            pgconn = self._conn.pgconn
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                name = note.relname.decode("utf-8", "replace")
                said = note.extra.decode("utf-8", "replace")
                for heard in ((name, None), (name, said)):
                    if heard in self._heard:
                        self._heard[heard] = True
        except Exception as exc:
            logger.debug("beat: listener lost its connection: %s", exc)
            self.close()
            self._retry_at = self._monotonic() + RECONNECT_EVERY
            return None
        got = self._heard.get(key, False)
        self._heard[key] = False
        return got

    def fileno(self) -> int | None:
        """The connection's socket (readable when a notification arrives), or None."""
        if self._conn is None:
            return None
        try:
            return int(self._conn.pgconn.socket)
        except Exception:
            return None

    def close(self) -> None:
        self._conn = None
        if self._closer is not None:
            self._closer()


class ChannelWakeups(OneOffWakeups):
    """A view of a store's listener for one channel and payload (the database entries'
    notifications of one cluster), sharing its connection."""

    def __init__(self, listener: PgOneOffListener, channel: str,
                 payload: str | None = None) -> None:
        self.listener = listener
        self.channel = channel
        self.payload = payload
        listener.listen(channel, payload)

    def poll(self) -> bool | None:
        return self.listener.poll_channel(self.channel, self.payload)

    def fileno(self) -> int | None:
        return self.listener.fileno()

    def close(self) -> None:
        return None  # the connection is the store's (and the one-offs')


def _listen(channel: str) -> str:
    """The LISTEN statement of *channel* (quoted: a table name may hold anything)."""
    return 'LISTEN "' + channel.replace('"', '""') + '"'


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except Exception:  # closing a broken connection
        pass
