"""Fail closed, loudly once: the claims database's outages as one node sees them.

While the store fails, every cluster occurrence is skipped (``claim-error``):
one ERROR line when the outage starts, DEBUG lines while it lasts, one INFO line
with the number of skipped occurrences when a claim succeeds again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..config.parsers import format_duration

__all__ = ["Outage"]

logger = logging.getLogger(__name__)


class Outage:
    """Tracks whether the claims database is failing for this node, and since when."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self.since: float | None = None
        #: when (monotonic) a store call last failed
        self.last_failed: float | None = None
        self.skipped = 0

    def failed(self, exc: BaseException, skipped: int = 0) -> None:
        """A store call failed; *skipped* occurrences were skipped because of it."""
        self.last_failed = self._monotonic()
        if self.since is None:
            self.since = self._monotonic()
            self.skipped = 0
            logger.error("beat: claims database unavailable; skipping every cluster occurrence "
                         "until it recovers (fail closed): %s", exc,
                         extra={"action": "claims-unavailable"})
        else:
            logger.debug("beat: claims database still unavailable: %s", exc)
        self.skipped += skipped

    def failed_since(self, mark: float) -> bool:
        """Whether a store call failed at or after the monotonic instant *mark*."""
        return self.last_failed is not None and self.last_failed >= mark

    def recovered(self) -> None:
        """A store call succeeded: report the end of an outage, if there was one."""
        if self.since is None:
            return
        lasted = self._monotonic() - self.since
        logger.info("beat: claims database reachable again after %s; %d occurrences were "
                    "skipped meanwhile", format_duration(lasted, approximate=True),
                    self.skipped, extra={"action": "claims-recovered"})
        self.since = None
