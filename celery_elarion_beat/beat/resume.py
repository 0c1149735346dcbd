"""Resume from the ledger: where each entry stands when beat starts, and again
each time the claims database comes back after an outage.

* An interval entry counts from its newest claim (``elarion_beat_interval_anchor
  = "cluster"``), so restarts neither postpone nor double it (see
  :func:`~.catch_up.interval_anchor` for an interval missed while no node was up).
* An exact-slot entry whose policy is not ``skip`` gets its missed slots, which
  the scheduler queues for claiming (see :mod:`.catch_up`).

One ledger read for all those entries; nothing here claims or publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

from ..config.catch_up import MAX_MISSED, CatchUp, entry_catch_up
from ..config.jitter import slot_delay
from ..config.live_entries import LiveEntry, phase_anchor
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..schedules.clock import as_utc
from ..schedules.slots import ClaimKind, iso, name_occurrence
from ..store.interface import ClaimStore
from .catch_up import Missed, choose, interval_anchor, missed_slots

__all__ = ["Resumed", "interval_anchors", "last_runs", "resumable", "resume_from_ledger"]

logger = logging.getLogger(__name__)


@dataclass
class Resumed:
    """What the ledger said: the last run of each interval entry (ledger clock), and
    each exact-slot entry's missed slots."""

    anchors: dict[str, datetime] = field(default_factory=dict)
    missed: list[Missed] = field(default_factory=list)


def resumable(entries: Mapping[str, ScheduleEntry], settings: Settings,
              now: datetime) -> dict[str, Any]:
    """The cluster entries the ledger can tell something about: interval entries when
    anchored on the cluster, exact-slot entries whose policy replays; name -> policy
    (None for intervals). A broken entry is left out (its tick says why)."""
    out: dict[str, Any] = {}
    for name, entry in entries.items():
        try:
            if entry_placement(name, entry.options) is not Placement.CLUSTER:
                continue
            policy = entry_catch_up(name, entry.options, settings.catch_up_policy)
            if isinstance(entry.schedule, interval_schedule):
                if settings.interval_anchor == "cluster":
                    out[name] = policy
            elif policy.mode is not CatchUp.SKIP and names_slots(name, entry, now):
                out[name] = policy
        except ConfigurationError:
            continue
    return out


def resume_from_ledger(store: ClaimStore, settings: Settings,
                       entries: Mapping[str, ScheduleEntry], now: datetime,
                       started: Mapping[str, datetime] | None = None,
                       skipped: Mapping[str, Collection[datetime]] | None = None) -> Resumed:
    """Read the ledger for every resumable entry and say where each stands.

    *started* (when beat starts, until a read succeeds) maps each entry to the
    instant its normal runs began on this node: its missed slots lie between its
    newest claim before then and then. *skipped* holds the exact slots this node
    skipped while the database was down: those still unclaimed are missed too
    (the tick that saw the database back claimed its own slot first, so the
    ledger's newest claim is later than them). Raises the store's errors (the
    caller retries later, with the same *started*).
    """
    wanted = resumable(entries, settings, now)
    resumed = Resumed()
    if not wanted:
        return resumed
    resumed.anchors = _anchors(store, entries, wanted, now)
    interval_names = {name for name in wanted  # a list here made the read quadratic
                      if isinstance(entries[name].schedule, interval_schedule)}
    slotted = {name: policy for name, policy in wanted.items() if name not in interval_names}
    until = {name: when for name, when in (started or {}).items() if name in slotted}
    before = (store.latest_claims(list(until), before=max(until.values())) if until else {})
    unclaimed = _unclaimed(store, {job: slots for job, slots in (skipped or {}).items()
                                   if job in slotted})
    for name, policy in sorted(slotted.items()):
        claim = before.get(name)
        slots: set[datetime] = set()
        # a database entry's catch-up never reaches back before its effective time
        floor = getattr(entries[name], "effective_at", None) \
            if isinstance(entries[name], LiveEntry) else None
        if name in until and claim is not None:
            last = claim.occurrence if floor is None \
                else max(claim.occurrence, floor - timedelta(microseconds=1))
            slots.update(missed_slots(name, entries[name].schedule, policy, last,
                                      now, until=until[name]).slots)
        slots.update(slot for slot in unclaimed.get(name, ())
                     if now - policy.window <= slot <= now and (floor is None or slot >= floor))
        # a slot still within its jitter is not missed: the nodes up claim it at its time
        delay = slot_delay(entries[name])
        waiting = tuple(sorted(slot for slot in slots if slot + delay(slot) > now))
        ordered = sorted(slots.difference(waiting), reverse=True)
        missed = Missed(name, policy, claim.occurrence if claim else None, ordered,
                        choose(policy, ordered), waiting)
        if missed.replay:
            _log_catch_up(missed, settings.node)
        resumed.missed.append(missed)
    return resumed


