"""Catch-up: which missed slots an entry replays, by policy, from the ledger.

A slot is *missed* when it lies after the job's newest claim (cluster-wide, from
the ledger), is due by now, and is within the entry's ``catch_up_window``. The
policy chooses what to replay:

* ``skip`` (the default): nothing, as before 0.2;
* ``latest``: the most recent missed slot, once;
* ``all``: the most recent ``catch_up_max`` missed slots, oldest first.

A job with no claim at all has missed nothing (a new entry). The replayed slots
are claimed like any slot (one winner per slot, however many nodes come back),
at most ``elarion_beat_catch_up_per_tick`` per tick: :class:`CatchUpQueue`.

Pure functions and data, no I/O; the scheduler reads the ledger and claims.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .exceptions import ConfigurationError
from .options import CATCH_UP, CATCH_UP_MAX, CATCH_UP_WINDOW
from .parsers import number
from .slots import recent_slots

__all__ = ["CatchUp", "CatchUpPolicy", "CatchUpQueue", "Missed", "entry_catch_up",
           "choose", "interval_anchor", "missed_slots"]

#: Missed slots counted per entry at most (what ``catch-up --dry-run`` and ``status`` list).
MAX_MISSED = 1000


class CatchUp(str, enum.Enum):
    """What an entry replays of the slots the whole cluster missed."""

    SKIP = "skip"
    LATEST = "latest"
    ALL = "all"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CatchUpPolicy:
    """An entry's catch-up: the policy, how far back, and how many slots at most."""

    mode: CatchUp
    window: timedelta
    most: int

    def describe(self) -> str:
        """``skip``, ``latest within 1:00:00`` or ``all (at most 10) within 1:00:00``."""
        if self.mode is CatchUp.SKIP:
            return "skip"
        most = f" (at most {self.most})" if self.mode is CatchUp.ALL else ""
        return f"{self.mode}{most} within {self.window}"


def entry_catch_up(name: str, options: Mapping[str, Any] | None,
                   default: CatchUpPolicy) -> CatchUpPolicy:
    """The catch-up policy of the entry *name* (its options over *default*), or a
    :class:`ConfigurationError` naming the entry, the key and what is allowed."""
    options = options or {}
    raw = options.get(CATCH_UP)
    try:
        mode = default.mode if raw is None else CatchUp(raw)
    except ValueError:
        allowed = ", ".join(repr(c.value) for c in CatchUp)
        raise ConfigurationError(
            f"beat_schedule entry {name!r} has options[{CATCH_UP!r}] = {raw!r}; use one of "
            f"{allowed} (or celery_elarion_beat.CatchUp)") from None
    window = default.window
    if options.get(CATCH_UP_WINDOW) is not None:
        key = f"beat_schedule entry {name!r} options[{CATCH_UP_WINDOW!r}]"
        seconds = number(key, options[CATCH_UP_WINDOW], "a timedelta or a number of seconds")
        if seconds <= 0:
            raise ConfigurationError(f"{key} must be longer than 0 seconds, not "
                                     f"{options[CATCH_UP_WINDOW]!r}")
        window = timedelta(seconds=seconds)
    most = default.most
    if options.get(CATCH_UP_MAX) is not None:
        raw_max = options[CATCH_UP_MAX]
        if isinstance(raw_max, bool) or not isinstance(raw_max, int) or raw_max < 1:
            raise ConfigurationError(
                f"beat_schedule entry {name!r} has options[{CATCH_UP_MAX!r}] = {raw_max!r}; "
                "use a whole number of slots, at least 1")
        most = raw_max
    return CatchUpPolicy(mode, window, most)


@dataclass(frozen=True)
class Missed:
    """One entry's missed slots (newest first, at most :data:`MAX_MISSED`) and the
    slots its policy replays (oldest first). *waiting* are unclaimed slots still within
    their jitter (:mod:`.jitter`): not missed, the cluster claims them at their time."""

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


def interval_anchor(every: timedelta, last: datetime, now: datetime, mode: CatchUp,
                    grace: timedelta) -> datetime:
    """The last run an interval entry counts from, given its newest claim *last*.

    Normally *last* itself: the next run is one interval after the cluster's last
    one, whoever ran it and however often the nodes restarted since. If that time
    passed more than *grace* ago while no node was up, ``latest`` and ``all`` run it
    once now (an interval has no slots to replay one by one), and ``skip`` waits for
    the next point of the rhythm, ``last + k * every``.
    """
    if every <= timedelta(0) or last + every + grace >= now or mode is not CatchUp.SKIP:
        return last
    steps = (now - last) // every  # >= 1: the points of the rhythm that passed
    point = last + steps * every
    if now - point <= grace:  # the latest point passed just now: still run it
        return point - every
    return point
