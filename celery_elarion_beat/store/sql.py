"""The SQL claim store: every role of the seam on a SQLAlchemy engine.

:class:`SqlClaimStore` puts the role mixins together over :class:`~.sql_base.SqlBase`;
the backends (:mod:`.postgres`, :mod:`.mysql`, :mod:`.sqlite`) subclass it and add
the claim itself.
"""

from __future__ import annotations

from .sql_base import SqlBase
from .sql_claims import SqlClaims, claim_row, held_result
from .sql_control import SqlControl
from .sql_entries import SqlLiveEntries
from .sql_foreign import SqlForeignBeats
from .sql_node_runs import SqlNodeRuns
from .sql_nodes import SqlNodes
from .sql_one_offs import SqlOneOffs

__all__ = ["SqlBase", "SqlClaimStore", "claim_row", "held_result"]


class SqlClaimStore(SqlClaims, SqlNodeRuns, SqlControl, SqlNodes, SqlOneOffs, SqlForeignBeats,
                    SqlLiveEntries, SqlBase):
    """A claim store on a SQL database: claims, runs (and every-node runs per node),
    control, nodes, one-offs, foreign beats and the database entries."""
