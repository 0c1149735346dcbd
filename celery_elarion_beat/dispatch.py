"""Dispatch: what one due occurrence becomes, and the message that carries it.

Pure functions and data, no I/O: :func:`plan_entry` names the occurrence and
builds its claim request; :func:`message` builds the arguments and options the
winner publishes with (headers naming the occurrence, the node queue and expiry
of every-node entries; never the ``placement`` option).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.beat import BeatLazyFunc, ScheduleEntry
from celery.schedules import schedule as interval_schedule
from kombu.entity import Queue

from .catch_up import entry_catch_up
from .delivery import entry_delivery
from .exceptions import ConfigurationError
from .jitter import entry_jitter
from .names import check_job_name
from .options import publish_options
from .overlap import entry_overlap
from .placement import Placement, entry_placement
from .settings import Settings
from .slots import ClaimKind, Occurrence, is_slotted, iso, name_occurrence, slot_task_id
from .store import ClaimRequest, ClaimRow
from .store.base import OverlapRule
from .store.schema import MANUAL_KIND

__all__ = [
    "HEADER_CATCH_UP",
    "HEADER_CLAIM",
    "HEADER_JOB",
    "HEADER_MANUAL",
    "HEADER_NODE",
    "HEADER_OCCURRENCE",
    "HEADER_PLACEMENT",
    "HEADER_TAKEOVER",
    "HEADERS",
    "Due",
    "check_entry",
    "label",
    "message",
    "plan_entry",
    "replay_plan",
    "takeover_plan",
    "when_text",
]

#: Message headers that tell the task which occurrence it is.
HEADER_JOB = "elarion_job"
HEADER_OCCURRENCE = "elarion_occurrence"
HEADER_NODE = "elarion_node"
HEADER_PLACEMENT = "elarion_placement"
HEADER_CLAIM = "elarion_claim"
#: 1 on a run that replays a slot the cluster missed, else 0.
HEADER_CATCH_UP = "elarion_catch_up"
#: How many times the occurrence's orphaned claim was taken over (0 normally).
HEADER_TAKEOVER = "elarion_takeover"
#: 1 on a run an operator triggered (``elarion-beat trigger``), else 0.
HEADER_MANUAL = "elarion_manual"
#: Every header beat adds, in the order the docs list them.
HEADERS = (HEADER_JOB, HEADER_OCCURRENCE, HEADER_NODE, HEADER_PLACEMENT, HEADER_CLAIM,
           HEADER_CATCH_UP, HEADER_TAKEOVER, HEADER_MANUAL)


#: The window a taken-over window claim names in logs (its length is not stored).
_WINDOW_LABEL = timedelta(seconds=1)


@dataclass
class Due:
    """A reserved entry on its way: its placement, occurrence, task id and claim.

    ``catch_up`` marks the replay of a missed slot; ``takeover`` the count of an
    orphaned claim this node took over; ``manual`` a run an operator triggered (all
    go out as headers). ``jitter`` is the slot's publish delay (:mod:`.jitter`)."""

    entry: ScheduleEntry
    placement: Placement
    occurrence: Occurrence | None = None
    task_id: str = ""
    request: ClaimRequest | None = None
    period: float | None = None
    catch_up: bool = False
    takeover: int = 0
    manual: bool = False
    jitter: timedelta | None = None


def check_entry(name: str, entry: ScheduleEntry, settings: Settings) -> None:
    """Refuse, naming the entry, what can never be claimed right: a bad placement,
    catch-up, delivery, overlap or jitter option, a name that cannot be a key, an interval
    the purge would outlive."""
    placement = entry_placement(name, entry.options)
    if placement is Placement.CLUSTER:
        check_job_name(name)
    entry_catch_up(name, entry.options, settings.catch_up_policy)
    entry_delivery(name, entry.options, settings.default_delivery)
    entry_overlap(name, entry.options, settings.overlap_timeout, settings.publish_timeout,
                  every_node=placement is Placement.EVERY_NODE)
    entry_jitter(name, entry.options, slotted=is_slotted(entry.schedule),
                 every_node=placement is Placement.EVERY_NODE)
    retention = settings.claim_retention
    if isinstance(entry.schedule, interval_schedule):
        period = entry.schedule.run_every.total_seconds()
        if period >= retention:
            raise ConfigurationError(
                f"beat_schedule entry {name!r} runs every {period:g}s, which is not shorter "
                f"than elarion_beat_claim_retention ({retention:g}s): a purged claim could no "
                "longer suppress a duplicate inside its window; raise "
                "elarion_beat_claim_retention above the entry's interval")


