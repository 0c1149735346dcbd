"""A tick that raises: one ERROR with its traceback, and beat goes on.

Stock beat lets an exception out of ``Scheduler.tick``: ``celery beat`` then logs it as
CRITICAL (``beat raised exception``) and exits, and the traceback Python prints on the
way out goes through beat's redirected stderr, one WARNING line per line of it. An
embedded beat's thread simply dies. A bug in one tick (ours, a hook's, a library's)
should cost that tick, not the node.

:class:`TickFailures` takes the exceptions of the ticks (``Exception`` only: SIGTERM's
``SystemExit`` and ``KeyboardInterrupt`` still end beat) and logs each distinct failure
(its type and the line that raised it) once, as ERROR with its traceback, through
this module's logger (``beat: a tick failed``, ``extra={"action": "tick-failed"}``).
The same failure again is counted, and logged at most once per :data:`REPEAT_EVERY`
seconds, one line with the count (no traceback: it was logged the first time). The
scheduler then rebuilds its heap and sleeps until its next entry is due, or
:data:`RETRY` seconds when one is due already (the tick failed before taking it): a
failure that comes back at every tick costs one tick per second, not a busy loop.
The entries the failed tick had taken due moved on to their next run: their
occurrences of that tick were not sent.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..config.parsers import format_duration

__all__ = ["REPEAT_EVERY", "RETRY", "TickFailures", "failure_key"]

logger = logging.getLogger(__name__)

#: Seconds between two log lines of one failure that keeps coming back.
REPEAT_EVERY = 300.0
#: Seconds beat sleeps after a failed tick that left an entry due (at most ``max_interval``).
RETRY = 1.0
#: Distinct failures remembered (the oldest are forgotten first).
_REMEMBERED = 100


def failure_key(exc: BaseException) -> tuple[str, str, int]:
    """What makes two failures the same: the exception's type and the line that raised
    it (its message may carry values that change every tick)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1] if frames else None
    return (f"{type(exc).__module__}.{type(exc).__qualname__}",
            where.filename if where else "", (where.lineno or 0) if where else 0)


@dataclass
class _Failure:
    logged_at: float
    #: times it came back since its last log line
    unlogged: int = 0


class TickFailures:
    """The failed ticks of one scheduler, logged once each, then at a low rate."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic,
                 repeat_every: float = REPEAT_EVERY) -> None:
        self.monotonic = monotonic
        self.repeat_every = repeat_every
        #: failed ticks in all (a tick that raised is one)
        self.failed_ticks = 0
        self._seen: OrderedDict[tuple[str, str, int], _Failure] = OrderedDict()

    def failed(self, exc: Exception, next_tick: float) -> None:
        """Log *exc*, raised by a tick, if it is new or its repeats are due (*next_tick*:
        the seconds until the next tick, for the log line)."""
        self.failed_ticks += 1
        key = failure_key(exc)
        now = self.monotonic()
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = _Failure(now)
            while len(self._seen) > _REMEMBERED:
                self._seen.popitem(last=False)
            logger.error("beat: a tick failed, %s: %s; beat goes on (its next tick in %s; "
                         "the same failure again is logged once per %s, with a count)",
                         type(exc).__name__, exc,
                         format_duration(next_tick, approximate=True),
                         format_duration(self.repeat_every), exc_info=exc,
                         extra={"action": "tick-failed", "error": key[0]})
        else:
            seen.unlogged += 1
            if now - seen.logged_at >= self.repeat_every:
                logger.error("beat: a tick failed again, %s: %s (%d times in the last %s; "
                             "its traceback was logged the first time)", type(exc).__name__,
                             exc, seen.unlogged,
                             format_duration(now - seen.logged_at, approximate=True),
                             extra={"action": "tick-failed", "error": key[0],
                                    "repeats": seen.unlogged})
                seen.logged_at, seen.unlogged = now, 0