def interval_anchors(store: ClaimStore, settings: Settings,
                     entries: Mapping[str, ScheduleEntry], now: datetime) -> dict[str, datetime]:
    """The last run each interval entry counts from (ledger clock), from the ledger's
    newest claims: read as beat starts, before its first tick decides anything, so a
    window that comes due as the node starts runs at its time. Raises the store's errors."""
    wanted = {name: policy for name, policy in resumable(entries, settings, now).items()
              if isinstance(entries[name].schedule, interval_schedule)}
    return _anchors(store, entries, wanted, now) if wanted else {}


def _anchors(store: ClaimStore, entries: Mapping[str, ScheduleEntry],
             wanted: Mapping[str, Any], now: datetime) -> dict[str, datetime]:
    intervals = [name for name in wanted if isinstance(entries[name].schedule,
                                                       interval_schedule)]
    newest = store.latest_claims(intervals) if intervals else {}
    anchors = {}
    for name in intervals:
        claim = newest.get(name)
        if claim is not None:
            entry = entries[name]
            anchor = interval_anchor(entry.schedule.run_every, claim.occurrence, now,
                                     wanted[name].mode)
            if isinstance(entry, LiveEntry) and entry.effective_at is not None:
                # edited since: its phase (or a restart) counts from the effective time
                anchor = phase_anchor(anchor, entry.schedule.run_every, entry.effective_at,
                                      entry.restart)
            anchors[name] = anchor
    return anchors


def _log_catch_up(missed: Missed, node: str) -> None:
    replay = missed.replay
    logger.info("beat: catch-up: %s missed %s%d slot(s) since its last claim at %s; "
                "replaying %s (policy %s)", missed.job,
                "at least " if len(missed.slots) >= MAX_MISSED else "", len(missed.slots),
                iso(missed.last) if missed.last else "-",
                ", ".join(iso(s) for s in replay[:5])
                + (f" and {len(replay) - 5} more" if len(replay) > 5 else ""),
                missed.policy.describe(),
                extra={"action": "catch-up", "job": missed.job, "node": node,
                       "missed": len(missed.slots), "replay": len(replay)})


def _unclaimed(store: ClaimStore,
               skipped: Mapping[str, Collection[datetime]]) -> dict[str, set[datetime]]:
    """Of the *skipped* slots, the ones nobody has claimed since."""
    keys = [(job, slot) for job, slots in skipped.items() for slot in slots]
    if not keys:
        return {}
    claimed = store.existing(keys)
    out: dict[str, set[datetime]] = {}
    for job, slot in keys:
        if (job, slot) not in claimed:
            out.setdefault(job, set()).add(slot)
    return out


def last_runs(entries: Mapping[str, ScheduleEntry]) -> dict[str, datetime]:
    """Each entry's own last run (aware UTC): when beat starts, the instant after which
    its normal runs take over (earlier slots may be missed ones)."""
    out = {}
    for name, entry in entries.items():
        try:
            if entry.last_run_at is not None:
                out[name] = as_utc(entry.last_run_at)
        except Exception:  # an odd value of a custom entry: nothing to resume from
            continue
    return out


def names_slots(name: str, entry: ScheduleEntry, now: datetime) -> bool:
    """Whether the entry's schedule names exact slots (crontab, solar, cron, custom)."""
    try:
        probe = name_occurrence(name, entry.schedule, now, tolerance=0.0)
    except Exception:
        return False
    return probe.kind is ClaimKind.SLOT


