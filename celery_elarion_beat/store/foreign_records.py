"""Foreign beats' records: senders of beat messages that claim nothing, as the workers
saw them (a stock beat left among the claiming replicas).

Plain value types (no SQLAlchemy); times are on the database clock. A sender is the
``origin`` of its messages, ``gen<pid>@<host>`` for a Celery beat: one process.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..config.headers import origin_host
from ..schedules.clock import iso_utc

__all__ = ["ForeignBeat", "ForeignSender", "ForeignSighting", "foreign_senders"]


@dataclass(frozen=True)
class ForeignSighting:
    """What one worker saw since its last report: *count* beat messages of *task* sent by
    *origin* without the library's headers; *entry* is the app's ``beat_schedule``
    entry (or entries, comma-separated) with that task, if any."""

    origin: str
    task: str
    count: int
    entry: str | None = None
    worker: str = ""


@dataclass(frozen=True)
class ForeignBeat:
    """One sender's messages of one task, as recorded: how many the workers saw since
    *first_seen*, the last time one was seen, and the worker that saw it."""

    origin: str
    task: str
    entry: str | None
    count: int
    first_seen: datetime
    last_seen: datetime
    worker: str

    @property
    def host(self) -> str:
        return origin_host(self.origin)

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "entry": self.entry, "count": self.count,
                "first_seen": iso_utc(self.first_seen), "last_seen": iso_utc(self.last_seen),
                "worker": self.worker}


@dataclass(frozen=True)
class ForeignSender:
    """A sender (one ``origin``) and its tasks, the most recently seen first."""

    origin: str
    tasks: tuple[ForeignBeat, ...]

    @property
    def host(self) -> str:
        return origin_host(self.origin)

    @property
    def count(self) -> int:
        return sum(t.count for t in self.tasks)

    @property
    def first_seen(self) -> datetime:
        return min(t.first_seen for t in self.tasks)

    @property
    def last_seen(self) -> datetime:
        return max(t.last_seen for t in self.tasks)

    def as_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "host": self.host, "count": self.count,
                "first_seen": iso_utc(self.first_seen), "last_seen": iso_utc(self.last_seen),
                "tasks": [t.as_dict() for t in self.tasks]}


def foreign_senders(rows: Iterable[ForeignBeat]) -> list[ForeignSender]:
    """*rows* grouped by sender: the most recently seen sender first, and in each its
    tasks the same way."""
    by_origin: dict[str, list[ForeignBeat]] = {}
    for row in rows:
        by_origin.setdefault(row.origin, []).append(row)
    senders = [ForeignSender(origin, tuple(sorted(found, key=lambda r: (r.last_seen, r.task),
                                                  reverse=True)))
               for origin, found in by_origin.items()]
    return sorted(senders, key=lambda s: (s.last_seen, s.origin), reverse=True)
