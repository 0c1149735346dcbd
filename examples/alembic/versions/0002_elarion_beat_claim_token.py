"""celery-elarion-beat 0.2: a claim token per row, byte-exact names on MariaDB/MySQL.

* ``claim_token`` (``VARCHAR(36)``, nullable): the store call that inserted a row
  writes its own random token, so a call retried after a lost reply recognises
  its own row, and never the row of another beat process under the same node
  name (which carries the same deterministic task id).
* On MariaDB and MySQL, ``job_name`` and ``node`` become ``VARBINARY(764)``: the
  server's collations compare ``report``/``Report``, ``cafe``/``café`` and
  ``x``/``x `` as equal, which merged different jobs into one claim. PostgreSQL
  and SQLite already compare text byte for byte.

Revision ID: 0002_elarion_beat
Revises: 0001_elarion_beat
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0002_elarion_beat"
down_revision: str | None = "0001_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BINARY = ("mysql", "mariadb")


def upgrade() -> None:
    op.add_column("elarion_scheduler_claims",
                  sa.Column("claim_token", sa.String(length=36), nullable=True))
    if op.get_context().dialect.name in _BINARY:
        op.alter_column("elarion_scheduler_claims", "job_name",
                        type_=mysql.VARBINARY(764), existing_nullable=False)
        op.alter_column("elarion_scheduler_nodes", "node",
                        type_=mysql.VARBINARY(764), existing_nullable=False)


def downgrade() -> None:
    if op.get_context().dialect.name in _BINARY:
        op.alter_column("elarion_scheduler_nodes", "node",
                        type_=sa.String(length=191), existing_nullable=False)
        op.alter_column("elarion_scheduler_claims", "job_name",
                        type_=sa.String(length=191), existing_nullable=False)
    with op.batch_alter_table("elarion_scheduler_claims") as batch:
        batch.drop_column("claim_token")
