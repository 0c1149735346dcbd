"""The cluster-wide purge: one node per interval deletes old claims.

Every ``elarion_beat_purge_interval`` each node claims a window on the reserved
job :data:`PURGE_JOB`, with the same window claim interval entries use; the one
node that wins deletes the claims older than ``elarion_beat_claim_retention`` in
batches of ``elarion_beat_purge_batch`` rows. The store keeps every job's newest
claim whatever its age (``status`` and the ledger need to know where each job
stands).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from .settings import Settings
from .store import ClaimRequest, ClaimStore

__all__ = ["PURGE_JOB", "purge_if_elected"]

logger = logging.getLogger(__name__)

#: The reserved job name whose window claims elect the purging node.
PURGE_JOB = "elarion.purge"


def purge_if_elected(settings: Settings, store: ClaimStore) -> int | None:
    """Purge if this node wins this interval's purge window; rows deleted, or None."""
    window = timedelta(seconds=settings.purge_interval * 0.9)
    request = ClaimRequest.for_window(PURGE_JOB, window, str(uuid.uuid4()), tracked=False)
    (result,) = store.claim(settings.node, [request])
    if not result.won:
        logger.debug("beat: purge of this interval is done by %s", result.winner)
        return None
    retention = timedelta(seconds=settings.claim_retention)
    deleted = store.purge(retention, batch_size=settings.purge_batch)
    logger.info("beat: purged %d claims older than %s", deleted, retention,
                extra={"action": "purge", "deleted": deleted})
    return deleted
