"""celery-elarion-beat 0.3: keys that start with the cluster (step 2 of 2).

Run it once every node runs 0.3 (a node of 0.2 names the old key in its claims:
``elarion-beat status`` lists the nodes still on 0.2). Each key and index leads with
``cluster``, so apps that share the tables never meet:

* claims: primary key ``(cluster, job_name, occurrence_utc)``; ``ix_..._claimed_at``
  ``(cluster, claimed_at)``, ``ix_..._job_claimed`` ``(cluster, job_name,
  claimed_at)``, ``ix_..._pending`` ``(cluster, state, claimed_at)`` (partial);
* nodes ``(cluster, node)``, pauses ``(cluster, job_name)``;
* audit: ``ix_..._at`` ``(cluster, at)``, ``ix_..._job_at`` ``(cluster, job_name, at)``;
* one-offs: unique ``(cluster, idem_key)``, ``ix_..._due`` ``(cluster, state,
  due_utc)``, ``ix_..._finished`` ``(cluster, finished_at)``.

The defaults of step 1 go (each row names its cluster from now on), and so do the
heartbeat rows of nodes of 0.2. What ``celery -A proj elarion-beat init-db`` does,
except that init-db builds the new keys of PostgreSQL concurrently first: here each
is built in the migration's transaction (the claims wait while it builds).

Revision ID: 0008_elarion_beat
Revises: 0007_elarion_beat
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0008_elarion_beat"
down_revision: str | None = "0007_elarion_beat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLAIMS = "elarion_scheduler_claims"
_NODES = "elarion_scheduler_nodes"
_PAUSES = "elarion_scheduler_pauses"
_AUDIT = "elarion_scheduler_audit"
_ONE_OFFS = "elarion_scheduler_oneoffs"
_UNPUBLISHED = sa.text("state IN ('pending', 'failed')")
_CLUSTER = sa.String(length=64).with_variant(mysql.VARBINARY(256), "mysql", "mariadb")

#: table -> its primary key (new, old)
_KEYS = {_CLAIMS: (["cluster", "job_name", "occurrence_utc"], ["job_name", "occurrence_utc"]),
         _NODES: (["cluster", "node"], ["node"]),
         _PAUSES: (["cluster", "job_name"], ["job_name"])}
#: (index, table, new columns, old columns, partial)
_INDEXES = [
    (f"ix_{_CLAIMS}_claimed_at", _CLAIMS, ["cluster", "claimed_at"], ["claimed_at"], False),
    (f"ix_{_CLAIMS}_job_claimed", _CLAIMS, ["cluster", "job_name", "claimed_at"],
     ["job_name", "claimed_at"], False),
    (f"ix_{_CLAIMS}_pending", _CLAIMS, ["cluster", "state", "claimed_at"],
     ["state", "claimed_at"], True),
    (f"ix_{_AUDIT}_at", _AUDIT, ["cluster", "at"], ["at"], False),
    (f"ix_{_AUDIT}_job_at", _AUDIT, ["cluster", "job_name", "at"], ["job_name", "at"], False),
    (f"ix_{_ONE_OFFS}_due", _ONE_OFFS, ["cluster", "state", "due_utc"], ["state", "due_utc"],
     False),
    (f"ix_{_ONE_OFFS}_finished", _ONE_OFFS, ["cluster", "finished_at"], ["finished_at"],
     False),
]
_UNIQUE = f"uq_{_ONE_OFFS}_key"


def _swap(new: bool) -> None:
    """The keys first (SQLite rebuilds the table for them), then the indexes."""
    which = 0 if new else 1
    for table, keys in _KEYS.items():
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"{table}_pkey", type_="primary")
            batch.create_primary_key(f"{table}_pkey", keys[which])
    with op.batch_alter_table(_ONE_OFFS) as batch:
        batch.drop_constraint(_UNIQUE, type_="unique")
        batch.create_unique_constraint(_UNIQUE, ["cluster", "idem_key"] if new else ["idem_key"])
    for index, table, *columns, partial in _INDEXES:
        op.drop_index(index, table_name=table)
        where = {"postgresql_where": _UNPUBLISHED, "sqlite_where": _UNPUBLISHED} \
            if partial else {}
        op.create_index(index, table, columns[which], **where)


def upgrade() -> None:
    op.execute(sa.table(_NODES, sa.column("cluster")).delete()
               .where(sa.column("cluster") == ""))
    _swap(new=True)
    for table in (_CLAIMS, _NODES, _PAUSES, _AUDIT, _ONE_OFFS):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("cluster", server_default=None, existing_type=_CLUSTER,
                               existing_nullable=False)


def downgrade() -> None:
    """The keys of 0.2 again: refused by the database when two clusters hold one key."""
    _swap(new=False)