def plan_entry(entry: ScheduleEntry, next_due: float | None, now: datetime,
               tolerance: float, overlap: OverlapRule | None = None) -> Due:
    """Name *entry*'s due occurrence and its claim (none for every-node entries),
    under the entry's *overlap* rule.

    Raises :class:`~.exceptions.ConfigurationError` for an entry that cannot be
    claimed (its name, its placement)."""
    placement = entry_placement(entry.name, entry.options)
    if placement is Placement.EVERY_NODE:
        return Due(entry, placement, task_id=str(uuid.uuid4()), period=_period(entry, next_due))
    check_job_name(entry.name)
    occ = name_occurrence(entry.name, entry.schedule, now, tolerance=tolerance,
                          next_due=next_due)
    if occ.kind is ClaimKind.SLOT:
        assert occ.slot is not None
        task_id = slot_task_id(entry.name, occ.slot)
        return Due(entry, placement, occ, task_id,
                   ClaimRequest.for_slot(entry.name, occ.slot, task_id, overlap=overlap))
    assert occ.window is not None
    task_id = str(uuid.uuid4())
    return Due(entry, placement, occ, task_id,
               ClaimRequest.for_window(entry.name, occ.window, task_id, overlap=overlap))


def replay_plan(entry: ScheduleEntry, slot: datetime,
                overlap: OverlapRule | None = None) -> Due:
    """The claim of a missed *slot* of *entry*, replayed: a slot claim like any other,
    with the slot's deterministic task id (and the entry's *overlap* rule)."""
    task_id = slot_task_id(entry.name, slot)
    return Due(entry, Placement.CLUSTER, Occurrence(entry.name, ClaimKind.SLOT, slot=slot),
               task_id, ClaimRequest.for_slot(entry.name, slot, task_id, overlap=overlap),
               catch_up=True)


def takeover_plan(entry: ScheduleEntry, row: ClaimRow) -> Due:
    """The publish of an orphaned claim *row* of *entry* this node took over: the
    original task id, no claim of its own."""
    kind = ClaimKind(row.kind)
    occurrence = (Occurrence(entry.name, kind, slot=row.occurrence) if kind is ClaimKind.SLOT
                  else Occurrence(entry.name, kind, window=_WINDOW_LABEL))
    return Due(entry, Placement.CLUSTER, occurrence, row.task_id, takeover=row.takeovers)


def message(plan: Due, occurrence: datetime | None, node: str,
            queue: Queue | None) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """``(args, kwargs, options)`` to publish *plan* with (to *queue* if given)."""
    entry = plan.entry
    options = publish_options(entry.options)
    headers = dict(options.pop("headers", None) or {})
    headers.update({
        "celery_beat_task": True,
        HEADER_JOB: entry.name,
        HEADER_OCCURRENCE: iso(occurrence) if occurrence is not None else None,
        HEADER_NODE: node,
        HEADER_PLACEMENT: plan.placement.value,
        HEADER_CLAIM: (MANUAL_KIND if plan.manual else
                       plan.occurrence.kind.value if plan.occurrence else None),
        HEADER_CATCH_UP: int(plan.catch_up),
        HEADER_TAKEOVER: plan.takeover,
        HEADER_MANUAL: int(plan.manual),
    })
    options["headers"] = headers
    options["task_id"] = plan.task_id
    if queue is not None:
        options["queue"] = queue
        options["exchange"] = queue.exchange.name
        options["routing_key"] = queue.routing_key
        options["expires"] = _expiry(options.get("expires"), plan.period)
    args = [v() if isinstance(v, BeatLazyFunc) else v for v in (entry.args or ())]
    kwargs = {k: v() if isinstance(v, BeatLazyFunc) else v
              for k, v in (entry.kwargs or {}).items()}
    return args, kwargs, options


def _period(entry: ScheduleEntry, next_due: float | None) -> float | None:
    """The entry's period in seconds: its interval, or the time to its next run."""
    if isinstance(entry.schedule, interval_schedule):
        return float(entry.schedule.run_every.total_seconds())
    return float(next_due) if next_due else None


def _expiry(requested: Any, period: float | None) -> Any:
    """A message expiry no later than one period (a stale every-node run is useless)."""
    if period is None:
        return requested
    period = max(1.0, period)
    if requested is None:
        return period
    if isinstance(requested, (int, float)):
        return min(float(requested), period)
    return requested  # an absolute datetime chosen by the user


def label(plan: Due, occurrence: datetime | None) -> str:
    occ = plan.occurrence
    if occ is not None and occ.kind is ClaimKind.SLOT and occ.slot is not None:
        return f"slot {iso(occ.slot)}"
    if occurrence is not None:
        return f"window at {iso(occurrence)}"
    return occ.label() if occ else "unclaimed"


def when_text(plan: Due, occurrence: datetime | None, now: datetime) -> str:
    occ = plan.occurrence
    if occ is not None and occ.slot is not None:
        return iso(occ.slot)
    if occ is not None and occ.window is not None:
        held = f", claimed at {iso(occurrence)}" if occurrence is not None else ""
        return f"{iso(now)} (window {occ.window.total_seconds():g}s{held})"
    return iso(now)
