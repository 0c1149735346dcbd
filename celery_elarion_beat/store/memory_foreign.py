"""The foreign beats of the in-memory store (the reference the contract suite checks
the SQL stores against): one dict per namespace, under the namespace's lock."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from .foreign_records import ForeignBeat, ForeignSighting

__all__ = ["MemoryForeignBeats"]


class MemoryForeignBeats:
    """The foreign-beat methods of :class:`~.memory.MemoryClaimStore`."""

    _clock: Callable[[], datetime]

    def _foreign_space(self) -> tuple[threading.Lock, dict[tuple[str, str], ForeignBeat]]:
        raise NotImplementedError  # the store provides its namespace's lock and dict

    def record_foreign_beats(self, sightings: Sequence[ForeignSighting],
                             retention: timedelta | None = None) -> None:
        lock, rows = self._foreign_space()
        with lock:
            now = self._clock()
            for seen in sightings:
                key = (seen.origin, seen.task)
                held = rows.get(key)
                if held is None:
                    rows[key] = ForeignBeat(seen.origin, seen.task, seen.entry, seen.count,
                                            now, now, seen.worker)
                else:
                    rows[key] = dataclasses.replace(held, count=held.count + seen.count,
                                                    entry=seen.entry, worker=seen.worker,
                                                    last_seen=now)
            if retention is not None:
                for key in [k for k, row in rows.items() if row.last_seen < now - retention]:
                    del rows[key]

    def foreign_beats(self, within: timedelta | None = None) -> tuple[datetime, list[ForeignBeat]]:
        lock, rows = self._foreign_space()
        with lock:
            now = self._clock()
            found = [row for row in rows.values()
                     if within is None or row.last_seen >= now - within]
        return now, sorted(found, key=lambda r: (r.last_seen, r.origin, r.task), reverse=True)
