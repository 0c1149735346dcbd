"""The cluster's clock on one node: measured against the database, trusted or fenced.

A beat runs on a :class:`~..schedules.clock.ClusterClock`: its own clock minus its
offset to the database clock. The offset is measured at start, once the schedule is
built and checked (its entries' last runs are then moved to the cluster's time, so their
first runs count from it), and with each heartbeat (:mod:`.maintenance`); every node
then decides when a slot is due, and names it, on the database clock, whatever its own
clock says.

A node whose offset is beyond ``elarion_beat_max_clock_offset`` **fences itself**: it
claims nothing (every claim is skipped ``clock-fenced``; its every-node entries go on,
they are its own), says so once with the figure and the fix, and resumes by itself
when a heartbeat finds its clock back within. A correction that large means the
node's time sync is broken, and a clock that jumps that far between two heartbeats
could send early before the next measurement. As a second guard, each exact slot's
claim carries a lead (``elarion_beat_max_clock_skew``): the claims database refuses a
claim made more than that before the slot on its own clock.

A clock injected by a test (any :data:`~..schedules.clock.Clock` that is not a
ClusterClock) is taken as the cluster's: nothing is measured or fenced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import StoreError
from ..schedules.clock import Clock, ClusterClock
from ..store.interface import ClaimStore

__all__ = ["ClockFence", "measure_offset", "signed"]

logger = logging.getLogger(__name__)

#: The least time between two measurements a fenced-for-want-of-one node makes itself.
_REMEASURE = 1.0


def measure_offset(store: ClaimStore, raw: Clock,
                   monotonic: Callable[[], float] = time.monotonic) -> tuple[float, float]:
    """This node's clock (*raw*) minus the store's clock, in seconds, read in one short
    round trip and corrected by half of it; and that round trip. Raises the store's
    errors."""
    sent = monotonic()
    db_now = store.clock()
    trip = monotonic() - sent
    return ((raw() - timedelta(seconds=trip / 2)) - db_now).total_seconds(), trip


def signed(seconds: float) -> str:
    """A clock offset to the millisecond, its sign always written: ``+1.25s``, ``-40ms``."""
    text = format_duration(seconds, 0.001)
    return text if text.startswith("-") else "+" + text


class ClockFence:
    """Whether this node may claim, by its clock (see the module docstring)."""

    def __init__(self, settings: Settings, clock: Clock, store: Callable[[], ClaimStore],
                 monotonic: Callable[[], float] = time.monotonic,
                 failing: Callable[[], bool] = lambda: False) -> None:
        self.settings = settings
        self.clock = clock if isinstance(clock, ClusterClock) else None
        self._store = store
        #: whether the claims database is failing now (an outage: no extra round trip)
        self._failing = failing
        self._monotonic = monotonic
        self._measured_at = float("-inf")
        #: fenced at the last look
        self.active = False

    def measure(self) -> float | None:
        """Measure the offset now (at start; when none is known); None when the store
        did not answer (its claims fail closed meanwhile, as ``claim-error``)."""
        if self.clock is None:
            return None
        self._measured_at = self._monotonic()
        try:
            offset, trip = measure_offset(self._store(), self.clock.raw, self._monotonic)
        except StoreError:
            return None
        self.clock.measured(offset, trip)
        return offset

    def fenced(self) -> bool:
        """True when this node must claim nothing now; logs the change, once each way."""
        clock = self.clock
        if clock is None:
            return False
        if clock.offset is None and not self._failing() \
                and self._monotonic() - self._measured_at >= _REMEASURE:
            # the database did not answer at start, and its outage has ended since:
            # measure now (during the outage, a tick waits for it once, in its claims)
            self.measure()
        offset = clock.offset
        if offset is None:
            # unmeasured because the database does not answer: the claims fail closed
            # on their own, with the outage's own report (and the slots it missed)
            return False
        bound = self.settings.max_clock_offset
        fenced = abs(offset) > bound
        if fenced and not self.active:
            logger.warning(
                "beat: clock fenced: this node's clock is %s off the database clock, beyond "
                "elarion_beat_max_clock_offset = %s; it claims nothing (its every-node entries "
                "go on) until its clock is back within. Fix the node's time sync (NTP, "
                "chrony), or raise the setting if the offset is expected",
                signed(offset), format_duration(bound),
                extra={"action": "clock-fenced", "skew": offset})
        elif self.active and not fenced:
            logger.info("beat: clock fence lifted: this node's clock is %s off the database "
                        "clock, within %s; claiming again", signed(offset),
                        format_duration(bound),
                        extra={"action": "clock-unfenced", "skew": offset})
        self.active = fenced
        return fenced
