"""The Celery app of the one-off acceptance tests (``schedule_once``), run as real beat
and worker processes.

Configured from the environment like :mod:`tests.acceptance.proj` (``ELARION_ACC_BROKER``,
``ELARION_ACC_QUEUE``, ``ELARION_ACC_CLAIMS_DSN``, ``ELARION_ACC_CLAIMS_TABLE``,
``ELARION_ACC_NODE``, ``ELARION_ACC_RUNS_DSN``, ``ELARION_ACC_RUNS_TABLE``), plus:

``ELARION_ACC_ONE_OFFS_LEASE``  -> ``elarion_beat_one_offs_lease`` (seconds)
``ELARION_ACC_ONE_OFFS_POLL``   -> ``elarion_beat_one_offs_poll`` (seconds)
``ELARION_ACC_ONE_OFFS_BATCH``  -> ``elarion_beat_one_offs_batch``

The beat schedule is empty: beat only publishes one-offs. The one task (its name is
this app's own: ``shared=False``) records each execution, its task id, its
arguments and the elarion headers it came with, into the runs table.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from celery_elarion_beat.testing._harness import conf_from_env
from tests.acceptance.proj import configure_from_env

TASK = "elarion_one_offs_acc.record"
#: a task name no worker or beat of this app knows
UNREGISTERED = "elarion_one_offs_acc.nobody_has_this"

RUNS_TABLE_DDL = """
CREATE TABLE {table} (
    id bigserial PRIMARY KEY,
    task_id text NOT NULL,
    args text,
    kwargs text,
    one_off text,
    node text,
    worker text,
    executed_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

ONE_OFF_ENV = {"ELARION_ACC_ONE_OFFS_LEASE": "elarion_beat_one_offs_lease",
               "ELARION_ACC_ONE_OFFS_POLL": "elarion_beat_one_offs_poll",
               "ELARION_ACC_ONE_OFFS_BATCH": "elarion_beat_one_offs_batch"}


def make_app(env: Any, main: str = "elarion_one_offs_acc") -> Celery:
    app = configure_from_env(Celery(main, set_as_current=False), env, {},
                             "elarion-one-offs-acceptance")
    conf_from_env(app, env, ONE_OFF_ENV)
    return app


app = make_app(os.environ)

#: one connection per worker process (the 10,000-run scenarios insert fast)
_kept: Any = None


@app.task(bind=True, name=TASK, shared=False)
def record(self: Any, *args: Any, **kwargs: Any) -> None:
    """Record this execution in the runs table."""
    global _kept
    import psycopg
    from psycopg import sql

    query = sql.SQL("INSERT INTO {} (task_id, args, kwargs, one_off, node, worker) "
                    "VALUES (%s, %s, %s, %s, %s, %s)").format(
        sql.Identifier(os.environ["ELARION_ACC_RUNS_TABLE"]))
    values = (self.request.id, json.dumps(list(args)), json.dumps(kwargs),
              getattr(self.request, "elarion_one_off", None),
              getattr(self.request, "elarion_node", None), self.request.hostname)
    for attempt in (1, 2):
        if _kept is None or _kept.closed:
            _kept = psycopg.connect(os.environ["ELARION_ACC_RUNS_DSN"], autocommit=True,
                                    connect_timeout=10)
        try:
            _kept.execute(query, values)
            return
        except psycopg.OperationalError:
            _kept.close()
            _kept = None
            if attempt == 2:
                raise
