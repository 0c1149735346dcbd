"""The PostgreSQL engine: how the claim store connects, directly or through PgBouncer.

Directly, each connection carries the claim timeout and ``jit=off`` in its startup
packet (``options=-c statement_timeout=... -c lock_timeout=... -c jit=off``), and psycopg prepares
a statement on the server after its fifth execution on a connection.

PgBouncer in transaction mode (``elarion_beat_pgbouncer = True``) hands each
transaction whichever server connection is free, so neither survives:

* PgBouncer refuses the ``options`` startup parameter ("unsupported startup
  parameter: options"); ignoring it (``ignore_startup_parameters``) would drop
  the timeouts silently. They are set per transaction instead, with
  ``set_config(..., is_local => true)`` (``SET LOCAL``): in the claim's pipeline
  (no extra round trip) and at the start of every other transaction;
* a statement prepared on one server connection is missing on the next
  ("prepared statement "_pg3_0" does not exist") or already there under the same
  name ("... already exists"): prepares are switched off (``prepare_threshold=None``).

Unprepared, every claim is planned with its actual arrays, and the planner's
estimate of a chunk of 1,000 passes ``jit_above_cost``: PostgreSQL then compiles
the statement at every execution, which tripled the database CPU of a claim
(benchmarks/capacity.py). The same ``SET LOCAL`` turns JIT off: a claim is index
probes, which JIT never speeds up.

Everything else the store does is per transaction already: the advisory locks are
``pg_advisory_xact_lock``, nothing LISTENs, and no session state is set.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine

from ..settings import Settings

__all__ = ["LOCAL_SETTINGS_SQL", "local_settings", "postgres_engine"]

#: The claim timeout, and no JIT, for one transaction only (``SET LOCAL``): safe
#: through PgBouncer.
LOCAL_SETTINGS_SQL = ("SELECT set_config('statement_timeout', %(ms)s, true), "
                      "set_config('lock_timeout', %(ms)s, true), set_config('jit', 'off', true)")


def _milliseconds(settings: Settings) -> int:
    return int(settings.claim_timeout * 1000)


def local_settings(settings: Settings) -> dict[str, Any] | None:
    """The parameters of :data:`LOCAL_SETTINGS_SQL` when every transaction must set
    them itself (PgBouncer mode), else None (the session carries the timeouts)."""
    return {"ms": str(_milliseconds(settings))} if settings.pgbouncer else None


def postgres_engine(settings: Settings) -> Engine:
    """A small pool of psycopg 3 connections to the claims database."""
    timeout = settings.claim_timeout
    ms = _milliseconds(settings)
    connect_args: dict[str, Any] = {
        "connect_timeout": max(2, math.ceil(timeout)),
        "application_name": f"celery-elarion-beat {settings.node}"[:63],
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
    }
    if settings.pgbouncer:
        connect_args["prepare_threshold"] = None  # never prepare server-side
    else:
        # no JIT either: past jit_above_cost (a chunk of 1,000 on a big table) every
        # re-planned claim paid a compilation, up to 1.9 s at 10 million rows
        connect_args["options"] = f"-c statement_timeout={ms} -c lock_timeout={ms} -c jit=off"
    engine = create_engine(settings.require_dsn(), pool_size=1, max_overflow=4,
                           pool_timeout=timeout, pool_recycle=1800, connect_args=connect_args)
    params = local_settings(settings)
    if params is not None:
        def set_local(conn: Connection) -> None:
            conn.exec_driver_sql(LOCAL_SETTINGS_SQL, params)

        event.listen(engine, "begin", set_local)
    return engine
