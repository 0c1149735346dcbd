"""Claim stores: the one seam through which nodes coordinate.

``open_store(settings)`` opens the store of the DSN's backend (the table of
backends is :data:`celery_elarion_beat.backends.BACKENDS`).
"""

from __future__ import annotations

from ..backends import backend_for
from ..clock import Clock, utcnow
from ..settings import Settings
from .base import ClaimRequest, ClaimResult, ClaimRow, ClaimStore, PublishReport, Takeover
from .memory import MemoryClaimStore
from .schema import claims_table

__all__ = [
    "ClaimRequest",
    "ClaimResult",
    "ClaimRow",
    "ClaimStore",
    "MemoryClaimStore",
    "PublishReport",
    "Takeover",
    "claims_table",
    "open_store",
]


def open_store(settings: Settings, clock: Clock = utcnow) -> ClaimStore:
    """Return the store the settings' DSN names; opens no connection yet."""
    return backend_for(settings.require_dsn()).open(settings, clock)
