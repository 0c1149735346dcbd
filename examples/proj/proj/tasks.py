"""The tasks. Each one can tell which occurrence it is running for.

Beat sends every message with the headers ``elarion_job``, ``elarion_occurrence``
(the slot, e.g. ``2026-11-29T02:00:00Z``) and ``elarion_node`` (the sender);
Celery makes them attributes of ``self.request``. For an exact slot the task id
is the same on every node (uuid5 of job and slot), so a consumer can deduplicate.
"""

import logging
import time

from .celery import app

logger = logging.getLogger(__name__)

#: per-process state that the every-node entry keeps fresh
LOCAL_CACHE: dict[str, float] = {}


@app.task(bind=True)
def nightly_report(self):
    occurrence = getattr(self.request, "elarion_occurrence", None)
    logger.info("nightly report for slot %s (sent by %s, task id %s)", occurrence,
                getattr(self.request, "elarion_node", None), self.request.id)
    return occurrence


@app.task(bind=True)
def sync_orders(self):
    logger.info("syncing orders for slot %s", getattr(self.request, "elarion_occurrence", None))


@app.task
def poll_partner_api(url):
    logger.info("polling %s", url)


@app.task(bind=True)
def refresh_local_cache(self):
    LOCAL_CACHE["refreshed_at"] = time.time()
    logger.info("refreshed this node's cache (sent by node %s)",
                getattr(self.request, "elarion_node", None))
