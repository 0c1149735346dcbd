"""celery-elarion-beat 0.2: what ran, recorded by the workers (``install_worker``).

* ``run_state`` (``VARCHAR(16)``, nullable): ``running`` from the worker's start,
  then ``succeeded``, ``failed`` or ``retried``. NULL until a worker starts the
  run, and on rows written before this migration.
* ``started_at``, ``finished_at`` (timestamps, nullable; the database clock).
* ``worker`` (text, nullable): the host name of the worker that ran it.
* ``runtime`` (float, nullable): seconds from start to finish, measured by the worker.
* ``run_error`` (text, nullable): the exception of a failed run (``Type: message``).
* ``ix_elarion_scheduler_claims_job_claimed`` on ``(job_name, claimed_at)``: the
  ``overlap: skip`` check inside every claim reads the job's recent claims through it.

The workers' role needs UPDATE of the run columns and INSERT (every-node runs get
rows of their own); the beat role needs nothing new (docs/howto/database-role.md).

Revision ID: 0004_elarion_beat
Revises: 0003_elarion_beat
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0004_elarion_beat"
down_revision: str | None = "0003_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "elarion_scheduler_claims"
_INDEX = "ix_elarion_scheduler_claims_job_claimed"
_TIMESTAMP = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column(_TABLE, sa.Column("run_state", sa.String(length=16), nullable=True))
    op.add_column(_TABLE, sa.Column("started_at", _TIMESTAMP, nullable=True))
    op.add_column(_TABLE, sa.Column("finished_at", _TIMESTAMP, nullable=True))
    op.add_column(_TABLE, sa.Column("worker", sa.Text(), nullable=True))
    op.add_column(_TABLE, sa.Column("runtime", sa.Float(), nullable=True))
    op.add_column(_TABLE, sa.Column("run_error", sa.Text(), nullable=True))
    op.create_index(_INDEX, _TABLE, ["job_name", "claimed_at"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name=_TABLE)
    with op.batch_alter_table(_TABLE) as batch:
        for column in ("run_error", "runtime", "worker", "finished_at", "started_at",
                       "run_state"):
            batch.drop_column(column)
