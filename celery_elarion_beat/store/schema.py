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
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    func,
)

from ..settings import DEFAULT_TABLE

__all__ = ["claims_table"]


def claims_table(metadata: MetaData, name: str = DEFAULT_TABLE, schema: str | None = None) -> Table:
    """Declare the claims table on *metadata* and return it.

    One row per claimed occurrence. ``(job_name, occurrence_utc)`` is the
    primary key that makes an exact slot winnable once. For a window claim
    ``occurrence_utc`` is the claim time on the database clock.
    """
    return Table(
        name,
        metadata,
        Column("job_name", Text, nullable=False),
        Column("occurrence_utc", DateTime(timezone=True), nullable=False),
        Column("node", Text, nullable=False),
        Column("task_id", Text, nullable=False),
        Column("kind", String(16), nullable=False),
        Column("claimed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint("job_name", "occurrence_utc", name=f"{name}_pkey"),
        Index(f"ix_{name}_claimed_at", "claimed_at"),
        schema=schema,
        comment="celery-elarion-beat: one row per claimed beat occurrence",
    )
