"""Claim stores: the one seam through which nodes coordinate.

``open_store(settings)`` picks the backend from the DSN:

* ``postgresql://...`` (or ``postgresql+psycopg://...``): :class:`PostgresClaimStore`;
* ``mysql://...`` (MariaDB or MySQL, PyMySQL driver): :class:`~.mysql.MysqlClaimStore`;
* ``sqlite:////path/claims.db``: :class:`~.sqlite.SqliteClaimStore`, one host only;
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
    if dsn.startswith("sqlite"):
        from .sqlite import SqliteClaimStore

        return SqliteClaimStore(settings, clock=clock)
    if dsn.startswith("mysql"):
        from .mysql import MysqlClaimStore

        return MysqlClaimStore(settings)
    from .postgres import PostgresClaimStore

    return PostgresClaimStore(settings)
