"""PostgreSQL's part of ``init-db``'s upgrade of tables of 0.2 (:mod:`.sql_upgrade`).

On a connection of its own (no statement timeout, no client-side watchdog: an index
of a big table takes as long as it takes), the new key of each plain table is built
``CONCURRENTLY`` under a temporary name while the claims go on; then one short
transaction, under the table's DDL lock and a brief ``lock_timeout`` (the claims
queue behind a waiting DDL), swaps them in, drops the cluster columns' defaults and
the heartbeat rows of nodes of 0.2. A swap that finds a table busy is tried again a
few times. A partitioned claims table gets its keys built in that transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Table
from sqlalchemy.engine import Dialect

from .clusters import LEGACY_NODE
from .schema import CLUSTER
from .sql_upgrade import KeyGap, pg_build, pg_swap

__all__ = ["SWAP_ATTEMPTS", "swap_keys"]

#: Transactions the swap tries before it gives up on a busy table.
SWAP_ATTEMPTS = 5


def swap_keys(pc: psycopg.Connection[Any], gaps: list[KeyGap], dialect: Dialect, *,
              quoted: Callable[[Table], str], concurrently: Callable[[KeyGap], bool],
              nodes: Table, namespace: int, lock_timeout_ms: int) -> None:
    """Swap *gaps* for the declared keys on *pc* (autocommit): those *concurrently*
    accepts are built first, outside the swap's transaction."""
    built = [gap for gap in gaps if concurrently(gap)]
    for gap in built:
        for statement in pg_build(gap, quoted(gap.table), dialect):
            pc.execute(statement)
    swaps = [statement for gap in gaps for statement in pg_swap(
        gap, quoted(gap.table), dialect, built=any(gap is b for b in built))]
    tables = {id(gap.table): gap.table for gap in gaps}.values()
    swaps += [f"ALTER TABLE {quoted(t)} ALTER COLUMN {CLUSTER} DROP DEFAULT" for t in tables]
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        try:
            with pc.transaction():
                pc.execute("SELECT pg_advisory_xact_lock(%s, 0)", (namespace,))
                pc.execute("SELECT set_config('lock_timeout', %s, true)",
                           (str(lock_timeout_ms),))
                pc.execute(f"DELETE FROM {quoted(nodes)} WHERE {CLUSTER} = %s", (LEGACY_NODE,))
                for statement in swaps:
                    pc.execute(statement)
            return
        except psycopg.errors.LockNotAvailable:
            if attempt == SWAP_ATTEMPTS:
                raise
            time.sleep(0.2 * attempt)
