"""celery-elarion-beat: the claims and nodes tables.

What ``alembic revision --autogenerate`` writes for ``claims_table(metadata)`` and
``nodes_table(metadata)`` (celery-elarion-beat 0.1), tidied. The timestamps are
``timestamptz`` on PostgreSQL and ``DATETIME(6)`` (microseconds, UTC) on MariaDB
and MySQL, where ``job_name`` and ``node`` are ``VARCHAR(191)`` so the primary
keys fit an index on ``utf8mb4``.

Revision ID: 0001_elarion_beat
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0001_elarion_beat"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: An aware timestamp, DATETIME(6) on MariaDB and MySQL.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "elarion_scheduler_claims",
        sa.Column("job_name", sa.String(length=191), nullable=False),
        sa.Column("occurrence_utc", Timestamp, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("claimed_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("job_name", "occurrence_utc",
                                name="elarion_scheduler_claims_pkey"),
        comment="celery-elarion-beat: one row per claimed beat occurrence",
    )
    # the purge deletes by claim time
    op.create_index("ix_elarion_scheduler_claims_claimed_at", "elarion_scheduler_claims",
                    ["claimed_at"], unique=False)
    op.create_table(
        "elarion_scheduler_nodes",
        sa.Column("node", sa.String(length=191), nullable=False),
        sa.Column("boot_id", sa.String(length=36), nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("last_seen", Timestamp, nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("entries", sa.Text(), nullable=False),
        sa.Column("counts", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("node", name="elarion_scheduler_nodes_pkey"),
        comment="celery-elarion-beat: one heartbeat row per beat node",
    )


def downgrade() -> None:
    op.drop_table("elarion_scheduler_nodes")
    op.drop_index("ix_elarion_scheduler_claims_claimed_at",
                  table_name="elarion_scheduler_claims")
    op.drop_table("elarion_scheduler_claims")
