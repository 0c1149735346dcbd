"""Catch-up at run time: the missed slots of an entry, chosen by its policy, queued for replay.

A slot is *missed* when it lies after the job's newest claim (cluster-wide, from
the ledger), is due by now, and is within the entry's ``catch_up_window``. The
policy (:mod:`celery_elarion_beat.config.catch_up`) chooses what to replay. A job with
no claim at all has missed nothing (a new entry). The replayed slots are claimed like
any slot (one winner per slot, however many nodes come back), at most
``elarion_beat_catch_up_per_tick`` per tick: :class:`CatchUpQueue`.

Pure functions and data, no I/O; the scheduler reads the ledger and claims.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..config.catch_up import MAX_MISSED, CatchUp, CatchUpPolicy
from ..schedules.slots import recent_slots

__all__ = ["CatchUpQueue", "Missed", "choose", "interval_anchor", "missed_slots"]


@dataclass(frozen=True)
class Missed:
    """One entry's missed slots (newest first, at most :data:`MAX_MISSED`) and the
    slots its policy replays (oldest first). *waiting* are unclaimed slots still within
    their jitter (:mod:`..config.jitter`): not missed, the cluster claims them at their time."""

    job: str
    policy: CatchUpPolicy
    last: datetime | None
    slots: list[datetime]
    replay: list[datetime]
    waiting: tuple[datetime, ...] = ()


def missed_slots(job: str, sched: Any, policy: CatchUpPolicy, last: datetime | None,
                 now: datetime, until: datetime | None = None) -> Missed:
    """The slots of *sched* after *last* (the job's newest claim), due by *now* and
    not after *until* (the entry's own last run: later slots are its next normal
    runs), within the policy's window, and what the policy replays of them."""
    if last is None:
        return Missed(job, policy, None, [], [])
    start = max(last + timedelta(microseconds=1), now - policy.window)
    end = min(now, until) if until is not None else now
    slots = [slot for slot in recent_slots(job, sched, end, start, MAX_MISSED) if slot > last]
    return Missed(job, policy, last, slots, choose(policy, slots))


def choose(policy: CatchUpPolicy, missed: list[datetime]) -> list[datetime]:
    """What *policy* replays of the *missed* slots (newest first): oldest first."""
    if policy.mode is CatchUp.LATEST:
        return sorted(missed, reverse=True)[:1]
    if policy.mode is CatchUp.ALL:
        return sorted(sorted(missed, reverse=True)[:policy.most])
    return []


class CatchUpQueue:
    """Missed slots waiting to be claimed, oldest first across entries."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, str]] = []
        self._queued: set[tuple[datetime, str]] = set()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, job: str, slots: list[datetime]) -> int:
        """Queue *slots* of *job* (each once); how many were new."""
        added = 0
        for slot in slots:
            if (slot, job) not in self._queued:
                self._queued.add((slot, job))
                heapq.heappush(self._heap, (slot, job))
                added += 1
        return added

    def take(self, most: int, keep: Callable[[str], bool]) -> list[tuple[str, datetime]]:
        """Up to *most* queued slots, oldest first; slots of jobs *keep* rejects (no
        longer in the schedule) are dropped."""
        out: list[tuple[str, datetime]] = []
        while self._heap and len(out) < most:
            slot, job = heapq.heappop(self._heap)
            self._queued.discard((slot, job))
            if keep(job):
                out.append((job, slot))
        return out


def interval_anchor(every: timedelta, last: datetime, now: datetime,
                    mode: CatchUp) -> datetime:
    """The last run an interval entry counts from, given its newest claim *last*, as a
    node reads the ledger at *now* (its start, or the end of an outage).

    The windows of an interval are ``[last + k * every, last + (k + 1) * every)``, k >= 1.
    The window in progress at *now* is the current one, never a missed one: whatever the
    policy, it runs now if its run is due (from *last*: one interval after the cluster's
    last run, whoever ran it and however often the nodes restarted). Only the windows
    that ended while no node was up are the policy's: ``latest`` and ``all`` run once now
    for them (an interval has no slots to replay one by one), which is the current
    window's run; ``skip`` drops them, and the anchor moves to the start of the window
    before the current one (the rhythm's last point that passed, minus one interval).
    """
    if every <= timedelta(0) or mode is not CatchUp.SKIP:
        return last
    current = (now - last) // every  # the window in progress: >= 2 when some ended
    if current < 2:
        return last
    return last + (current - 1) * every
