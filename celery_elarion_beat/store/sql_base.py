"""What every SQL claim store shares: the tables, the dialect hooks, the schema,
and the translation of driver errors (:class:`SqlBase`).

Backends subclass :class:`~.sql.SqlClaimStore` and provide the claim itself (the
part that needs the database's own locking) plus a few dialect hooks: the clock, the
upsert of a node row, a bounded delete, and how DDL is serialized. The role mixins
(:mod:`.sql_claims`, :mod:`.sql_control`, :mod:`.sql_nodes`, :mod:`.sql_one_offs`)
build on this base; their queries are SQLAlchemy Core and run on every dialect.
"""

from __future__ import annotations

import abc
import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    MetaData,
    Table,
    inspect,
    literal,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateIndex

from ..config.dsn import mask_dsn
from ..config.settings import Settings
from ..exceptions import (
    ClaimRefused,
    SchemaMissing,
    StoreError,
    StoreRefused,
    StoreUnavailable,
    UpgradeRefused,
)
from ..schedules.clock import as_utc
from .clusters import LEGACY_NODE, ClusterCensus, upgrade_refused_message
from .interface import ClaimStore
from .records import SchemaStep
from .refusal import refusal
from .schema import (
    CLUSTER,
    TOKEN_LENGTH,
    audit_table,
    claims_table,
    entries_table,
    foreign_beats_table,
    nodes_table,
    one_offs_table,
    pauses_table,
    revisions_table,
    versions_table,
)
from .sql_upgrade import KeyGap, key_gaps

#: Keys per statement when a query lists (job, occurrence) keys or job names.
KEYS_PER_QUERY = 1000
#: The latest claims a store reads, on tables of 0.2, to see which clusters claim in them.
CENSUS_CLAIMS = 10_000

__all__ = ["KEYS_PER_QUERY", "SqlBase", "missing_table_message", "outdated_table_message"]


