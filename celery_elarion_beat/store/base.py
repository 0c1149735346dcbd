"""The claim store seam: a small interface with domain methods.

A backend answers one question for a batch of occurrences: "may this node send
them?" The scheduler never sees SQL, connections or driver exceptions; a
backend translates its driver's errors into :class:`~..exceptions.StoreError`.

A claim is won only by the call that inserts it. A row that already exists is a
loss even when it names this node and task id: it may be a second beat process
running under the same node name, which must not send the occurrence again. (A
backend that retries a call internally after a lost reply may recognise its own
row from that same call.)
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..clock import as_utc
from ..slots import ClaimKind

__all__ = ["ClaimRequest", "ClaimResult", "ClaimRow", "ClaimStore", "NodeState"]


@dataclass(frozen=True)
class ClaimRequest:
    """Claim one occurrence of *job*: an exact *slot*, or a *window* ending now."""

    job: str
    kind: ClaimKind
    task_id: str
    slot: datetime | None = None
    window: timedelta | None = None

    @classmethod
    def for_slot(cls, job: str, slot: datetime, task_id: str) -> ClaimRequest:
        return cls(job, ClaimKind.SLOT, task_id, slot=as_utc(slot))

    @classmethod
    def for_window(cls, job: str, window: timedelta, task_id: str) -> ClaimRequest:
        return cls(job, ClaimKind.WINDOW, task_id, window=window)


@dataclass(frozen=True)
class ClaimResult:
    """The answer to one :class:`ClaimRequest`.

    ``occurrence`` is the claimed slot, or for a window the claim time on the
    store's clock. ``winner`` and ``winner_task_id`` name the node holding the
    claim (this node when ``won``; for a loss, the other node where known).
    """

    request: ClaimRequest
    won: bool
    occurrence: datetime | None
    winner: str | None
    winner_task_id: str | None = None


@dataclass(frozen=True)
class ClaimRow:
    """One row of the claims ledger."""

    job: str
    occurrence: datetime
    node: str
    task_id: str
    kind: str
    claimed_at: datetime


@dataclass(frozen=True)
class NodeState:
    """One beat node as its heartbeat describes it.

    ``entries`` maps each entry name to the digest of its normalized definition;
    ``counts`` maps ``job|outcome|reason`` to the node's counts since it started.
    ``started_at`` and ``last_seen`` are set by the store (its clock).
    """

    node: str
    boot_id: str
    version: str
    fingerprint: str
    entries: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    started_at: datetime | None = None
    last_seen: datetime | None = None


class ClaimStore(abc.ABC):
    """Where the nodes of a cluster claim occurrences."""

    #: Network round trips made so far (a memory store makes none).
    round_trips: int = 0

    @abc.abstractmethod
    def ensure_schema(self) -> None:
        """Create the claims table if allowed, else check that it exists."""

    @abc.abstractmethod
    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim every request for *node* at once; results are in request order.

        Exact slots are won by exactly one node. A window is won only if no claim
        for its job exists within the window before now (the store's clock);
        concurrent window claims of one job are serialized.
        """

    @abc.abstractmethod
    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        """Delete claims made more than *older_than* ago, *batch_size* rows per
        transaction; return how many (with *dry_run*, count them only)."""

    @abc.abstractmethod
    def heartbeat(self, state: NodeState) -> tuple[datetime, list[NodeState]]:
        """Upsert this node's row; return the store clock and every node's row."""

    @abc.abstractmethod
    def nodes(self) -> tuple[datetime, list[NodeState]]:
        """The store clock and every node's row."""

    @abc.abstractmethod
    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        """The newest claims first, filtered by job, winning node and occurrence."""

    @abc.abstractmethod
    def latest_claims(self) -> dict[str, ClaimRow]:
        """The newest claim of every job."""

    @abc.abstractmethod
    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        """Which of the (job, occurrence) keys have a claim."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store may not be used afterwards."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the beat banner and logs, with any password masked."""
