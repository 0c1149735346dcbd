"""celery-elarion-beat 0.3: beats that send without claiming, as the workers saw them.

* ``elarion_scheduler_foreign_beats``: one row per cluster (the app whose workers saw
  them), sender of beat messages that claim nothing (a stock beat among the replicas)
  and task: the sender's ``origin``
  (``gen<pid>@<host>``), the task, the app's entry with that task, how many messages
  the workers saw, when first and last (database clock), and the last worker that saw
  one. ``ix_..._last_seen`` (cluster first) serves ``elarion-beat status --since`` and
  the retention.

The workers' role needs SELECT, INSERT, UPDATE and DELETE on it; the operators' role
(``status``) SELECT; beat none (docs/howto/database-role.md). Keys are
``VARBINARY(764)`` on MariaDB and MySQL (byte-exact).

Revision ID: 0009_elarion_beat
Revises: 0008_elarion_beat
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0009_elarion_beat"
down_revision: str | None = "0008_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FOREIGN = "elarion_scheduler_foreign_beats"
_TIMESTAMP = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: A byte-exact key: VARBINARY on MariaDB and MySQL (whose collations merge names).
_KEY = sa.String(length=191).with_variant(mysql.VARBINARY(764), "mysql", "mariadb")
#: The cluster (the app, ``elarion_beat_cluster``): byte-exact too, at most 64 characters.
_CLUSTER = sa.String(length=64).with_variant(mysql.VARBINARY(256), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        _FOREIGN,
        sa.Column("cluster", _CLUSTER, nullable=False),
        sa.Column("origin", _KEY, nullable=False),
        sa.Column("task_name", _KEY, nullable=False),
        sa.Column("entry", sa.Text(), nullable=True),
        sa.Column("messages", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", _TIMESTAMP, nullable=False),
        sa.Column("last_seen", _TIMESTAMP, nullable=False),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "origin", "task_name", name=f"{_FOREIGN}_pkey"),
        comment="celery-elarion-beat: beats that send without claiming, as the workers saw them",
    )
    op.create_index(f"ix_{_FOREIGN}_last_seen", _FOREIGN, ["cluster", "last_seen"])


def downgrade() -> None:
    op.drop_table(_FOREIGN)
