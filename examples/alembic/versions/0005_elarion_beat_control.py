"""celery-elarion-beat 0.2: live control (``elarion-beat pause|resume|trigger|audit``).

* ``elarion_scheduler_pauses``: one row per paused job (``''``: every job, from
  ``pause --all``), who paused it, why, and until when (NULL: until resumed). Every
  claim reads it, so the beat role needs SELECT on it.
* ``elarion_scheduler_audit``: one row per pause, resume and trigger: who, when,
  which job, why, until when, and the triggered run's task id.

The operators' role (the CLI, Flower) needs SELECT, INSERT and DELETE on the pauses
table, SELECT and INSERT on the audit table (and, on PostgreSQL, USAGE on its id
sequence), and SELECT, INSERT and UPDATE (state, published_at, publish_error) on the
claims table: a triggered run is a claim of kind ``manual`` whose publish it reports
(docs/howto/database-role.md). Job names are ``VARBINARY(764)`` on MariaDB and
MySQL, as in the claims table (byte-exact keys).

Revision ID: 0005_elarion_beat
Revises: 0004_elarion_beat
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0005_elarion_beat"
down_revision: str | None = "0004_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PAUSES = "elarion_scheduler_pauses"
_AUDIT = "elarion_scheduler_audit"
_TIMESTAMP = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: A byte-exact job name: VARBINARY on MariaDB and MySQL (whose collations merge names).
_KEY = sa.String(length=191).with_variant(mysql.VARBINARY(764), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        _PAUSES,
        sa.Column("job_name", _KEY, nullable=False),
        sa.Column("paused_at", _TIMESTAMP, nullable=False),
        sa.Column("paused_by", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("until_utc", _TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("job_name", name=f"{_PAUSES}_pkey"),
        comment="celery-elarion-beat: jobs paused cluster-wide",
    )
    op.create_table(
        _AUDIT,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("at", _TIMESTAMP, nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("job_name", _KEY, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("until_utc", _TIMESTAMP, nullable=True),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        comment="celery-elarion-beat: who paused, resumed or triggered what, and why",
    )
    op.create_index(f"ix_{_AUDIT}_at", _AUDIT, ["at"])
    op.create_index(f"ix_{_AUDIT}_job_at", _AUDIT, ["job_name", "at"])


def downgrade() -> None:
    op.drop_table(_AUDIT)
    op.drop_table(_PAUSES)
