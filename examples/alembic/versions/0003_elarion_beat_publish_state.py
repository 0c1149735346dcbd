"""celery-elarion-beat 0.2: what became of each claim after it was won.

* ``state`` (``VARCHAR(16)``, nullable): ``pending`` from the claim until the
  winner reports its publish, then ``published`` or ``failed``. NULL on rows
  written before this migration (they are never called orphans).
* ``published_at`` (timestamp, nullable), ``publish_error`` (text, nullable).
* ``takeovers`` (integer, default 0): how many times a live node re-claimed the
  orphaned claim to publish it (``delivery: at_least_once``).
* ``ix_elarion_scheduler_claims_pending`` on ``(state, claimed_at)``, partial
  (only unpublished rows) on PostgreSQL and SQLite: every node's look for orphans
  reads it.

The beat role now needs UPDATE on the claims table (docs/howto/database-role.md).

Revision ID: 0003_elarion_beat
Revises: 0002_elarion_beat
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003_elarion_beat"
down_revision: str | None = "0002_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "elarion_scheduler_claims"
_INDEX = "ix_elarion_scheduler_claims_pending"
_UNPUBLISHED = sa.text("state IN ('pending', 'failed')")


def upgrade() -> None:
    op.add_column(_TABLE, sa.Column("state", sa.String(length=16), nullable=True))
    op.add_column(_TABLE, sa.Column("published_at", sa.DateTime(timezone=True).with_variant(
        mysql.DATETIME(fsp=6), "mysql", "mariadb"), nullable=True))
    op.add_column(_TABLE, sa.Column("publish_error", sa.Text(), nullable=True))
    op.add_column(_TABLE, sa.Column("takeovers", sa.Integer(), nullable=False,
                                    server_default="0"))
    op.create_index(_INDEX, _TABLE, ["state", "claimed_at"],
                    postgresql_where=_UNPUBLISHED, sqlite_where=_UNPUBLISHED)


def downgrade() -> None:
    op.drop_index(_INDEX, table_name=_TABLE)
    with op.batch_alter_table(_TABLE) as batch:
        for column in ("takeovers", "publish_error", "published_at", "state"):
            batch.drop_column(column)
