"""celery-elarion-beat 0.3: each orphan reported once by the cluster.

* ``elarion_scheduler_claims.orphan_reported_at`` (timestamp, nullable): when the
  cluster reported the claim orphaned (database clock). The one node whose UPDATE
  finds it NULL logs the WARNING and sends the ``elarion-orphaned`` event; every other
  node, and a restarted one, reads the mark and stays quiet. A takeover clears it.

No grant changes: the beat role updates the claims table already.

Revision ID: 0011_elarion_beat
Revises: 0010_elarion_beat
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0011_elarion_beat"
down_revision: str | None = "0010_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLAIMS = "elarion_scheduler_claims"
_TIMESTAMP = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column(_CLAIMS, sa.Column("orphan_reported_at", _TIMESTAMP, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(_CLAIMS) as batch:
        batch.drop_column("orphan_reported_at")