class SqlBase(ClaimStore):
    """A claim store on a SQL database through a SQLAlchemy engine: its tables, its
    dialect hooks, its schema and its error translation."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.cluster = settings.require_cluster()
        self.engine = engine
        # a store dropped without close() still gives its pool's connections back when it
        # is collected, instead of leaving them to psycopg's __del__ (a ResourceWarning,
        # raised in whatever code runs then) or to the server's idle timeout
        self._dispose_when_dropped = weakref.finalize(self, engine.dispose)
        self._dispose_when_dropped.atexit = False
        self.metadata = MetaData()
        self.table: Table = claims_table(self.metadata, settings.table, settings.schema,
                                         partitioned=settings.claims_layout == "partitioned")
        self.nodes_table: Table = nodes_table(self.metadata, settings.nodes_table, settings.schema)
        self.pauses_table: Table = pauses_table(self.metadata, settings.pauses_table,
                                                settings.schema)
        self.audit_table: Table = audit_table(self.metadata, settings.audit_table,
                                              settings.schema)
        self.one_offs_table: Table = one_offs_table(self.metadata, settings.one_offs_table,
                                                    settings.schema)
        self.foreign_beats_table: Table = foreign_beats_table(
            self.metadata, settings.foreign_beats_table, settings.schema)
        #: the database entries' tables (live schedules): on a MetaData of their own, as
        #: they are made only when elarion_beat_db_entries is on
        self.entries_metadata = MetaData()
        self.entries: Table = entries_table(self.entries_metadata, settings.entries_table,
                                            settings.schema)
        self.revisions: Table = revisions_table(self.entries_metadata,
                                                settings.revisions_table, settings.schema)
        self.versions: Table = versions_table(self.entries_metadata, settings.versions_table,
                                              settings.schema)
        self._entries_ready_flag = False
        self._schema_ready = False
        #: the tables whose keys do not start with the cluster yet (0.2's; unknown until
        #: the schema was checked: assumed, so the claims take the old locks too)
        self._legacy: tuple[str, ...] | None = None
        #: (node, boot id, fingerprint) of the node row this store last wrote whole
        self._node_written: tuple[str, str, str] | None = None
        self.round_trips = 0

    @abc.abstractmethod
    def _db_now(self, conn: Connection) -> datetime:
        """The store clock (aware UTC) read on *conn*."""

    @abc.abstractmethod
    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        """Delete up to *batch* claims with claimed_at < *cutoff*; return how many."""

    def _serialize_ddl(self, conn: Connection) -> None:
        """Keep nodes that start together from racing on DDL (a no-op by default)."""

    @contextlib.contextmanager
    def _ddl_transaction(self) -> Iterator[Connection]:
        """A transaction for the schema's DDL, serialized with every node's."""
        with self.engine.begin() as conn:
            self._serialize_ddl(conn)
            yield conn

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table of the store: claims, nodes, pauses, audit, one-offs."""
        return (self.table, self.nodes_table, self.pauses_table, self.audit_table,
                self.one_offs_table)

    @property
    def legacy_locks(self) -> bool:
        """Whether the claims table may still be used by nodes of 0.2 (its keys are
        0.2's, or not checked yet): then the window and control locks are taken the old
        way too, so a claim of this version and one of 0.2 never overlap."""
        return self._legacy is None or self.table.name in self._legacy

    def _mine(self, table: Table) -> Any:
        """The condition "a row of this store's cluster" on *table*."""
        return table.c[CLUSTER] == self.cluster
    @contextlib.contextmanager
    def _serialized(self, conn: Connection, key: str) -> Iterator[None]:
        """One transaction on *conn*, serialized with every other one of *key* (the
        default suits a database whose transactions are serialized already)."""
        with conn.begin():
            yield

    def _missing_table(self, exc: BaseException) -> bool:
        """Whether *exc* says the claims table does not exist (a dialect hook)."""
        return False

    def _translate(self, exc: BaseException) -> StoreError:
        if self._missing_table(exc):
            self._schema_ready = False
            return SchemaMissing(missing_table_message(self.table))
        where = mask_dsn(self.settings.dsn)
        fix = refusal(exc)
        if fix is not None:
            return StoreRefused(f"the claims database {where} refused this node ({fix}): "
                                f"{getattr(exc, 'orig', None) or exc}")
        if isinstance(exc, (sa_exc.DataError, sa_exc.IntegrityError, UnicodeError)) or (
                isinstance(exc, sa_exc.StatementError)
                and not isinstance(exc, sa_exc.DBAPIError)):
            return ClaimRefused(f"the claims database {where} refused the data: "
                                f"{getattr(exc, 'orig', None) or exc}")
        if isinstance(exc, sa_exc.OperationalError):
            return StoreUnavailable(f"the claims database {where} is unreachable or busy: "
                                    f"{exc.orig}")
        if isinstance(exc, sa_exc.TimeoutError):
            return StoreUnavailable(f"no connection to the claims database {where} is free: {exc}")
        return StoreError(f"the claims database {where} failed: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (sa_exc.StatementError, sa_exc.TimeoutError, UnicodeError) as exc:
            raise self._translate(exc) from exc

    def ensure_schema(self) -> None:
        if self.settings.create_table:
            self._create(finish=False)
            return
        with self._translated(), self.engine.connect() as conn:
            self.round_trips += 1
            inspector = inspect(conn)
            for table in (self.table, self.nodes_table, self.pauses_table, self.audit_table):
                if not inspector.has_table(table.name, schema=self.settings.schema):
                    raise SchemaMissing(missing_table_message(table))
            self._check_layout(conn, create=False)
            upgrades = self._upgrades(conn)
            if upgrades:
                raise SchemaMissing(outdated_table_message(self.table, upgrades))
            self._legacy = tuple(sorted({gap.table.name for gap in self._gaps(conn)}))
        self._schema_ready = True

    def create_schema(self, on_step: Callable[[SchemaStep], None] | None = None,
                      force: bool = False) -> tuple[str, ...]:
        """Create the tables whatever elarion_beat_create_table says (``init-db``),
        bring tables made by an older version up to date (each change told to *on_step*
        first), and finish the upgrade of tables of 0.2 (their keys start with the
        cluster; not while a node of 0.2 is live, unless *force*); the tables whose keys
        it upgraded."""
        return self._create(finish=True, force=force, on_step=on_step)

    def _create(self, finish: bool, force: bool = False,
                on_step: Callable[[SchemaStep], None] | None = None) -> tuple[str, ...]:
        """Create what is missing and add the columns of later versions (the cluster's
        with this cluster as its default, which rows of 0.2 nodes then take); with
        *finish*, also swap the keys of tables of 0.2 (:meth:`_finish_upgrade`)."""
        with self._translated():
            with self._ddl_transaction() as conn:
                self.round_trips += 1
                self.metadata.create_all(conn, checkfirst=True)
                self._check_layout(conn, create=True)
                self._upgrade(conn, self._upgrades(conn), on_step)
                gaps = self._gaps(conn)
            before = tuple(sorted({gap.table.name for gap in gaps}))
            if finish and gaps:
                self._finish_upgrade(gaps, force)
                with self.engine.connect() as conn:
                    gaps = self._gaps(conn)
        self._legacy = tuple(sorted({gap.table.name for gap in gaps}))
        self._schema_ready = True
        if self.settings.db_entries:
            self.ensure_entries_schema(create=True)
        return tuple(t for t in before if t not in self._legacy) if finish else ()

    def ensure_entries_schema(self, create: bool | None = None) -> None:
        """The database entries' tables (a role mixin provides it)."""

    def _gaps(self, conn: Connection) -> list[KeyGap]:
        """The keys and indexes of the existing tables that differ from the declared ones."""
        return key_gaps(conn, self.tables, self.settings.schema)

    def _finish_upgrade(self, gaps: list[KeyGap], force: bool) -> None:
        """Swap the keys of tables of 0.2 for the declared ones (each starts with the
        cluster), refusing while a node of 0.2 is live unless *force*; the rows of 0.2
        nodes leave the nodes table (a dialect hook: :meth:`_swap_keys`)."""
        with self.engine.connect() as conn:
            self.round_trips += 1
            old = self._old_nodes(conn, timedelta(seconds=self.settings.node_timeout))
            conn.rollback()
        if old and not force:
            raise UpgradeRefused(upgrade_refused_message(
                self.settings.qualified_table, old, self.settings.node_timeout))
        self._swap_keys(gaps)

    def _swap_keys(self, gaps: list[KeyGap]) -> None:
        """Replace each key or index of *gaps* with the declared one, drop the cluster
        columns' defaults and the heartbeat rows of 0.2 nodes (a dialect hook)."""
        raise NotImplementedError  # pragma: no cover - every SQL backend has one

    def _old_nodes(self, conn: Connection, within: timedelta) -> tuple[str, ...]:
        """The nodes of a version before clusters seen within *within*."""
        n = self.nodes_table.c
        if CLUSTER not in {c["name"] for c in inspect(conn).get_columns(
                self.nodes_table.name, schema=self.settings.schema)}:
            return ()
        now = self._db_now(conn)
        return tuple(conn.execute(select(n.node).where(
            n.cluster == LEGACY_NODE, n.last_seen >= self._param_time(now - within))
            .order_by(n.node)).scalars())

    def census(self, live_within: timedelta) -> ClusterCensus:
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                nodes = self.nodes_table.c
                found = set(conn.execute(select(nodes.cluster).distinct()).scalars())
                if self._legacy:  # another app in 0.2's tables: in the claims it makes
                    c = self.table.c
                    latest = select(c.cluster).order_by(c.claimed_at.desc()).limit(
                        CENSUS_CLAIMS).subquery()
                    found |= set(conn.execute(select(latest.c.cluster).distinct()).scalars())
                old = self._old_nodes(conn, live_within)
        clusters = tuple(sorted(found - {LEGACY_NODE}))
        return ClusterCensus(self.cluster, self._legacy or (), clusters, old)

    def _upgrade(self, conn: Connection, statements: Sequence[str],
                 on_step: Callable[[SchemaStep], None] | None) -> None:
        """Run the upgrade *statements* on *conn*, each told to *on_step* first, without
        the claim timeout (an index on a big table takes longer than a claim)."""
        if not statements:
            return
        with self._unbounded(conn):
            for number, statement in enumerate(statements, 1):
                if on_step is not None:
                    on_step(SchemaStep(number, len(statements), statement))
                conn.exec_driver_sql(statement)

    @contextlib.contextmanager
    def _unbounded(self, conn: Connection) -> Iterator[None]:
        """Let *conn* run statements longer than elarion_beat_claim_timeout meanwhile
        (a dialect hook: a database without such a timeout needs nothing)."""
        yield

    def _check_layout(self, conn: Connection, create: bool) -> None:
        """Check that the claims table has the layout of ``elarion_beat_claims_layout``
        and (with *create*) make what the layout needs besides the table; raise
        :class:`SchemaMissing` otherwise (a dialect hook: only one layout by default)."""

    def _upgrades(self, conn: Connection) -> list[str]:
        """The DDL that brings tables of an older version up to date (none when current):
        the columns added since 0.1, then the index of unpublished claims."""
        inspector = inspect(conn)
        schema = self.settings.schema
        columns = {c["name"] for c in inspector.get_columns(self.table.name, schema=schema)}
        table = self._quoted(self.table)
        stamp = self._timestamp_ddl()
        added = {"claim_token": f"VARCHAR({TOKEN_LENGTH})", "state": "VARCHAR(16)",
                 "published_at": stamp, "publish_error": "TEXT",
                 "takeovers": "INTEGER NOT NULL DEFAULT 0",
                 # 0.2 too: what ran (the workers' run tracking)
                 "run_state": "VARCHAR(16)", "started_at": stamp, "finished_at": stamp,
                 "worker": "TEXT", "runtime": self._ddl_type("runtime"), "run_error": "TEXT"}
        # 0.3: the revision of the database entry each occurrence ran under, and when
        # the cluster reported an orphan (each orphan once)
        added["revision"] = self._ddl_type("revision")
        added["orphan_reported_at"] = stamp
        out = [f"ALTER TABLE {table} ADD COLUMN {name} {ddl}"
               for name, ddl in added.items() if name not in columns]
        # clusters: the column, its default this cluster (what rows of 0.2 nodes take;
        # in the nodes table '', which marks a node of 0.2); the keys stay until init-db
        for each in self.tables:
            if each is not self.table and not inspector.has_table(each.name, schema=schema):
                continue
            have_columns = columns if each is self.table else {
                c["name"] for c in inspector.get_columns(each.name, schema=schema)}
            if CLUSTER not in have_columns:
                default = LEGACY_NODE if each is self.nodes_table else self.cluster
                out.append(f"ALTER TABLE {self._quoted(each)} ADD COLUMN {CLUSTER} "
                           f"{self._ddl_type(CLUSTER)} NOT NULL DEFAULT "
                           f"{self._literal(default)}")
        node_columns = {c["name"] for c in inspector.get_columns(self.nodes_table.name,
                                                                  schema=schema)}
        if "entries_version" not in node_columns:
            out.append(f"ALTER TABLE {self._quoted(self.nodes_table)} ADD COLUMN "
                       f"entries_version {self._ddl_type('revision')}")
        have = {i["name"] for i in inspector.get_indexes(self.table.name, schema=schema)}
        for index in (f"ix_{self.table.name}_pending", f"ix_{self.table.name}_job_claimed"):
            if index not in have:
                found = next(i for i in self.table.indexes if i.name == index)
                out.append(str(CreateIndex(found).compile(dialect=self.engine.dialect)))
        return out

    def _literal(self, value: str) -> str:
        """*value* as an SQL string literal of this dialect."""
        return str(literal(value).compile(dialect=self.engine.dialect,
                                          compile_kwargs={"literal_binds": True}))

    def _ddl_type(self, column: str) -> str:
        """The DDL type of one of the claims table's columns on this dialect."""
        return str(self.table.c[column].type.compile(dialect=self.engine.dialect))

    def _timestamp_ddl(self) -> str:
        """The DDL type of a timestamp column on this dialect."""
        return self._ddl_type("published_at")

    def _ready(self) -> None:
        if not self._schema_ready:
            self.ensure_schema()

    def _param_time(self, value: datetime) -> datetime:
        """How this dialect wants a datetime parameter (aware UTC by default)."""
        return as_utc(value)

    def _insert_ignoring(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert *rows* into the claims table (each naming this cluster): a row another
        writer inserted since the look is left as it is."""
        for row in rows:
            self._insert_or_skip(conn, self.table, {CLUSTER: self.cluster, **row})

    def _insert_or_skip(self, conn: Connection, table: Table, row: dict[str, Any]) -> bool:
        """Insert *row* into *table* unless a key of the table holds it already (whichever
        key: today's, or a table of 0.2's); whether it was inserted. A dialect hook: by
        default in a savepoint."""
        try:
            with conn.begin_nested():
                conn.execute(table.insert().values(**row))
            return True
        except sa_exc.IntegrityError:
            return False

    def close(self) -> None:
        self.engine.dispose()

    def describe(self) -> str:
        return f"{mask_dsn(self.settings.dsn)} (table {self.settings.qualified_table})"

    def _quoted(self, table: Table) -> str:
        return str(self.engine.dialect.identifier_preparer.format_table(table))


def missing_table_message(table: Table) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the table {name} does not exist and elarion_beat_create_table is False: "
            "create it with your migrations (celery_elarion_beat.claims_table(metadata) and "
            "nodes_table(metadata) declare the tables), run `celery -A proj elarion-beat "
            "init-db`, or set elarion_beat_create_table = True to let beat create it")


def outdated_table_message(table: Table, upgrades: list[str]) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the table {name} was made by an older celery-elarion-beat and "
            "elarion_beat_create_table is False: apply the migration (see docs/howto/"
            "migrations.md), run `celery -A proj elarion-beat init-db`, or run: "
            + "; ".join(upgrades))
