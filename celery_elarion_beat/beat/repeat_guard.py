"""The repeat guard: an exact slot is claimed at most once per process.

Celery's crontab says "due, next in 0 s" on every tick while ``last_run_at`` is
inside a repeated daylight-saving hour. Without a memory of what was handled,
beat would claim the same slot in a busy loop for up to an hour. Each entry's
last claimed or skipped slot is kept; when the schedule says "due" for it again,
the entry sleeps until the schedule names its next slot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime

from ..config.parsers import format_duration
from ..schedules.slots import next_slot
from .plan import Plan

__all__ = ["RepeatGuard"]

logger = logging.getLogger(__name__)


class RepeatGuard:
    """The last exact slot this process claimed or skipped, per entry."""

    def __init__(self) -> None:
        self._last: dict[str, datetime] = {}

    def note(self, plans: Iterable[Plan]) -> None:
        """Remember the slots of *plans*, which are being claimed now."""
        for plan in plans:
            if plan.occurrence is not None and plan.occurrence.slot is not None:
                self._last[plan.entry.name] = plan.occurrence.slot

    def repeats(self, plans: Sequence[Plan], now: datetime,
                fallback: float) -> dict[str, float]:
        """Entries among *plans* whose slot was handled already, and the seconds until
        their next slot (*fallback* when none can be found)."""
        out: dict[str, float] = {}
        for plan in plans:
            occ = plan.occurrence
            if occ is None or occ.slot is None or self._last.get(occ.job) != occ.slot:
                continue
            try:
                upcoming = next_slot(occ.job, plan.entry.schedule, occ.slot, now)
            except Exception:  # naming worked a moment ago; never let this break the tick
                upcoming = None
            wait = (upcoming - now).total_seconds() if upcoming else fallback
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("beat: %s: %s was handled already; next in %s",
                             occ.job, occ.label(), format_duration(wait, 0.1))
            out[occ.job] = max(0.01, wait)
        return out
