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
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect

from ..names import KEY_LENGTH
from ..settings import DEFAULT_TABLE

__all__ = ["DEFAULT_AUDIT_TABLE", "DEFAULT_NODES_TABLE", "DEFAULT_PAUSES_TABLE",
           "EVERY_NODE_KIND", "FAILED", "MANUAL_KIND", "PAUSED", "PENDING", "PUBLISHED",
           "RETRIED", "RUNNING", "RUN_FAILED", "SKIPPED", "STILL_RUNNING", "SUCCEEDED",
           "TOKEN_LENGTH", "UNFINISHED_RUNS", "UNPUBLISHED", "KeyName", "audit_table",
           "claims_table", "nodes_table", "pauses_table"]

#: A claim token is a uuid4 in text form.
TOKEN_LENGTH = 36

#: ``state`` of a claim whose message the broker has not accepted (yet).
PENDING = "pending"
#: ``state`` of a claim whose message the broker accepted.
PUBLISHED = "published"
#: ``state`` of a claim whose publish failed (``publish_error`` says why).
FAILED = "failed"
#: ``state`` of an occurrence decided but not sent: its job's previous run was still
#: running (``overlap: skip``); ``publish_error`` says ``still-running``.
SKIPPED = "skipped"
#: The ``publish_error`` of a ``skipped`` occurrence (the skip reason, :mod:`..outcome`).
STILL_RUNNING = "still-running"
#: The states of an unpublished claim: an orphan once older than the publish timeout.
UNPUBLISHED = (PENDING, FAILED)

#: ``run_state`` values, written by the workers (:mod:`..worker`): started, not finished;
RUNNING = "running"
#: finished without error;
SUCCEEDED = "succeeded"
#: raised (``run_error`` holds the exception type and message);
RUN_FAILED = "failed"
#: raised Retry: it will run again under the same task id, so it is not finished.
RETRIED = "retried"
#: The run states of a run that is not finished (NULL, not started yet, is one too).
UNFINISHED_RUNS = (RUNNING, RETRIED)
#: ``kind`` of a worker's record of an every-node run (no claim: one row per node's run).
EVERY_NODE_KIND = "node"
#: ``kind`` of a run an operator triggered (``elarion-beat trigger``, Flower's "Run now"):
#: its occurrence is the database clock when triggered. It is no slot and no window: the
#: schedule's own claims never count it (an interval job is not postponed by it).
MANUAL_KIND = "manual"
#: The ``publish_error`` of an occurrence ``skipped`` because its job was paused.
PAUSED = "paused"
_BINARY_KEYS = ("mysql", "mariadb")


class KeyName(TypeDecorator[str]):
    """A job or node name that is part of a key and compares byte for byte.

    ``VARCHAR(191)`` on PostgreSQL and SQLite (both compare text exactly).
    MariaDB/MySQL collations are case- and accent-insensitive and ignore trailing
    spaces, which would merge ``report``/``Report``, ``cafe``/``café`` and
    ``x``/``x `` into one claim: there the name is stored as its UTF-8 bytes in a
    ``VARBINARY`` wide enough for 191 characters of four bytes.
    """

    impl = String(KEY_LENGTH)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in _BINARY_KEYS:
            return dialect.type_descriptor(mysql.VARBINARY(KEY_LENGTH * 4))
        return dialect.type_descriptor(String(KEY_LENGTH))

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

DEFAULT_NODES_TABLE = "elarion_scheduler_nodes"


def claims_table(metadata: MetaData, name: str = DEFAULT_TABLE, schema: str | None = None,
                 partitioned: bool = False) -> Table:
    """Declare the claims table on *metadata* and return it.

    One row per claimed occurrence. ``(job_name, occurrence_utc)`` is the
    primary key that makes an exact slot winnable once. For a window claim
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
    ``ix_<table>_job_claimed`` finds a job's recent claims (the overlap check).

    *partitioned* (PostgreSQL, ``elarion_beat_claims_layout = "partitioned"``):
    the same table ``PARTITION BY RANGE (occurrence_utc)``; its partitions (one
    per UTC day, and a DEFAULT one) are made by the nodes (:mod:`.partitions`).
    """
    table = Table(
        name,
        metadata,
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
        PrimaryKeyConstraint("job_name", "occurrence_utc", name=f"{name}_pkey"),
        Index(f"ix_{name}_claimed_at", "claimed_at"),
        Index(f"ix_{name}_job_claimed", "job_name", "claimed_at"),
        schema=schema,
        comment="celery-elarion-beat: one row per claimed beat occurrence",
    )
    if partitioned:
        table.dialect_options["postgresql"]["partition_by"] = "RANGE (occurrence_utc)"
    unpublished = table.c.state.in_(UNPUBLISHED)
    Index(f"ix_{name}_pending", table.c.state, table.c.claimed_at,
          postgresql_where=unpublished, sqlite_where=unpublished)
    return table


def nodes_table(metadata: MetaData, name: str = DEFAULT_NODES_TABLE,
                schema: str | None = None) -> Table:
    """Declare the nodes table on *metadata* and return it.

    One row per beat node, upserted by its heartbeat: when it started, when it
    was last seen (database clock), its package version and schedule fingerprint,
    the digest of each entry (to name the entries that differ between nodes) and
    its outcome counts since start (JSON text, portable across databases).
    """
    return Table(
        name,
        metadata,
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
        PrimaryKeyConstraint("node", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: one heartbeat row per beat node",
    )


DEFAULT_PAUSES_TABLE = "elarion_scheduler_pauses"
DEFAULT_AUDIT_TABLE = "elarion_scheduler_audit"


def pauses_table(metadata: MetaData, name: str = DEFAULT_PAUSES_TABLE,
                 schema: str | None = None) -> Table:
    """Declare the pauses table on *metadata* and return it.

    One row per paused job (``elarion-beat pause``); the job name ``''`` pauses
    every job (``pause --all``). ``until_utc`` NULL: paused until resumed; else the
    pause ends by itself at that time (database clock). Read inside every claim.
    """
    return Table(
        name,
        metadata,
        Column("job_name", KeyName(), nullable=False),
        Column("paused_at", Timestamp, nullable=False),
        Column("paused_by", Text, nullable=False),
        Column("reason", Text, nullable=False),
        Column("until_utc", Timestamp, nullable=True),
        PrimaryKeyConstraint("job_name", name=f"{name}_pkey"),
        schema=schema,
        comment="celery-elarion-beat: jobs paused cluster-wide",
    )


def audit_table(metadata: MetaData, name: str = DEFAULT_AUDIT_TABLE,
                schema: str | None = None) -> Table:
    """Declare the audit table on *metadata* and return it.

    One row per operator action: ``pause``, ``resume`` or ``trigger``, who (the OS
    user and host, or the Flower user), when (database clock), which job (``''``:
    every job), why, until when, and a triggered run's task id.
    """
    table = Table(
        name,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
               autoincrement=True),
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
    Index(f"ix_{name}_at", table.c.at)
    Index(f"ix_{name}_job_at", table.c.job_name, table.c.at)
    return table
