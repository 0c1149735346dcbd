"""The one clock: aware UTC datetimes.

The scheduler reads its clock once per tick and passes the value down (``now=``);
nothing below it reads the clock again. Tests inject their own :data:`Clock`.

A beat runs on :class:`ClusterClock`: this node's clock corrected by its measured
offset to the database clock, so every node names and sends each slot at its
instant on the one clock all of them talk to, whatever their own clocks say. Where
several nodes' claims must agree (interval windows) the database clock decides in
the statement itself, see :mod:`celery_elarion_beat.store`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

__all__ = ["Clock", "ClusterClock", "as_utc", "iso_utc", "utcnow"]

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """Return *value* as an aware UTC datetime; a naive value is taken as UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def iso_utc(value: datetime | None) -> str | None:
    """*value* as ISO text in UTC with a ``Z`` (its full precision), or None."""
    return as_utc(value).isoformat().replace("+00:00", "Z") if value is not None else None


class ClusterClock:
    """This node's clock on the database's time: ``raw() - offset``.

    *offset* is this node's clock minus the database clock, in seconds, from the
    heartbeats' measurements (:meth:`measured`: each one round-trip corrected, by
    half). Of the last :attr:`SAMPLES` measurements the one with the shortest round
    trip is kept, as NTP's clock filter does: the shortest trip is the one its
    halving corrects best, and one stalled read cannot move the clock. None until
    measured: the clock then reads the node's own time (and the scheduler claims
    nothing, see :meth:`fenced`).
    """

    #: Measurements the filter chooses from (a step of the node's clock is
    #: followed within this many heartbeats).
    SAMPLES = 5

    def __init__(self, raw: Clock = utcnow) -> None:
        self.raw = raw
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.SAMPLES)
        self._offset: timedelta | None = None

    def __call__(self) -> datetime:
        offset = self._offset
        return self.raw() if offset is None else self.raw() - offset

    @property
    def offset(self) -> float | None:
        """This node's clock minus the database clock (s), as filtered; None until measured."""
        return None if self._offset is None else self._offset.total_seconds()

    def measured(self, offset: float, round_trip: float) -> None:
        """One measurement: *offset* (node clock minus database clock, seconds,
        corrected by half the *round_trip*) and that round trip (seconds)."""
        self._samples.append((max(round_trip, 0.0), offset))
        best = min(self._samples)[1]
        self._offset = timedelta(seconds=best)

    def fenced(self, bound: float) -> bool:
        """Whether this node must claim nothing: its offset is unknown or beyond *bound*."""
        offset = self.offset
        return offset is None or abs(offset) > bound
