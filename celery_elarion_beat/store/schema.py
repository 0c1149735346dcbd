"""Table definitions, for ``metadata.create_all`` and for Alembic.

``claims_table(metadata)`` declares the claims table on an application's own
``MetaData``, so a project that manages its schema with Alembic autogenerates
the table like any other (and sets ``elarion_beat_create_table = False``)::

    from celery_elarion_beat import claims_table
    claims_table(target_metadata, name="elarion_scheduler_claims", schema="ops")
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql

from ..settings import DEFAULT_TABLE

__all__ = ["DEFAULT_NODES_TABLE", "claims_table", "nodes_table"]

#: Aware timestamps; microseconds on MariaDB/MySQL too (DATETIME(6)), stored as UTC.
Timestamp = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

DEFAULT_NODES_TABLE = "elarion_scheduler_nodes"


def claims_table(metadata: MetaData, name: str = DEFAULT_TABLE, schema: str | None = None) -> Table:
    """Declare the claims table on *metadata* and return it.

    One row per claimed occurrence. ``(job_name, occurrence_utc)`` is the
    primary key that makes an exact slot winnable once. For a window claim
    ``occurrence_utc`` is the claim time on the database clock.
    """
    return Table(
        name,
        metadata,
        Column("job_name", String(191), nullable=False),
        Column("occurrence_utc", Timestamp, nullable=False),
        Column("node", Text, nullable=False),
        Column("task_id", Text, nullable=False),
        Column("kind", String(16), nullable=False),
        Column("claimed_at", Timestamp, nullable=False),
        PrimaryKeyConstraint("job_name", "occurrence_utc", name=f"{name}_pkey"),
        Index(f"ix_{name}_claimed_at", "claimed_at"),
        schema=schema,
        comment="celery-elarion-beat: one row per claimed beat occurrence",
    )


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
        Column("node", String(191), nullable=False),
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
