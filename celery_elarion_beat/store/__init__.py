"""Claim stores: the one seam through which nodes coordinate.

``open_store(settings)`` picks the backend from the DSN:

* ``postgresql://...`` (or ``postgresql+psycopg://...``): :class:`PostgresClaimStore`;
* ``memory://[name]``: :class:`MemoryClaimStore`, one process only.
"""

from __future__ import annotations

from ..clock import Clock, utcnow
from ..settings import Settings
from .base import ClaimRequest, ClaimResult, ClaimStore
from .memory import MemoryClaimStore
from .schema import claims_table

__all__ = [
    "ClaimRequest",
    "ClaimResult",
    "ClaimStore",
    "MemoryClaimStore",
    "claims_table",
    "open_store",
]


def open_store(settings: Settings, clock: Clock = utcnow) -> ClaimStore:
    """Return the store the settings' DSN names; opens no connection yet."""
    dsn = settings.require_dsn()
    if dsn.startswith("memory://"):
        return MemoryClaimStore.from_dsn(dsn, clock=clock)
    from .postgres import PostgresClaimStore

    return PostgresClaimStore(settings)
