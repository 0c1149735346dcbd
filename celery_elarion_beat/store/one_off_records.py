"""One-offs (``schedule_once``): the records every store keeps (plain values, no SQLAlchemy).

A one-off is one row: a task, its serialized arguments, a due time (database
clock, UTC), its options and an optional idempotency key. Its life::

    scheduled --lease--> leased --publish--> published
        |                  |  \\--------------> failed      (will not be sent)
        |                  \\--lease expired--> leased      (another node: attempts + 1)
        \\--cancel--> cancelled                             (only while scheduled)

The row's ``id`` (a uuid4) is also the Celery task id of every attempt.
``one_offs_table(metadata)`` (:mod:`.schema`) declares its table for Alembic, beside
``claims_table(metadata)``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..schedules.clock import iso_utc

__all__ = ["FINISHED_STATES", "LeasedOneOff", "NewOneOff", "OneOff", "OneOffState"]

class OneOffState(str, enum.Enum):
    """Where a one-off stands."""

    SCHEDULED = "scheduled"   # waiting for its due time (cancellable)
    LEASED = "leased"         # a node holds it (lease_node, lease_until): publishing
    PUBLISHED = "published"   # the broker accepted it (the row is done)
    FAILED = "failed"         # will not be sent (error says why)
    CANCELLED = "cancelled"


#: The states of a row that is done: purged after ``elarion_beat_claim_retention``.
FINISHED_STATES = (OneOffState.PUBLISHED, OneOffState.FAILED, OneOffState.CANCELLED)



@dataclasses.dataclass(frozen=True)
class OneOff:
    """One one-off as it stands (no payload)."""

    id: str                  # uuid4 text; also the Celery task id of every attempt
    key: str | None
    task: str
    due: datetime            # aware UTC, database clock
    state: OneOffState
    created: datetime
    node: str | None         # the lease holder / publisher
    lease_until: datetime | None
    attempts: int            # leases taken (1 normally; 2+ after a takeover)
    published: datetime | None
    error: str | None
    options: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times in ISO 8601 UTC, no payload."""
        return {"id": self.id, "key": self.key, "task": self.task, "due": iso_utc(self.due),
                "state": self.state.value, "created": iso_utc(self.created), "node": self.node,
                "lease_until": iso_utc(self.lease_until), "attempts": self.attempts,
                "published": iso_utc(self.published), "error": self.error,
                "options": dict(self.options)}


@dataclasses.dataclass(frozen=True)
class NewOneOff:
    """A one-off to write: due at *due*, or *delay* seconds after the database clock
    (exactly one of them; :func:`~celery_elarion_beat.one_offs.api.schedule_once` checks)."""

    id: str
    task: str
    content_type: str
    content_encoding: str
    body: bytes
    options: Mapping[str, Any]
    due: datetime | None = None
    delay: float | None = None
    key: str | None = None


@dataclasses.dataclass(frozen=True)
class LeasedOneOff:
    """A one-off a node leased: the row, and its payload to publish."""

    one_off: OneOff
    content_type: str
    content_encoding: str
    body: bytes

    @property
    def id(self) -> str:
        return self.one_off.id

    @property
    def task(self) -> str:
        return self.one_off.task

    @property
    def options(self) -> Mapping[str, Any]:
        return self.one_off.options
