"""The in-memory claim store: one process, no I/O.

Selected with the DSN ``memory://`` (or ``memory://name`` for a separate
namespace). Schedulers in one process that use the same name share claims, so
it coordinates several beat threads of one process and serves unit tests; it
cannot coordinate separate processes or hosts.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..clock import Clock, utcnow
from ..slots import ClaimKind
from .base import ClaimRequest, ClaimResult, ClaimStore

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

    def purge(self, older_than: timedelta) -> int:
        cutoff = self._clock() - older_than
        with self._ns.lock:
            purged = 0
            for rows in self._ns.jobs.values():
                old = [occ for occ, row in rows.items() if row.claimed_at < cutoff]
                for occ in old:
                    del rows[occ]
                purged += len(old)
        return purged

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


def _answer(request: ClaimRequest, occ: datetime, node: str, held: _Row) -> ClaimResult:
    mine = held.node == node and held.task_id == request.task_id
    return ClaimResult(request, mine, occ, held.node, held.task_id)
