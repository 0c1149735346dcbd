"""What a restart would replay: ``celery -A proj elarion-beat catch-up --dry-run``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

from ..beat.catch_up import interval_anchor, missed_slots
from ..beat.resume import names_slots
from ..config.catch_up import CatchUp, CatchUpPolicy, entry_catch_up
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..store.interface import ClaimStore

__all__ = ["Preview", "preview"]


@dataclass(frozen=True)
class Preview:
    """What resuming now would do for one cluster entry (``catch-up --dry-run``):
    its missed slots and the ones its policy replays, or for an interval entry its
    next run counted from the ledger (``None``: one interval after start)."""

    job: str
    policy: CatchUpPolicy
    last: datetime | None
    missed: list[datetime]
    replay: list[datetime]
    interval: timedelta | None = None
    next_run: datetime | None = None


def preview(store: ClaimStore, settings: Settings, entries: Mapping[str, ScheduleEntry],
            now: datetime, mode: CatchUp | None = None) -> list[Preview]:
    """For every cluster entry, what resuming at *now* would replay (with *mode*
    instead of each entry's own policy, when given). Reads the ledger only."""
    policies: dict[str, CatchUpPolicy] = {}
    for name, entry in entries.items():
        try:
            if entry_placement(name, entry.options) is Placement.CLUSTER:
                policy = entry_catch_up(name, entry.options, settings.catch_up_policy)
                policies[name] = replace(policy, mode=mode) if mode else policy
        except ConfigurationError:
            continue
    latest = store.latest_claims(list(policies)) if policies else {}
    out = []
    for name, policy in sorted(policies.items()):
        sched, claim = entries[name].schedule, latest.get(name)
        last = claim.occurrence if claim else None
        if isinstance(sched, interval_schedule):
            every = sched.run_every
            anchor = (interval_anchor(every, last, now, policy.mode)
                      if last is not None and settings.interval_anchor == "cluster" else None)
            out.append(Preview(name, policy, last, [], [], every,
                               anchor + every if anchor is not None else None))
            continue
        if not names_slots(name, entries[name], now):
            continue
        missed = missed_slots(name, sched, policy, last, now)
        out.append(Preview(name, policy, last, missed.slots, missed.replay))
    return out
