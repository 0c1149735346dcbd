"""The plan: what one due occurrence becomes, and the message that carries it.

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

from ..config.headers import (
    CELERY_BEAT_HEADER,
    HEADER_CATCH_UP,
    HEADER_CLAIM,
    HEADER_JOB,
    HEADER_MANUAL,
    HEADER_NODE,
    HEADER_OCCURRENCE,
    HEADER_PLACEMENT,
    HEADER_TAKEOVER,
)
from ..config.live_entries import LiveEntry
from ..config.names import check_job_name
from ..config.options import publish_options
from ..config.overlap import OverlapRule
from ..config.parsers import format_duration
from ..config.placement import Placement, entry_placement
from ..schedules.slots import (
    ClaimKind,
    Occurrence,
    iso,
    name_occurrence,
    slot_task_id,
)
from ..store.records import ClaimRequest, ClaimRow
from ..store.states import MANUAL_KIND

__all__ = ["HEADER_CATCH_UP", "HEADER_CLAIM", "HEADER_JOB", "HEADER_MANUAL", "HEADER_NODE",
           "HEADER_OCCURRENCE", "HEADER_PLACEMENT", "HEADER_TAKEOVER", "label", "message",
           "plan_entry", "replay_plan", "takeover_plan", "when_text"]


#: The window a taken-over window claim names in logs (its length is not stored).
_WINDOW_LABEL = timedelta(seconds=1)


@dataclass
class Plan:
    """A reserved entry on its way: its placement, occurrence, task id and claim.

    ``catch_up`` marks the replay of a missed slot; ``takeover`` the count of an
    orphaned claim this node took over; ``manual`` a run an operator triggered (all
    go out as headers). ``jitter`` is the slot's publish delay (:mod:`..config.jitter`)."""

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


def plan_entry(entry: ScheduleEntry, next_due: float | None, now: datetime,
               tolerance: float, overlap: OverlapRule | None = None,
               lead: timedelta | None = None) -> Plan:
    """Name *entry*'s due occurrence and its claim (none for every-node entries),
    under the entry's *overlap* rule; an exact slot's claim carries *lead* (the
    store refuses it that long before the slot, see ClaimRequest.lead).

    Raises :class:`~celery_elarion_beat.exceptions.ConfigurationError` for an entry that cannot be
    claimed (its name, its placement)."""
    placement = entry_placement(entry.name, entry.options)
    if placement is Placement.EVERY_NODE:
        return Plan(entry, placement, task_id=str(uuid.uuid4()), period=_period(entry, next_due))
    check_job_name(entry.name)
    occ = name_occurrence(entry.name, entry.schedule, now, tolerance=tolerance,
                          next_due=next_due)
    revision = _revision(entry)
    if occ.kind is ClaimKind.SLOT:
        assert occ.slot is not None
        task_id = slot_task_id(entry.name, occ.slot)
        return Plan(entry, placement, occ, task_id,
                   ClaimRequest.for_slot(entry.name, occ.slot, task_id, overlap=overlap,
                                         revision=revision, lead=lead))
    assert occ.window is not None
    task_id = str(uuid.uuid4())
    return Plan(entry, placement, occ, task_id,
               ClaimRequest.for_window(entry.name, occ.window, task_id, overlap=overlap,
                                       revision=revision))


def _revision(entry: ScheduleEntry) -> int | None:
    """A database entry's revision, which its claims carry (a code entry: none)."""
    if isinstance(entry, LiveEntry):
        return entry.revision
    return None


def replay_plan(entry: ScheduleEntry, slot: datetime,
                overlap: OverlapRule | None = None, catch_up: bool = True) -> Plan:
    """The claim of a missed *slot* of *entry*, replayed: a slot claim like any other,
    with the slot's deterministic task id (and the entry's *overlap* rule). With
    *catch_up* False, the claim of a slot decided again (a database entry that changed
    under a claim refused as stale)."""
    task_id = slot_task_id(entry.name, slot)
    revision = _revision(entry)
    return Plan(entry, Placement.CLUSTER, Occurrence(entry.name, ClaimKind.SLOT, slot=slot),
               task_id, ClaimRequest.for_slot(entry.name, slot, task_id, overlap=overlap,
                                              revision=revision),
               catch_up=catch_up)


def takeover_plan(entry: ScheduleEntry, row: ClaimRow) -> Plan:
    """The publish of an orphaned claim *row* of *entry* this node took over: the
    original task id, no claim of its own."""
    kind = ClaimKind(row.kind)
    occurrence = (Occurrence(entry.name, kind, slot=row.occurrence) if kind is ClaimKind.SLOT
                  else Occurrence(entry.name, kind, window=_WINDOW_LABEL))
    return Plan(entry, Placement.CLUSTER, occurrence, row.task_id, takeover=row.takeovers)


def message(plan: Plan, occurrence: datetime | None, node: str,
            queue: Queue | None) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """``(args, kwargs, options)`` to publish *plan* with (to *queue* if given)."""
    entry = plan.entry
    options = publish_options(entry.options)
    headers = dict(options.pop("headers", None) or {})
    headers.update({
        CELERY_BEAT_HEADER: True,
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


def label(plan: Plan, occurrence: datetime | None) -> str:
    occ = plan.occurrence
    if occ is not None and occ.kind is ClaimKind.SLOT and occ.slot is not None:
        return f"slot {iso(occ.slot)}"
    if occurrence is not None:
        return f"window at {iso(occurrence)}"
    if occ is not None and occ.window is not None:
        return f"window {format_duration(occ.window)}"
    return occ.label() if occ else "unclaimed"


def when_text(plan: Plan, occurrence: datetime | None, now: datetime) -> str:
    occ = plan.occurrence
    if occ is not None and occ.slot is not None:
        return iso(occ.slot)
    if occ is not None and occ.window is not None:
        held = f", claimed at {iso(occurrence)}" if occurrence is not None else ""
        return f"{iso(now)} (window {format_duration(occ.window)}{held})"
    return iso(now)
