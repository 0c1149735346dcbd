"""celery-elarion-beat: run Celery beat on every node, send each occurrence once.

``celery -A proj beat -S celery_elarion_beat.ClaimingScheduler`` on every node;
before a due entry is sent, its occurrence is claimed in a shared database
table and exactly one node wins.
"""

from __future__ import annotations

from .catch_up import CatchUp, CatchUpPolicy
from .cron import cron
from .delivery import Delivery
from .exceptions import (
    ClaimRefused,
    ConfigurationError,
    ElarionBeatError,
    SchemaMissing,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from .logformat import JsonFormatter, connect_json_logging, install_json_logging
from .node_queue import consume_node_queue, node_queue
from .oneoffs import (
    OneOff,
    OneOffNotFound,
    OneOffState,
    apply_at,
    cancel,
    get_one_off,
    list_one_offs,
    one_offs_table,
    schedule_once,
)
from .outcome import Outcome, Record, SkipReason
from .overlap import Overlap
from .placement import Placement
from .preview import SchedulePreview, preview_entries
from .scheduler import ClaimingScheduler
from .settings import Settings
from .slots import ClaimKind, Occurrence, name_occurrence, slot_task_id
from .store import ClaimRequest, ClaimResult, ClaimStore, MemoryClaimStore, claims_table, open_store
from .store.base import (
    ClaimRow,
    JobLedger,
    NodeState,
    OverlapRule,
    PublishReport,
    RunReport,
    Takeover,
)
from .store.schema import audit_table, nodes_table, pauses_table
from .worker import RunTracker, install_worker

__version__ = "0.2.0.dev0"

__all__ = [
    "CatchUp",
    "CatchUpPolicy",
    "ClaimKind",
    "ClaimRefused",
    "ClaimRequest",
    "ClaimResult",
    "ClaimRow",
    "ClaimStore",
    "ClaimingScheduler",
    "ConfigurationError",
    "Delivery",
    "ElarionBeatError",
    "JobLedger",
    "JsonFormatter",
    "MemoryClaimStore",
    "NodeState",
    "OneOff",
    "OneOffNotFound",
    "OneOffState",
    "Occurrence",
    "Outcome",
    "Overlap",
    "OverlapRule",
    "Placement",
    "PublishReport",
    "Record",
    "RunReport",
    "RunTracker",
    "SchedulePreview",
    "SchemaMissing",
    "Settings",
    "SkipReason",
    "StoreError",
    "StoreRefused",
    "StoreUnavailable",
    "Takeover",
    "__version__",
    "apply_at",
    "audit_table",
    "cancel",
    "claims_table",
    "connect_json_logging",
    "consume_node_queue",
    "cron",
    "get_one_off",
    "install_json_logging",
    "install_worker",
    "list_one_offs",
    "name_occurrence",
    "node_queue",
    "nodes_table",
    "one_offs_table",
    "pauses_table",
    "preview_entries",
    "schedule_once",
    "open_store",
    "slot_task_id",
]
