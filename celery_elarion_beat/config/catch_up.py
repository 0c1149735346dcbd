"""Catch-up policies: what an entry replays of the slots the whole cluster missed.

A slot is *missed* when it lies after the job's newest claim (cluster-wide, from
the ledger), is due by now, and is within the entry's ``catch_up_window``. The
policy chooses what to replay:

* ``skip`` (the default): nothing, as before 0.2;
* ``latest``: the most recent missed slot, once;
* ``all``: the most recent ``catch_up_max`` missed slots, oldest first.

Here: the policy and its validation (``options={'catch_up': ..., 'catch_up_window':
..., 'catch_up_max': ...}``). Which slots were missed, and the queue that replays
them, are beat's (:mod:`..beat.catch_up`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .options import CATCH_UP, CATCH_UP_MAX, CATCH_UP_WINDOW
from .parsers import format_duration, number

__all__ = ["CatchUp", "CatchUpPolicy", "entry_catch_up"]

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
        """``skip``, ``latest within 1h`` or ``all (at most 10) within 1h``."""
        if self.mode is CatchUp.SKIP:
            return "skip"
        most = f" (at most {self.most})" if self.mode is CatchUp.ALL else ""
        return f"{self.mode}{most} within {format_duration(self.window)}"


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


