"""celery-elarion-beat: run Celery beat on every node, send each occurrence once.

``celery -A proj beat -S celery_elarion_beat.ClaimingScheduler`` on every node;
before a due entry is sent, its occurrence is claimed in a shared database
table and exactly one node wins.
"""

from __future__ import annotations

from .cron import cron
from .exceptions import (
    ConfigurationError,
    ElarionBeatError,
    SchemaMissing,
    StoreError,
    StoreUnavailable,
)
from .node_queue import consume_node_queue, node_queue
from .outcome import Outcome, Record, SkipReason
from .placement import Placement
from .scheduler import ClaimingScheduler
from .settings import Settings
from .slots import ClaimKind, Occurrence, name_occurrence, slot_task_id
from .store import ClaimRequest, ClaimResult, ClaimStore, MemoryClaimStore, claims_table, open_store

__version__ = "0.2.0.dev0"

__all__ = [
    "ClaimKind",
    "ClaimRequest",
    "ClaimResult",
    "ClaimStore",
    "ClaimingScheduler",
    "ConfigurationError",
    "ElarionBeatError",
    "MemoryClaimStore",
    "Occurrence",
    "Outcome",
    "Placement",
    "Record",
    "SchemaMissing",
    "Settings",
    "SkipReason",
    "StoreError",
    "StoreUnavailable",
    "__version__",
    "claims_table",
    "consume_node_queue",
    "cron",
    "name_occurrence",
    "node_queue",
    "open_store",
    "slot_task_id",
]
