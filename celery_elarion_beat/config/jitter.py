"""Jitter: spread the slots that many jobs share, the same way on every node.

``options={'jitter': timedelta(seconds=60)}`` delays each slot of a crontab,
solar or cron entry by an offset in ``[0, jitter)``. The offset is a hash of the
job name and the slot (SHA-256, first 8 bytes, modulo the jitter in
milliseconds), so:

* every node computes the same offset for the same slot: the cluster still claims
  the slot once, at the same moment everywhere, and the slot keeps its name, task
  id and claim (the ``elarion_occurrence`` header is the slot, not the publish time);
* the offsets of many jobs sharing a slot (1,000 ``0 * * * *`` reports) fall
  uniformly over the jitter window, and a job's offset changes from slot to slot,
  so no job is always the last.

Only exact slots are jittered: an interval entry shares no slot with other jobs
(each run follows the job's own previous one), and every-node entries are not
claimed, so both refuse the option.
Lateness (events, ledger) stays measured from the slot; dispatched events carry
the ``jitter`` applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import ConfigurationError
from ..schedules.slots import iso
from .options import JITTER
from .parsers import number

__all__ = ["entry_jitter", "jitter_offset", "slot_delay"]

#: The largest jitter accepted: a day (a longer delay is a different schedule).
MAX_JITTER = 24 * 3600.0


def entry_jitter(name: str, options: Mapping[str, Any] | None, *, slotted: bool,
                 every_node: bool) -> timedelta | None:
    """The entry's jitter (None when it has none), or :class:`ConfigurationError`
    naming the entry, the option and the fix."""
    raw = (options or {}).get(JITTER)
    if raw is None:
        return None
    key = f"beat_schedule entry {name!r} options[{JITTER!r}]"
    value = number(key, raw, "a timedelta or a number of seconds")
    if value < 0 or value > MAX_JITTER:
        raise ConfigurationError(f"{key} = {raw!r}: a jitter is from 0 seconds to "
                                 f"{MAX_JITTER:g} (a day)")
    if value == 0:
        return None
    if every_node:
        raise ConfigurationError(
            f"{key} is set on an every-node entry: only claimed slots are jittered; remove "
            "the option, or make the entry a cluster entry")
    if not slotted:
        raise ConfigurationError(
            f"{key} is set on an entry whose schedule is not a crontab, solar or cron: "
            "jitter spreads the exact slots many jobs share, and an interval entry has "
            "none (each run follows the job's own previous one); remove the option")
    return timedelta(seconds=value)


def jitter_offset(job: str, slot: datetime, jitter: timedelta) -> timedelta:
    """The delay of *job*'s *slot*: a number of milliseconds in ``[0, jitter)`` that
    depends only on the job name and the slot."""
    span = int(jitter.total_seconds() * 1000)
    if span <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{job}\x00{iso(slot)}".encode()).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % span)


def slot_delay(entry: Any) -> Callable[[datetime], timedelta]:
    """How long after each of its slots the ScheduleEntry *entry* is published (its
    jitter offset; none for an entry without a valid jitter): the reports use it so
    that a slot still waiting for its jitter is not called missed."""
    try:
        jitter = entry_jitter(entry.name, entry.options, slotted=True, every_node=False)
    except ConfigurationError:
        jitter = None
    if jitter is None:
        return lambda slot: timedelta(0)
    return lambda slot: jitter_offset(entry.name, slot, jitter)


