"""celery-elarion-beat 0.3: live schedules (database entries edited while the cluster runs).

* ``elarion_scheduler_claims.revision`` (``BIGINT``, nullable): the revision of the
  database entry each occurrence ran under (NULL for a code entry);
* ``elarion_scheduler_nodes.entries_version`` (``BIGINT``, nullable): the version of
  the database entries each node runs (``status`` tells a node behind from drift);
* ``elarion_scheduler_entries``: one row per database entry, key ``(cluster, name)``;
* ``elarion_scheduler_revisions``: every change (the audit and the change feed), key
  ``(cluster, revision, name)``, ``ix_..._name`` on ``(cluster, name, revision)``;
* ``elarion_scheduler_versions``: one version counter per cluster;
* the entries table's triggers (``celery_elarion_beat.store.entry_triggers``): every
  write, a raw SQL one included, takes the cluster's next version, writes its revision
  row and, on PostgreSQL, notifies the beat nodes. Pass ``table=`` and ``schema=`` to
  ``entry_trigger_ddl`` as your ``elarion_beat_table`` and ``elarion_beat_schema``.

Needed only with ``elarion_beat_db_entries = True``, but harmless without. The beat
role needs SELECT on the three tables and SELECT, UPDATE on the versions table (the
claims read its row ``FOR SHARE``); whoever edits entries (the CLI, the API, an admin
app) needs SELECT, INSERT, UPDATE, DELETE on the entries table and INSERT, UPDATE on
the versions and INSERT on the revisions table (the triggers run as that role); see
docs/howto/database-role.md. Creating triggers needs the TRIGGER privilege on MariaDB
(and, with binary logging on, ``log_bin_trust_function_creators``).

Revision ID: 0010_elarion_beat
Revises: 0009_elarion_beat
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from celery_elarion_beat.store.entry_triggers import entry_trigger_ddl

revision: str = "0010_elarion_beat"
down_revision: str | None = "0009_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLAIMS = "elarion_scheduler_claims"
_NODES = "elarion_scheduler_nodes"
_ENTRIES = "elarion_scheduler_entries"
_REVISIONS = "elarion_scheduler_revisions"
_VERSIONS = "elarion_scheduler_versions"
_TIMESTAMP = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: A byte-exact key: VARBINARY on MariaDB and MySQL (whose collations merge names).
_KEY = sa.String(length=191).with_variant(mysql.VARBINARY(764), "mysql", "mariadb")
#: A cluster name (elarion_beat_cluster, at most 64 characters), as 0007 made it.
_CLUSTER = sa.String(length=64).with_variant(mysql.VARBINARY(256), "mysql", "mariadb")
_REVISION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _definition() -> list[sa.Column]:
    return [sa.Column("task", sa.Text(), nullable=False),
            sa.Column("schedule", sa.Text(), nullable=False),
            sa.Column("args", sa.Text(), nullable=False),
            sa.Column("kwargs", sa.Text(), nullable=False),
            sa.Column("options", sa.Text(), nullable=False)]


def upgrade() -> None:
    op.add_column(_CLAIMS, sa.Column("revision", _REVISION, nullable=True))
    op.add_column(_NODES, sa.Column("entries_version", _REVISION, nullable=True))
    op.create_table(
        _ENTRIES,
        sa.Column("cluster", _CLUSTER, nullable=False),
        sa.Column("name", _KEY, nullable=False),
        *_definition(),
        sa.Column("enabled", sa.Boolean(), server_default="1", nullable=False),
        sa.Column("revision", _REVISION, server_default="0", nullable=False),
        sa.Column("effective_at", _TIMESTAMP, nullable=True),
        sa.Column("updated_at", _TIMESTAMP, nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("overrides", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("code_digest", sa.String(length=64), nullable=True),
        sa.Column("restart", sa.Boolean(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("cluster", "name", name=f"{_ENTRIES}_pkey"),
        comment="celery-elarion-beat: schedule entries kept in the database",
    )
    op.create_table(
        _REVISIONS,
        sa.Column("cluster", _CLUSTER, nullable=False),
        sa.Column("revision", _REVISION, nullable=False),
        sa.Column("name", _KEY, nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        *_definition(),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("effective_at", _TIMESTAMP, nullable=False),
        sa.Column("at", _TIMESTAMP, nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("overrides", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("code_digest", sa.String(length=64), nullable=True),
        sa.Column("restart", sa.Boolean(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("cluster", "revision", "name", name=f"{_REVISIONS}_pkey"),
        comment="celery-elarion-beat: every change of a database schedule entry",
    )
    op.create_index(f"ix_{_REVISIONS}_name", _REVISIONS, ["cluster", "name", "revision"])
    op.create_table(
        _VERSIONS,
        sa.Column("cluster", _CLUSTER, nullable=False),
        sa.Column("version", _REVISION, nullable=False),
        sa.Column("batch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", _TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("cluster", name=f"{_VERSIONS}_pkey"),
        comment="celery-elarion-beat: the version of each cluster's database entries",
    )
    for statement in entry_trigger_ddl(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.drop_table(_ENTRIES)  # its triggers go with it
    if dialect == "postgresql":
        op.execute(f'DROP FUNCTION IF EXISTS "{_ENTRIES}_revise"()')
    op.drop_table(_REVISIONS)
    op.drop_table(_VERSIONS)
    with op.batch_alter_table(_NODES) as batch:
        batch.drop_column("entries_version")
    with op.batch_alter_table(_CLAIMS) as batch:
        batch.drop_column("revision")
