"""The in-memory claim store: one process, no I/O.

Selected with the DSN ``memory://`` (or ``memory://name`` for a separate
namespace). Schedulers in one process that use the same name share claims, so
it coordinates several beat threads of one process and serves unit tests; it
cannot coordinate separate processes or hosts.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..clock import Clock, utcnow
from ..slots import ClaimKind
from .base import ClaimRequest, ClaimResult, ClaimRow, ClaimStore, JobLedger, NodeState

__all__ = ["MemoryClaimStore"]


@dataclass(frozen=True)
class _Row:
    node: str
    task_id: str
    kind: ClaimKind
    claimed_at: datetime


class _Namespace:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, dict[datetime, _Row]] = {}
        self.nodes: dict[str, NodeState] = {}


_NAMESPACES: dict[str, _Namespace] = {}
_NAMESPACES_LOCK = threading.Lock()


class MemoryClaimStore(ClaimStore):
    """Claims kept in this process, shared by every store of the same *name*."""

    def __init__(self, name: str = "", clock: Clock = utcnow) -> None:
        self.name = name
        self._clock = clock
        with _NAMESPACES_LOCK:
            self._ns = _NAMESPACES.setdefault(name, _Namespace())

    @classmethod
    def from_dsn(cls, dsn: str, clock: Clock = utcnow) -> MemoryClaimStore:
        return cls(dsn[len("memory://"):].strip("/"), clock=clock)

    def ensure_schema(self) -> None:
        return None

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        with self._ns.lock:
            return [self._claim_one(node, request) for request in requests]

    def _claim_one(self, node: str, request: ClaimRequest) -> ClaimResult:
        rows = self._ns.jobs.setdefault(request.job, {})
        now = self._clock()
        if request.kind is ClaimKind.SLOT:
            assert request.slot is not None
            held = rows.get(request.slot)
            if held is None:
                rows[request.slot] = _Row(node, request.task_id, request.kind, now)
                return ClaimResult(request, True, request.slot, node, request.task_id)
            return _answer(request, request.slot, node, held)
        assert request.window is not None
        recent = [(occ, row) for occ, row in rows.items() if occ > now - request.window]
        if recent:
            occ, held = max(recent, key=lambda pair: pair[0])
            return _answer(request, occ, node, held)
        rows[now] = _Row(node, request.task_id, request.kind, now)
        return ClaimResult(request, True, now, node, request.task_id)

    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        cutoff = self._clock() - older_than
        with self._ns.lock:
            purged = 0
            for rows in self._ns.jobs.values():
                newest = max(rows, default=None)
                old = [occ for occ, row in rows.items()
                       if row.claimed_at < cutoff and occ != newest]
                if not dry_run:
                    for occ in old:
                        del rows[occ]
                purged += len(old)
        return purged

    def heartbeat(self, state: NodeState, retention: timedelta | None = None,
                  live_within: timedelta | None = None) -> tuple[datetime, list[NodeState]]:
        now = self._clock()
        with self._ns.lock:
            held = self._ns.nodes.get(state.node)
            started = held.started_at if held and held.boot_id == state.boot_id else now
            self._ns.nodes[state.node] = dataclasses.replace(state, started_at=started,
                                                             last_seen=now)
            if retention is not None:
                for name, row in list(self._ns.nodes.items()):
                    if row.last_seen is not None and row.last_seen < now - retention:
                        del self._ns.nodes[name]
            rows = [dataclasses.replace(
                        row, counts={},
                        entries={} if row.fingerprint == state.fingerprint else row.entries)
                    for row in self._ns.nodes.values()
                    if live_within is None or row.is_live(now, live_within)]
            return now, sorted(rows, key=lambda n: n.node)

    def clock(self) -> datetime:
        return self._clock()

    def nodes(self) -> tuple[datetime, list[NodeState]]:
        with self._ns.lock:
            return self._clock(), sorted(self._ns.nodes.values(), key=lambda n: n.node)

    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        rows = [r for r in self._rows() if (job is None or r.job == job)
                and (node is None or r.node == node)
                and (since is None or r.occurrence >= since)]
        rows.sort(key=lambda r: r.job)
        rows.sort(key=lambda r: r.occurrence, reverse=True)  # stable: job ascending within
        return rows[:limit]

    def latest_claims(self) -> dict[str, ClaimRow]:
        latest: dict[str, ClaimRow] = {}
        for row in self._rows():
            if row.job not in latest or row.occurrence > latest[row.job].occurrence:
                latest[row.job] = row
        return latest

    def job_ledger(self, ranges: Mapping[str, tuple[datetime, datetime]]) -> dict[str, JobLedger]:
        with self._ns.lock:
            out = {}
            for job, (start, end) in ranges.items():
                rows = self._ns.jobs.get(job, {})
                out[job] = JobLedger(min(rows, default=None),
                                     frozenset(occ for occ in rows if start <= occ <= end))
            return out

    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        with self._ns.lock:
            return {(job, occ) for job, occ in keys if occ in self._ns.jobs.get(job, {})}

    def _rows(self) -> list[ClaimRow]:
        with self._ns.lock:
            return [ClaimRow(job, occ, row.node, row.task_id, row.kind.value, row.claimed_at)
                    for job, rows in self._ns.jobs.items() for occ, row in rows.items()]

    def close(self) -> None:
        return None

    def describe(self) -> str:
        return f"memory://{self.name} (this process only)"

    @staticmethod
    def reset(name: str | None = None) -> None:
        """Forget the claims of namespace *name* (all namespaces when None)."""
        with _NAMESPACES_LOCK:
            for key in list(_NAMESPACES) if name is None else [name]:
                ns = _NAMESPACES.get(key)
                if ns is not None:
                    with ns.lock:
                        ns.jobs.clear()
                        ns.nodes.clear()


def _answer(request: ClaimRequest, occ: datetime, node: str, held: _Row) -> ClaimResult:
    return ClaimResult(request, False, occ, held.node, held.task_id)
