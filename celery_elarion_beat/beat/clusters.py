"""What beat says at start about the cluster's tables (:mod:`..store.clusters`).

Once the schema is ready, each node reads where the tables stand for its cluster
(``elarion_beat_cluster``) and says, with one WARNING, what an operator must do:

* ``shared-table``: several apps claim in tables that still have the keys of 0.2,
  so their claims collide until ``init-db`` finishes the upgrade;
* ``legacy-table``: the tables still have the keys of 0.2 (this node added their
  cluster column, or a migration did); ``init-db`` finishes the upgrade once every
  node runs this version.

A failure to read is logged at DEBUG and never stops beat: the census only informs.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from ..config.settings import Settings
from ..exceptions import StoreError
from ..store.clusters import ClusterCensus, legacy_message, shared_message
from ..store.interface import ClaimStore

__all__ = ["report_clusters"]

logger = logging.getLogger(__name__)


def report_clusters(settings: Settings, store: ClaimStore) -> ClusterCensus | None:
    """Log what the census of *store* asks of an operator; the census (None: unread)."""
    try:
        census = store.census(timedelta(seconds=settings.node_timeout))
    except StoreError as exc:
        logger.debug("beat: could not read which apps share the tables: %s", exc)
        return None
    table = settings.qualified_table
    if census.colliding:
        logger.warning("beat: %s", shared_message(census, table),
                       extra={"action": "shared-table", "cluster": census.cluster,
                              "clusters": list(census.clusters)})
    elif census.legacy:
        logger.warning("beat: %s", legacy_message(census, table),
                       extra={"action": "legacy-table", "cluster": census.cluster,
                              "tables": list(census.legacy),
                              "old_nodes": list(census.old_nodes)})
    return census
