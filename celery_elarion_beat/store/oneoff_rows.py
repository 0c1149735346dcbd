"""One-offs (``schedule_once``): the rows every store keeps, and their table.

A one-off is one row: a task, its serialized arguments, a due time (database
clock, UTC), its options and an optional idempotency key. Its life::

    scheduled --lease--> leased --publish--> published
        |                  |  \\--------------> failed      (will not be sent)
        |                  \\--lease expired--> leased      (another node: attempts + 1)
        \\--cancel--> cancelled                             (only while scheduled)

The row's ``id`` (a uuid4) is also the Celery task id of every attempt.
``one_offs_table(metadata)`` declares the table for Alembic, beside
``claims_table(metadata)``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql

from ..clock import as_utc, iso_utc
from .schema import KeyName, Timestamp

__all__ = ["DEFAULT_ONE_OFFS_TABLE", "FINISHED_STATES", "LeasedOneOff", "NewOneOff", "OneOff",
           "OneOffState", "one_off_from_row", "one_offs_table"]

DEFAULT_ONE_OFFS_TABLE = "elarion_scheduler_oneoffs"


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
    (exactly one of them; :func:`~celery_elarion_beat.oneoffs.schedule_once` checks)."""

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


def one_offs_table(metadata: MetaData, name: str = DEFAULT_ONE_OFFS_TABLE,
                   schema: str | None = None) -> Table:
    """Declare the one-offs table on *metadata* and return it.

    One row per one-off (``celery_elarion_beat.schedule_once``): ``id`` (uuid4 text,
    also the task id), ``idem_key`` (unique where set: scheduling twice with one key
    writes one row), ``task_name``, ``due_utc``, ``state`` (:class:`OneOffState`),
    ``created_at``, the lease (``lease_node``, ``lease_until``, ``attempts``),
    ``published_at``, ``finished_at`` (published, failed or cancelled: the purge
    counts from it), ``error``, ``options`` (JSON text) and the payload
    (``content_type``, ``content_encoding``, ``body``). Times are on the database
    clock. ``ix_<table>_due`` on ``(state, due_utc)`` finds the due rows.
    """
    table = Table(
        name,
        metadata,
        Column("id", String(36), nullable=False),
        Column("idem_key", KeyName(), nullable=True),
        Column("task_name", Text, nullable=False),
        Column("due_utc", Timestamp, nullable=False),
        Column("state", String(16), nullable=False),
        Column("created_at", Timestamp, nullable=False),
        Column("lease_node", Text, nullable=True),
        Column("lease_until", Timestamp, nullable=True),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("published_at", Timestamp, nullable=True),
        Column("finished_at", Timestamp, nullable=True),
        Column("error", Text, nullable=True),
        Column("options", Text, nullable=False),
        Column("content_type", String(128), nullable=False),
        Column("content_encoding", String(64), nullable=False),
        Column("body", LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
               nullable=False),
        PrimaryKeyConstraint("id", name=f"{name}_pkey"),
        UniqueConstraint("idem_key", name=f"uq_{name}_key"),
        schema=schema,
        comment="celery-elarion-beat: tasks scheduled once (schedule_once)",
    )
    Index(f"ix_{name}_due", table.c.state, table.c.due_utc)
    Index(f"ix_{name}_finished", table.c.finished_at)
    return table


def one_off_from_row(r: Mapping[str, Any]) -> OneOff:
    """A :class:`OneOff` from a row (mapping) of the one-offs table."""
    def at(value: Any) -> datetime | None:
        return as_utc(value) if value is not None else None

    return OneOff(id=r["id"], key=r["idem_key"], task=r["task_name"], due=as_utc(r["due_utc"]),
                  state=OneOffState(r["state"]), created=as_utc(r["created_at"]),
                  node=r["lease_node"], lease_until=at(r["lease_until"]),
                  attempts=int(r["attempts"] or 0), published=at(r["published_at"]),
                  error=r["error"], options=json.loads(r["options"] or "{}"))


def leased_from_row(r: Mapping[str, Any]) -> LeasedOneOff:
    """A :class:`LeasedOneOff` from a row (mapping) with the payload columns."""
    return LeasedOneOff(one_off_from_row(r), r["content_type"], r["content_encoding"],
                        bytes(r["body"]))
