"""Overlap: whether an occurrence may start while the job's previous run is unfinished.

``options={'overlap': 'skip'}`` skips an occurrence of a cluster entry while its
job's previous run has not finished (reason ``still-running``): the check runs
inside the claim, on the ledger the workers keep (:mod:`celery_elarion_beat.worker`), so every node
takes the same decision, and the decision itself is stored (``skipped``).
``allow`` (the default) starts every occurrence, as Celery beat does.

A run is unfinished from its claim until a worker records its finish. When the
finish never comes (the worker was killed, or the workers do not track runs),
the run counts as dead once ``overlap_timeout`` has passed since its claim, so
an entry is never blocked for ever. The timeout is, in order: the entry's
``overlap_timeout`` option; the task's hard time limit (``time_limit`` of the
task, else ``task_time_limit``) plus ``elarion_beat_publish_timeout``, past which
the worker has killed the run; else ``elarion_beat_overlap_timeout`` (an hour).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .options import OVERLAP, OVERLAP_TIMEOUT
from .parsers import number

__all__ = ["Overlap", "OverlapRule", "entry_overlap"]


@dataclass(frozen=True)
class OverlapRule:
    """``overlap: skip``: do not claim while the job's previous run is unfinished.

    A run is unfinished from its claim until a worker records its finish, for at
    most *timeout* after its claim (its worker may have died). A claim still
    ``pending`` (being published) counts for at most *pending*; after that it is
    an orphan, which runs only if taken over (and then counts again). The store
    applies the rule to the ledger's rows inside the claim
    (:func:`celery_elarion_beat.store.records.overlap_blocks`).
    """

    timeout: timedelta
    pending: timedelta


class Overlap(str, enum.Enum):
    """What an entry does while its previous run is unfinished."""

    ALLOW = "allow"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


def entry_overlap(name: str, options: Mapping[str, Any] | None, default_timeout: float,
                  publish_timeout: float, time_limit: float | None = None,
                  every_node: bool = False) -> OverlapRule | None:
    """The overlap rule of the entry *name* (None for ``allow``), or
    :class:`ConfigurationError` naming the entry, the option and the fix."""
    options = options or {}
    raw = options.get(OVERLAP)
    if raw is None:
        mode = Overlap.ALLOW
    else:
        try:
            mode = Overlap(raw)
        except ValueError:
            allowed = ", ".join(repr(o.value) for o in Overlap)
            raise ConfigurationError(
                f"beat_schedule entry {name!r} has options[{OVERLAP!r}] = {raw!r}; use one of "
                f"{allowed} (or celery_elarion_beat.Overlap)") from None
    timeout = default_timeout if time_limit is None else time_limit + publish_timeout
    if options.get(OVERLAP_TIMEOUT) is not None:
        key = f"beat_schedule entry {name!r} options[{OVERLAP_TIMEOUT!r}]"
        timeout = number(key, options[OVERLAP_TIMEOUT], "a timedelta or a number of seconds")
        if not timeout > 0:
            raise ConfigurationError(f"{key} must be more than 0 seconds, not "
                                     f"{options[OVERLAP_TIMEOUT]!r}")
    if mode is Overlap.ALLOW:
        return None
    if every_node:
        raise ConfigurationError(
            f"beat_schedule entry {name!r} is placement 'every_node' and sets "
            f"options[{OVERLAP!r}] = 'skip': every-node runs are never claimed, so the "
            "cluster cannot hold them back; remove the option, or make the entry a cluster "
            "entry")
    return OverlapRule(timedelta(seconds=timeout),
                       timedelta(seconds=min(publish_timeout, timeout)))
