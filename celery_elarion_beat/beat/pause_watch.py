"""Pauses for the every-node entries, which are sent without a claim.

A claimed entry learns of its job's pause inside its claim (:mod:`..operate.control`). An
every-node entry has no claim, so before this node sends its every-node entries
of a tick it reads the pauses of those jobs (one short query, only in ticks that
send one). When the claims database cannot be read, the pauses last read still
hold: an every-node entry never waits for the database, and a paused one stays
paused through an outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from ..exceptions import StoreError
from ..schedules.clock import Clock
from ..store.control_records import ALL_JOBS, Pause, pauses_in_force
from ..store.interface import ClaimStore

__all__ = ["PauseWatch"]

logger = logging.getLogger(__name__)


class PauseWatch:
    """The pause in force of each every-node job, read when they are due."""

    def __init__(self, store: Callable[[], ClaimStore], clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._known: dict[str, Pause] = {}
        self._failing = False
        #: the database error of the last read, None when it succeeded
        self.error: BaseException | None = None

    def of(self, jobs: Collection[str]) -> dict[str, Pause]:
        """Each of *jobs* that is paused, with its pause (its own, else every job's)."""
        try:
            _, found = self._store().pauses(jobs)
        except Exception as exc:  # a store bug too: every-node entries never wait for it
            self.error = exc
            if not self._failing:
                logger.warning("beat: could not read the pauses (%s); every-node entries "
                               "follow the pauses last read", exc,
                               exc_info=not isinstance(exc, StoreError),
                               extra={"action": "pauses-unread"})
            self._failing = True
            now = self._clock()
            found = [p for p in self._known.values() if p.active(now)]
        else:
            self.error = None
            if self._failing:
                logger.info("beat: the pauses can be read again",
                            extra={"action": "pauses-read"})
            self._failing = False
            for job in [*jobs, ALL_JOBS]:  # what was asked is known now, paused or not
                self._known.pop(job, None)
            self._known.update({p.job: p for p in found})
        return pauses_in_force(found, jobs)

    def held(self, jobs: Collection[str]) -> dict[str, Pause]:
        """Each of *jobs* paused as last read, without asking the database (while the
        claims fail: a read would make the tick wait for it a second time)."""
        now = self._clock()
        return pauses_in_force([p for p in self._known.values() if p.active(now)], jobs)
