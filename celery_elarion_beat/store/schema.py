"""Table definitions, for ``metadata.create_all`` and for Alembic.

``claims_table(metadata)`` declares the claims table on an application's own
``MetaData``, so a project that manages its schema with Alembic autogenerates
the table like any other (and sets ``elarion_beat_create_table = False``)::

    from celery_elarion_beat import claims_table
    claims_table(target_metadata, name="elarion_scheduler_claims", schema="ops")
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect

from ..config.names import CLUSTER_MAX, KEY_LENGTH
from ..config.settings import DEFAULT_TABLE
from .states import UNPUBLISHED

__all__ = ["CLUSTER", "DEFAULT_AUDIT_TABLE", "DEFAULT_ENTRIES_TABLE",
           "DEFAULT_FOREIGN_BEATS_TABLE", "DEFAULT_NODES_TABLE", "DEFAULT_ONE_OFFS_TABLE",
           "DEFAULT_PAUSES_TABLE", "DEFAULT_REVISIONS_TABLE", "DEFAULT_VERSIONS_TABLE",
           "TOKEN_LENGTH", "KeyName", "Revision", "Timestamp", "audit_table", "claims_table",
           "cluster_column", "entries_table", "foreign_beats_table", "nodes_table",
           "one_offs_table", "pauses_table", "revisions_table", "versions_table"]

#: A claim token is a uuid4 in text form.
TOKEN_LENGTH = 36

_BINARY_KEYS = ("mysql", "mariadb")


class KeyName(TypeDecorator[str]):
    """A job, node or cluster name that is part of a key and compares byte for byte.

    ``VARCHAR(191)`` on PostgreSQL and SQLite (both compare text exactly).
    MariaDB/MySQL collations are case- and accent-insensitive and ignore trailing
    spaces, which would merge ``report``/``Report``, ``cafe``/``café`` and
    ``x``/``x `` into one claim: there the name is stored as its UTF-8 bytes in a
    ``VARBINARY`` wide enough for 191 characters of four bytes. *length*: the
    characters (a cluster name has :data:`~..config.names.CLUSTER_MAX`).
    """

    impl = String(KEY_LENGTH)
    cache_ok = True

    def __init__(self, length: int = KEY_LENGTH) -> None:
        super().__init__()
        self.length = length

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in _BINARY_KEYS:
            return dialect.type_descriptor(mysql.VARBINARY(self.length * 4))
        return dialect.type_descriptor(String(self.length))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, str) and dialect.name in _BINARY_KEYS:
            return value.encode("utf-8")
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).decode("utf-8")
        return value

#: Aware timestamps; microseconds on MariaDB/MySQL too (DATETIME(6)), stored as UTC.
Timestamp = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

#: A version or revision number (a 64-bit counter; INTEGER on SQLite, its row key type).
Revision = BigInteger().with_variant(Integer, "sqlite")

DEFAULT_NODES_TABLE = "elarion_scheduler_nodes"

#: The column that names the cluster (``elarion_beat_cluster``) a row belongs to: the
#: first column of every key, so several apps share one set of tables and never meet.
CLUSTER = "cluster"


def cluster_column() -> Column[str]:
    """The ``cluster`` column of every table (no server default: each row names its
    cluster; an upgraded table of 0.2 has one until ``init-db`` finishes the upgrade)."""
    return Column(CLUSTER, KeyName(CLUSTER_MAX), nullable=False)


def claims_table(metadata: MetaData, name: str = DEFAULT_TABLE, schema: str | None = None,
                 partitioned: bool = False) -> Table:
    """Declare the claims table on *metadata* and return it.

    One row per claimed occurrence. ``(cluster, job_name, occurrence_utc)`` is the
    primary key that makes an exact slot winnable once in each cluster
    (``elarion_beat_cluster``: the app; several apps share one table and never
    meet). For a window claim
    ``occurrence_utc`` is the claim time on the database clock. ``claim_token``
    is unique to the store call that inserted the row (or took it over): a call
    retried after a lost reply recognises its own row by it, never by node name
    or task id.

    ``state`` follows the occurrence after its claim: ``pending`` until the
    broker accepts the message, then ``published`` (with ``published_at``), or
    ``failed`` (with ``publish_error``); NULL on rows of versions before 0.2 and
    on claims that publish nothing (the purge election). A ``pending`` or
    ``failed`` row older than ``elarion_beat_publish_timeout`` is an orphan;
    ``takeovers`` counts the nodes that re-claimed it to publish it
    (``delivery: at_least_once``). The ``ix_<table>_pending`` index holds only
    the unpublished rows where the database has partial indexes. ``skipped``
    marks an occurrence the cluster decided not to send (``overlap: skip`` found
    the job's previous run unfinished).

    The workers follow the run (:mod:`celery_elarion_beat.worker`): ``run_state``
    (``running``, then ``succeeded``, ``failed`` or ``retried``), ``started_at``
    and ``finished_at`` (database clock), ``worker`` (the worker's host name),
    ``runtime`` (seconds, measured by the worker) and ``run_error``. A row of
    kind ``node`` is a worker's record of an every-node run (never a claim).
    ``ix_<table>_job_claimed`` finds a job's recent claims (the overlap check). Every
    index leads with ``cluster``: each query reads one cluster's rows.
    ``revision``: the revision of the database entry the occurrence was claimed under
    (NULL for a code entry; see :func:`entries_table`). ``orphan_reported_at``: when
    the cluster reported the claim orphaned (database clock), set by the one node whose
    UPDATE found it unset, so each orphan is reported once, whatever the nodes and their
    restarts; a mark older than ``claimed_at`` is of the claim before a takeover
    (the takeover writes no column it did not write before).

    *partitioned* (PostgreSQL, ``elarion_beat_claims_layout = "partitioned"``):
    the same table ``PARTITION BY RANGE (occurrence_utc)``; its partitions (one
    per UTC day, and a DEFAULT one) are made by the nodes (:mod:`.partitions`).
    """
    table = Table(
        name,
        metadata,
        cluster_column(),
        Column("job_name", KeyName(), nullable=False),
        Column("occurrence_utc", Timestamp, nullable=False),
        Column("node", Text, nullable=False),
        Column("task_id", Text, nullable=False),
        Column("kind", String(16), nullable=False),
        Column("claimed_at", Timestamp, nullable=False),
        Column("claim_token", String(TOKEN_LENGTH), nullable=True),
        Column("state", String(16), nullable=True),
        Column("published_at", Timestamp, nullable=True),
        Column("publish_error", Text, nullable=True),
        Column("takeovers", Integer, nullable=False, server_default="0"),
        Column("run_state", String(16), nullable=True),
        Column("started_at", Timestamp, nullable=True),
        Column("finished_at", Timestamp, nullable=True),
        Column("worker", Text, nullable=True),
        Column("runtime", Float, nullable=True),
        Column("run_error", Text, nullable=True),
        Column("revision", Revision, nullable=True),
        Column("orphan_reported_at", Timestamp, nullable=True),
        PrimaryKeyConstraint(CLUSTER, "job_name", "occurrence_utc", name=f"{name}_pkey"),
        Index(f"ix_{name}_claimed_at", CLUSTER, "claimed_at"),
        Index(f"ix_{name}_job_claimed", CLUSTER, "job_name", "claimed_at"),
        schema=schema,
        comment="celery-elarion-beat: one row per claimed beat occurrence",
    )
    if partitioned:
        table.dialect_options["postgresql"]["partition_by"] = "RANGE (occurrence_utc)"
    unpublished = table.c.state.in_(UNPUBLISHED)
    Index(f"ix_{name}_pending", table.c.cluster, table.c.state, table.c.claimed_at,
          postgresql_where=unpublished, sqlite_where=unpublished)
    return table


def nodes_table(metadata: MetaData, name: str = DEFAULT_NODES_TABLE,
                schema: str | None = None) -> Table:
    """Declare the nodes table on *metadata* and return it.

    One row per beat node of each cluster (key ``(cluster, node)``), upserted by its
    heartbeat: when it started, when it
    was last seen (database clock), its package version and schedule fingerprint,
    the digest of each entry (to name the entries that differ between nodes) and
    its outcome counts since start (JSON text, portable across databases), and
    the version of the database entries it runs (``entries_version``; NULL: none).
    """
    return Table(
        name,
        metadata,
        cluster_column(),
        Column("node", KeyName(), nullable=False),
        Column("boot_id", String(36), nullable=False),
        Column("started_at", Timestamp, nullable=False),
        Column("last_seen", Timestamp, nullable=False),
        Column("version", String(64), nullable=False),
        Column("fingerprint", String(64), nullable=False),
        Column("entries", Text, nullable=False),
        Column("counts", Text, nullable=False),
        Column("host", Text, nullable=False),
        Column("pid", Integer, nullable=False),
        Column("entries_version", Revision, nullable=True),
        PrimaryKeyConstraint(CLUSTER, "node", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: one heartbeat row per beat node",
    )


DEFAULT_PAUSES_TABLE = "elarion_scheduler_pauses"
DEFAULT_AUDIT_TABLE = "elarion_scheduler_audit"


def pauses_table(metadata: MetaData, name: str = DEFAULT_PAUSES_TABLE,
                 schema: str | None = None) -> Table:
    """Declare the pauses table on *metadata* and return it.

    One row per paused job of each cluster (``elarion-beat pause``; key ``(cluster,
    job_name)``); the job name ``''`` pauses every job of the cluster (``pause
    --all``). ``until_utc`` NULL: paused until resumed; else the
    pause ends by itself at that time (database clock). Read inside every claim.
    """
    return Table(
        name,
        metadata,
        cluster_column(),
        Column("job_name", KeyName(), nullable=False),
        Column("paused_at", Timestamp, nullable=False),
        Column("paused_by", Text, nullable=False),
        Column("reason", Text, nullable=False),
        Column("until_utc", Timestamp, nullable=True),
        PrimaryKeyConstraint(CLUSTER, "job_name", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: jobs paused cluster-wide",
    )


def audit_table(metadata: MetaData, name: str = DEFAULT_AUDIT_TABLE,
                schema: str | None = None) -> Table:
    """Declare the audit table on *metadata* and return it.

    One row per operator action: ``pause``, ``resume`` or ``trigger``, who (the OS
    user and host, or the Flower user), when (database clock), which job (``''``:
    every job), why, until when, and a triggered run's task id; in the cluster's rows
    (its indexes lead with ``cluster``).
    """
    table = Table(
        name,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
               autoincrement=True),
        cluster_column(),
        Column("at", Timestamp, nullable=False),
        Column("actor", Text, nullable=False),
        Column("action", String(16), nullable=False),
        Column("job_name", KeyName(), nullable=False),
        Column("reason", Text, nullable=False),
        Column("until_utc", Timestamp, nullable=True),
        Column("task_id", Text, nullable=True),
        Column("detail", Text, nullable=False),
        schema=schema,
        comment="celery-elarion-beat: who paused, resumed or triggered what, and why",
    )
    Index(f"ix_{name}_at", table.c.cluster, table.c.at)
    Index(f"ix_{name}_job_at", table.c.cluster, table.c.job_name, table.c.at)
    return table


DEFAULT_ONE_OFFS_TABLE = "elarion_scheduler_oneoffs"


def one_offs_table(metadata: MetaData, name: str = DEFAULT_ONE_OFFS_TABLE,
                   schema: str | None = None) -> Table:
    """Declare the one-offs table on *metadata* and return it.

    One row per one-off (``celery_elarion_beat.schedule_once``): ``id`` (uuid4 text,
    also the task id), ``idem_key`` (unique where set: scheduling twice with one key
    writes one row; unique within the cluster), ``task_name``, ``due_utc``,
    ``state`` (:class:`OneOffState`),
    ``created_at``, the lease (``lease_node``, ``lease_until``, ``attempts``),
    ``published_at``, ``finished_at`` (published, failed or cancelled: the purge
    counts from it), ``error``, ``options`` (JSON text) and the payload
    (``content_type``, ``content_encoding``, ``body``). Times are on the database
    clock. ``ix_<table>_due`` on ``(cluster, state, due_utc)`` finds the due rows of a
    cluster: each app leases only its own one-offs.
    """
    table = Table(
        name,
        metadata,
        cluster_column(),
        Column("id", String(36), nullable=False),
        Column("idem_key", KeyName(), nullable=True),
        Column("task_name", Text, nullable=False),
        Column("due_utc", Timestamp, nullable=False),
        Column("state", String(16), nullable=False),
        Column("created_at", Timestamp, nullable=False),
        Column("lease_node", Text, nullable=True),
        Column("lease_until", Timestamp, nullable=True),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("published_at", Timestamp, nullable=True),
        Column("finished_at", Timestamp, nullable=True),
        Column("error", Text, nullable=True),
        Column("options", Text, nullable=False),
        Column("content_type", String(128), nullable=False),
        Column("content_encoding", String(64), nullable=False),
        Column("body", LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
               nullable=False),
        PrimaryKeyConstraint("id", name=f"{name}_pkey"),
        UniqueConstraint(CLUSTER, "idem_key", name=f"uq_{name}_key"),
        schema=schema,
        comment="celery-elarion-beat: tasks scheduled once (schedule_once)",
    )
    Index(f"ix_{name}_due", table.c.cluster, table.c.state, table.c.due_utc)
    Index(f"ix_{name}_finished", table.c.cluster, table.c.finished_at)
    return table


DEFAULT_FOREIGN_BEATS_TABLE = "elarion_scheduler_foreign_beats"


def foreign_beats_table(metadata: MetaData, name: str = DEFAULT_FOREIGN_BEATS_TABLE,
                        schema: str | None = None) -> Table:
    """Declare the foreign beats table on *metadata* and return it.

    One row per cluster (the app whose workers saw them), sender of beat messages that
    claim nothing (a stock beat among the replicas) and task, written by the workers
    that saw them (:mod:`celery_elarion_beat.worker.foreign_beats`): ``origin`` (the message's
    ``origin`` header, ``gen<pid>@<host>``), ``task_name``, ``entry`` (the app's
    ``beat_schedule`` entry with that task, if any), ``messages`` (how many the workers
    saw), ``first_seen`` and ``last_seen`` (database clock) and ``worker`` (the last
    worker that saw one). ``elarion-beat status`` reads it.
    """
    table = Table(
        name,
        metadata,
        cluster_column(),
        Column("origin", KeyName(), nullable=False),
        Column("task_name", KeyName(), nullable=False),
        Column("entry", Text, nullable=True),
        Column("messages", BigInteger, nullable=False),
        Column("first_seen", Timestamp, nullable=False),
        Column("last_seen", Timestamp, nullable=False),
        Column("worker", Text, nullable=False),
        PrimaryKeyConstraint(CLUSTER, "origin", "task_name", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: beats that send without claiming, as the workers saw them",
    )
    Index(f"ix_{name}_last_seen", table.c[CLUSTER], table.c.last_seen)
    return table


DEFAULT_ENTRIES_TABLE = "elarion_scheduler_entries"
DEFAULT_REVISIONS_TABLE = "elarion_scheduler_revisions"
DEFAULT_VERSIONS_TABLE = "elarion_scheduler_versions"


def entries_table(metadata: MetaData, name: str = DEFAULT_ENTRIES_TABLE,
                  schema: str | None = None) -> Table:
    """Declare the database entries table (live schedules) on *metadata* and return it.

    One row per entry of a cluster (``cluster``: the app, see
    :func:`celery_elarion_beat.config.live_entries.live_cluster`): its ``task``, its
    ``schedule``, ``args``, ``kwargs`` and ``options`` (JSON text), whether it is
    ``enabled``; ``revision`` (the cluster's version at its last change, set by the
    table's triggers), ``effective_at`` (from when that revision governs the
    occurrences), ``updated_at``, ``actor`` and ``reason`` of the last change;
    ``overrides`` (it replaces the code entry of its name, whose digest was
    ``code_digest``) and ``restart`` (an interval's phase restarts at ``effective_at``).
    Every write, raw SQL included, is also a row of :func:`revisions_table` and a bump
    of :func:`versions_table` (the triggers of :mod:`.entry_triggers`).
    """
    return Table(
        name,
        metadata,
        cluster_column(),
        Column("name", KeyName(), nullable=False),
        Column("task", Text, nullable=False),
        Column("schedule", Text, nullable=False),
        Column("args", Text, nullable=False),
        Column("kwargs", Text, nullable=False),
        Column("options", Text, nullable=False),
        Column("enabled", Boolean, nullable=False, server_default="1"),
        Column("revision", Revision, nullable=False, server_default="0"),
        Column("effective_at", Timestamp, nullable=True),
        Column("updated_at", Timestamp, nullable=True),
        Column("actor", Text, nullable=True),
        Column("reason", Text, nullable=True),
        Column("overrides", Boolean, nullable=False, server_default="0"),
        Column("code_digest", String(64), nullable=True),
        Column("restart", Boolean, nullable=False, server_default="0"),
        PrimaryKeyConstraint(CLUSTER, "name", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: schedule entries kept in the database",
    )


def revisions_table(metadata: MetaData, name: str = DEFAULT_REVISIONS_TABLE,
                    schema: str | None = None) -> Table:
    """Declare the revisions table on *metadata* and return it.

    One row per change of a database entry, written by the entries table's triggers
    (so a raw SQL statement leaves one too): the entry as the change left it (for
    ``remove``: as it was), ``revision`` (the cluster's version: every row of one
    transaction of the API shares it), ``action`` (add, edit, remove, enable, disable,
    override), ``effective_at``, ``at``, ``actor`` (``sql:<role>`` for raw SQL) and
    ``reason``. The audit, and the change feed the beat nodes load:
    ``(cluster, revision)`` is its key order; ``ix_<table>_name`` serves an entry's
    history and the claims' revision check.
    """
    table = Table(
        name,
        metadata,
        cluster_column(),
        Column("revision", Revision, nullable=False),
        Column("name", KeyName(), nullable=False),
        Column("action", String(16), nullable=False),
        Column("task", Text, nullable=False),
        Column("schedule", Text, nullable=False),
        Column("args", Text, nullable=False),
        Column("kwargs", Text, nullable=False),
        Column("options", Text, nullable=False),
        Column("enabled", Boolean, nullable=False),
        Column("effective_at", Timestamp, nullable=False),
        Column("at", Timestamp, nullable=False),
        Column("actor", Text, nullable=False),
        Column("reason", Text, nullable=False),
        Column("overrides", Boolean, nullable=False, server_default="0"),
        Column("code_digest", String(64), nullable=True),
        Column("restart", Boolean, nullable=False, server_default="0"),
        PrimaryKeyConstraint(CLUSTER, "revision", "name", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: every change of a database schedule entry",
    )
    Index(f"ix_{name}_name", table.c.cluster, table.c.name, table.c.revision)
    return table


def versions_table(metadata: MetaData, name: str = DEFAULT_VERSIONS_TABLE,
                   schema: str | None = None) -> Table:
    """Declare the versions table on *metadata* and return it.

    One row per cluster: ``version``, bumped by every write of its entries (the nodes
    poll it: one key read). A writer of the API locks the row first, so the versions
    are given in commit order; ``batch``, ``actor``, ``reason`` and ``at`` are set for
    the length of such a write (the triggers read them: one version for the whole
    write), and are back to 0 and empty when it commits. A claim of a database entry
    reads the row ``FOR SHARE`` before checking its revision.
    """
    return Table(
        name,
        metadata,
        cluster_column(),
        Column("version", Revision, nullable=False),
        Column("batch", Integer, nullable=False, server_default="0"),
        Column("actor", Text, nullable=True),
        Column("reason", Text, nullable=True),
        Column("at", Timestamp, nullable=True),
        PrimaryKeyConstraint(CLUSTER, name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: the version of each cluster's database entries",
    )
