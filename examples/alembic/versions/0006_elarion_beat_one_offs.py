"""celery-elarion-beat 0.2: durable one-offs (``celery_elarion_beat.schedule_once``).

* ``elarion_scheduler_oneoffs``: one row per one-off: its id (also the task id), an
  optional idempotency key (unique), the task, when it is due (UTC, database clock),
  its state (scheduled, leased, published, failed, cancelled), the lease (node, until
  when, attempts), when it was published or finished, the error, its options (JSON
  text) and its serialized arguments. ``ix_..._due`` on ``(state, due_utc)`` finds
  the due rows; ``ix_..._finished`` serves the purge.

The beat role needs SELECT, INSERT, UPDATE and DELETE on it (the purge deletes old
finished rows); a role that only schedules needs SELECT and INSERT (and UPDATE to
cancel). Keys are ``VARBINARY(764)`` on MariaDB and MySQL (byte-exact), the
arguments ``LONGBLOB``.

Revision ID: 0006_elarion_beat
Revises: 0005_elarion_beat
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0006_elarion_beat"
down_revision: str | None = "0005_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ONE_OFFS = "elarion_scheduler_oneoffs"
_TIMESTAMP = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: A byte-exact key: VARBINARY on MariaDB and MySQL (whose collations merge names).
_KEY = sa.String(length=191).with_variant(mysql.VARBINARY(764), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        _ONE_OFFS,
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("idem_key", _KEY, nullable=True),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("due_utc", _TIMESTAMP, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", _TIMESTAMP, nullable=False),
        sa.Column("lease_node", sa.Text(), nullable=True),
        sa.Column("lease_until", _TIMESTAMP, nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("published_at", _TIMESTAMP, nullable=True),
        sa.Column("finished_at", _TIMESTAMP, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("content_type", sa.String(length=128), nullable=False),
        sa.Column("content_encoding", sa.String(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
                  nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"{_ONE_OFFS}_pkey"),
        sa.UniqueConstraint("idem_key", name=f"uq_{_ONE_OFFS}_key"),
        comment="celery-elarion-beat: tasks scheduled once (schedule_once)",
    )
    op.create_index(f"ix_{_ONE_OFFS}_due", _ONE_OFFS, ["state", "due_utc"])
    op.create_index(f"ix_{_ONE_OFFS}_finished", _ONE_OFFS, ["finished_at"])


def downgrade() -> None:
    op.drop_table(_ONE_OFFS)
