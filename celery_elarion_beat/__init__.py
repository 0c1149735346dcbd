"""celery-elarion-beat: run Celery beat on every node, send each occurrence once.

``beat_scheduler = "elarion"`` in the app's configuration (or ``celery -A proj beat
-S elarion``) on every node; before a due entry is sent, its occurrence is claimed in
a shared database table and exactly one node wins.

Importing the package connects the scheduler guard (:mod:`.beat.scheduler_guard`):
the ``celery`` command imports it in every process through the ``celery.commands``
entry point, so a beat of an app that uses the library and runs another scheduler
refuses to start.
"""

from __future__ import annotations

from .beat.scheduler import ClaimingScheduler
from .beat.scheduler_guard import connect_scheduler_guard
from .config.catch_up import CatchUp, CatchUpPolicy
from .config.delivery import Delivery
from .config.node_queue import consume_node_queue, node_queue
from .config.overlap import Overlap, OverlapRule
from .config.placement import Placement
from .config.settings import Settings
from .exceptions import (
    ClaimRefused,
    ConfigurationError,
    ElarionBeatError,
    EntryConflict,
    EntryNotFound,
    OneOffNotFound,
    SchemaMissing,
    StoreError,
    StoreRefused,
    StoreUnavailable,
    UpgradeRefused,
)
from .observe.logformat import (
    JsonFormatter,
    connect_json_logging,
    install_json_logging,
)
from .observe.outcome import Outcome, Record, SkipReason
from .one_offs.api import (
    apply_at,
    cancel,
    get_one_off,
    list_one_offs,
    schedule_once,
)
from .operate.preview import SchedulePreview, preview_entries
from .schedules.cron import cron
from .schedules.slots import ClaimKind, Occurrence, name_occurrence, slot_task_id
from .store import claims_table
from .store.interface import ClaimStore
from .store.memory import MemoryClaimStore
from .store.one_off_records import OneOff, OneOffState
from .store.records import (
    ClaimRequest,
    ClaimResult,
    ClaimRow,
    JobLedger,
    NodeState,
    PublishReport,
    RunReport,
    Takeover,
)
from .store.registry import open_store
from .store.schema import (
    audit_table,
    entries_table,
    foreign_beats_table,
    nodes_table,
    one_offs_table,
    pauses_table,
    revisions_table,
    versions_table,
)
from .worker.install import install_worker
from .worker.runs import RunTracker

__version__ = "0.2.0.dev0"

connect_scheduler_guard()

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
    "EntryConflict",
    "EntryNotFound",
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
    "UpgradeRefused",
    "__version__",
    "apply_at",
    "audit_table",
    "cancel",
    "claims_table",
    "connect_json_logging",
    "consume_node_queue",
    "cron",
    "entries_table",
    "foreign_beats_table",
    "get_one_off",
    "install_json_logging",
    "install_worker",
    "list_one_offs",
    "name_occurrence",
    "node_queue",
    "nodes_table",
    "one_offs_table",
    "pauses_table",
    "revisions_table",
    "preview_entries",
    "schedule_once",
    "open_store",
    "slot_task_id",
    "versions_table",
]
