"""celery-elarion-beat 0.3: the cluster column (step 1 of 2; nodes of 0.2 keep running).

Several apps may share one database and one set of tables: each row names the app it
belongs to (``elarion_beat_cluster``, by default the Celery app's main name). This step
adds ``cluster`` to the claims, pauses, audit and one-offs tables, ``NOT NULL`` with
the upgrading app's cluster as its default (what the existing rows, and the rows
nodes of 0.2 still write, take), and to the nodes table with the default ``''`` (the
mark of a node of 0.2). The keys stay those of 0.2, so nodes of 0.2 and of 0.3 run
side by side; step 2 (``0008``) swaps them once every node runs 0.3.

The cluster comes from ``alembic -x cluster=proj upgrade head`` or the
``ELARION_BEAT_CLUSTER`` environment variable; on empty tables (a new database) it
may be left out. Keys are ``VARBINARY(256)`` on MariaDB and MySQL (byte-exact).

Revision ID: 0007_elarion_beat
Revises: 0006_elarion_beat
Create Date: 2026-12-02
"""

import os
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

revision: str = "0007_elarion_beat"
down_revision: str | None = "0006_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROWS = ("elarion_scheduler_claims", "elarion_scheduler_pauses", "elarion_scheduler_audit",
         "elarion_scheduler_oneoffs")
_NODES = "elarion_scheduler_nodes"
#: A byte-exact cluster name of at most 64 characters.
_CLUSTER = sa.String(length=64).with_variant(mysql.VARBINARY(256), "mysql", "mariadb")


def _cluster() -> str:
    """The cluster the rows there are belong to: ``-x cluster=``, else the environment;
    not needed on empty tables (a new database)."""
    given = context.get_x_argument(as_dictionary=True).get("cluster") \
        or os.environ.get("ELARION_BEAT_CLUSTER")
    if given:
        return given
    if not context.is_offline_mode():
        bind = op.get_bind()
        if not any(bind.execute(sa.select(sa.literal(1)).select_from(sa.table(t)).limit(1))
                   .first() for t in _ROWS):
            return ""  # no row to name
    raise RuntimeError(
        "0007_elarion_beat needs the cluster (elarion_beat_cluster) of the app whose rows "
        "these tables hold: run `alembic -x cluster=proj upgrade head` (proj: the Celery "
        "app's main name, or the elarion_beat_cluster it sets), or set ELARION_BEAT_CLUSTER")


def upgrade() -> None:
    cluster = _cluster()
    for table, default in [*((t, cluster) for t in _ROWS), (_NODES, "")]:
        op.add_column(table, sa.Column("cluster", _CLUSTER, nullable=False,
                                       server_default=default))


def downgrade() -> None:
    for table in (*_ROWS, _NODES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("cluster")
