"""The events on beat's heap: stock beat's ``event_t``, ties broken by entry name.

Stock beat keeps ``event_t(time, priority, entry)`` tuples on a heap, every one with
priority 5 (:meth:`celery.beat.Scheduler.populate_heap`), so two events due at the
same time are ordered by comparing their entries: by ``id`` in Celery 5 (an order that
differs from run to run), and a Python call per comparison. ClaimingScheduler used to
put each entry's place in the schedule in the priority field instead; code written for
stock beat (and Celery's own tests of its Scheduler) expects priority 5.

:class:`HeapEvent` is an ``event_t`` (it equals the stock tuple, priority 5 and all, and
reads as one: ``event.time``, ``event.priority``, ``event.entry``) whose ordering breaks
a tie of times with the entries' names, never the entries themselves: the order the
claim pipeline sorts a tick's batch in anyway (:mod:`.chunks`), the same on every run
and every node. It adds no field, so it costs no memory beyond the tuple. Its
comparison is a Python call, as stock beat's comparison of entries is; only a tick that
sends entries pays for it (a few comparisons per entry sent, next to a claim and a
publish each), never an idle one.
"""

from __future__ import annotations

from typing import Any

from celery.beat import event_t

__all__ = ["PRIORITY", "HeapEvent"]

#: The priority of every event, as stock beat's (it never uses another).
PRIORITY = 5


class HeapEvent(event_t):
    """``event_t(time, priority, entry)`` ordered by time, then by the entry's name."""

    __slots__ = ()

    def __lt__(self, other: Any) -> bool:
        mine, theirs = self[0], other[0]
        if mine != theirs:
            return bool(mine < theirs)
        try:
            return bool(self[2].name < other[2].name)
        except (AttributeError, TypeError):  # not an entry, or no name: "" sorts first
            return _name(self[2]) < _name(other[2])

    def __gt__(self, other: Any) -> bool:
        mine, theirs = self[0], other[0]
        if mine != theirs:
            return bool(mine > theirs)
        try:
            return bool(self[2].name > other[2].name)
        except (AttributeError, TypeError):
            return _name(self[2]) > _name(other[2])

    def __le__(self, other: Any) -> bool:
        return not self.__gt__(other)

    def __ge__(self, other: Any) -> bool:
        return not self.__lt__(other)


def _name(entry: Any) -> str:
    name = getattr(entry, "name", None)
    return name if isinstance(name, str) else ""
