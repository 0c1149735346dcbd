"""The ledger's words: what a claim row's ``state``, ``run_state`` and ``kind`` hold.

Plain strings, shared by the stores, the events, the metrics, the Flower page and
the workers (no SQLAlchemy here: :mod:`.schema` declares the columns).
"""

from __future__ import annotations

__all__ = ["EVERY_NODE_KIND", "FAILED", "MANUAL_KIND", "PAUSED", "PENDING", "PUBLISHED",
           "RETRIED", "RUNNING", "RUN_FAILED", "SKIPPED", "STILL_RUNNING", "SUCCEEDED",
           "UNFINISHED_RUNS", "UNPUBLISHED"]

#: ``state`` of a claim whose message the broker has not accepted (yet).
PENDING = "pending"
#: ``state`` of a claim whose message the broker accepted.
PUBLISHED = "published"
#: ``state`` of a claim whose publish failed (``publish_error`` says why).
FAILED = "failed"
#: ``state`` of an occurrence decided but not sent: its job's previous run was still
#: running (``overlap: skip``); ``publish_error`` says ``still-running``.
SKIPPED = "skipped"
#: The ``publish_error`` of a ``skipped`` occurrence (the skip reason, :mod:`..observe.outcome`).
STILL_RUNNING = "still-running"
#: The states of an unpublished claim: an orphan once older than the publish timeout.
UNPUBLISHED = (PENDING, FAILED)

#: ``run_state`` values, written by the workers (:mod:`..worker`): started, not finished;
RUNNING = "running"
#: finished without error;
SUCCEEDED = "succeeded"
#: raised (``run_error`` holds the exception type and message);
RUN_FAILED = "failed"
#: raised Retry: it will run again under the same task id, so it is not finished.
RETRIED = "retried"
#: The run states of a run that is not finished (NULL, not started yet, is one too).
UNFINISHED_RUNS = (RUNNING, RETRIED)
#: ``kind`` of a worker's record of an every-node run (no claim: one row per node's run).
EVERY_NODE_KIND = "node"
#: ``kind`` of a run an operator triggered (``elarion-beat trigger``, Flower's "Run now"):
#: its occurrence is the database clock when triggered. It is no slot and no window: the
#: schedule's own claims never count it (an interval job is not postponed by it).
MANUAL_KIND = "manual"
#: The ``publish_error`` of an occurrence ``skipped`` because its job was paused.
PAUSED = "paused"
