"""Claim stores: the one seam through which nodes coordinate.

* :mod:`.records`, :mod:`.control_records`, :mod:`.one_off_records`, :mod:`.states`:
  the plain value types a store takes and returns (no SQLAlchemy);
* :mod:`.interface`: the role interfaces (claims, runs, control, nodes, one-offs) and
  :class:`ClaimStore`, which every backend implements whole;
* :mod:`.schema`: every table, for ``metadata.create_all`` and Alembic;
* :mod:`.registry`: ``open_store(settings)``, the store of the DSN's backend;
* the backends: :mod:`.memory`, :mod:`.postgres`, :mod:`.mysql`, :mod:`.sqlite`
  (the SQL ones share :mod:`.sql`).
"""

from __future__ import annotations

from .interface import ClaimStore
from .memory import MemoryClaimStore
from .records import (
    ClaimRequest,
    ClaimResult,
    ClaimRow,
    PublishReport,
    Takeover,
)
from .registry import open_store
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
