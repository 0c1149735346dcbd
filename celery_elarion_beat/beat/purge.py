"""The cluster-wide purge: one node per interval deletes old claims.

Every ``elarion_beat_purge_interval`` each node claims a window on the reserved
job :data:`PURGE_JOB`, with the same window claim interval entries use; the one
node that wins deletes the claims older than ``elarion_beat_claim_retention`` in
batches of ``elarion_beat_purge_batch`` rows (on the partitioned layout it first
drops the day partitions past the retention whole), and at the end of the pass the
one-offs published, failed or cancelled longer than the retention ago. The store keeps every job's
newest claim whatever its age (``status`` and the ledger need to know where each
job stands).

The purge runs inside beat's tick, so it is bounded: a stretch stops once
``elarion_beat_purge_budget`` seconds are spent, and the winner carries on with
the same pass (same cutoff, no new election) at its next ticks until it is done
(:func:`continue_purge`, called by :class:`~.maintenance.Maintenance`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import SchemaMissing
from ..store.interface import ClaimStore
from ..store.records import ClaimRequest, PurgeProgress

__all__ = ["PURGE_JOB", "continue_purge", "purge_if_elected", "purge_one_offs"]

logger = logging.getLogger(__name__)

#: The reserved job name whose window claims elect the purging node.
PURGE_JOB = "elarion.purge"


def purge_if_elected(settings: Settings, store: ClaimStore,
                     monotonic: Callable[[], float] = time.monotonic) -> PurgeProgress | None:
    """Start a purge pass if this node wins this interval's purge window: its first
    stretch (``done`` or not), or None when another node won."""
    window = timedelta(seconds=settings.purge_interval * 0.9)
    request = ClaimRequest.for_window(PURGE_JOB, window, str(uuid.uuid4()), tracked=False)
    (result,) = store.claim(settings.node, [request])
    if not result.won:
        logger.debug("beat: purge of this interval is done by %s", result.winner)
        return None
    return continue_purge(settings, store, None, monotonic)


def purge_one_offs(store: ClaimStore, older_than: timedelta, batch_size: int) -> int | None:
    """Delete the one-offs published, failed or cancelled more than *older_than* ago
    (beat: the claims' retention, after each purge pass; ``elarion-beat purge``); None
    while their table is missing."""
    try:
        gone = store.purge_one_offs(older_than, batch_size=batch_size)
    except SchemaMissing:
        return None
    if gone:
        logger.info("beat: purged %d one-offs finished more than %s ago", gone,
                    format_duration(older_than),
                    extra={"action": "purge-one-offs", "deleted": gone})
    return gone


def continue_purge(settings: Settings, store: ClaimStore, progress: PurgeProgress | None,
                   monotonic: Callable[[], float] = time.monotonic) -> PurgeProgress:
    """One stretch of the pass *progress* (a new pass when None), within the budget."""
    retention = timedelta(seconds=settings.claim_retention)
    step = store.purge_pass(retention, batch_size=settings.purge_batch,
                            budget=settings.purge_budget, resume=progress, monotonic=monotonic)
    if step.dropped:
        logger.info("beat: dropped the claims partitions %s (older than %s)",
                    ", ".join(step.dropped), format_duration(retention),
                    extra={"action": "purge-partitions", "dropped": list(step.dropped)})
    if step.done:
        logger.info("beat: purged %d claims older than %s", step.total,
                    format_duration(retention),
                    extra={"action": "purge", "deleted": step.total})
        purge_one_offs(store, retention, settings.purge_batch)
    else:
        logger.info("beat: purged %d claims older than %s so far; the rest at the next tick "
                    "(elarion_beat_purge_budget = %s)", step.total, format_duration(retention),
                    format_duration(settings.purge_budget),
                    extra={"action": "purge-progress", "deleted": step.total})
    return step
