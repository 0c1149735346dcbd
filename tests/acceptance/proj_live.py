"""The Celery app of the live-schedules acceptance tests (database entries edited while
the cluster runs), run as real beat and worker processes.

Configured from the environment like :mod:`tests.acceptance.proj` (``ELARION_ACC_BROKER``,
``ELARION_ACC_QUEUE``, ``ELARION_ACC_CLAIMS_DSN``, ``ELARION_ACC_CLAIMS_TABLE``,
``ELARION_ACC_NODE``, ``ELARION_ACC_RUNS_DSN``, ``ELARION_ACC_RUNS_TABLE``). Database
entries are on (``elarion_beat_db_entries``), the one task allowed; no code entry, so
every entry is a database entry the test writes. The task records each execution, its
arguments and the elarion headers into the runs table.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from tests.acceptance.proj import HEARTBEAT, configure_from_env, insert_run, runs_table_ddl

TASK = "elarion_live_acc.record"
#: the app's main name: the cluster whose database entries it runs
MAIN = "elarion_live_acc"
RUNS_TABLE_DDL = runs_table_ddl("args text")


def make_app(env: Any, main: str = MAIN) -> Celery:
    return configure_from_env(
        Celery(main, set_as_current=False), env, {}, "elarion-live-acceptance",
        elarion_beat_db_entries=True, elarion_beat_db_entry_tasks=TASK,
        elarion_beat_db_entries_poll=1.0, elarion_beat_heartbeat_interval=HEARTBEAT,
        elarion_beat_node_timeout=3.0)


app = make_app(os.environ)


@app.task(bind=True, name=TASK)
def record(self: Any, *args: Any, entry: str | None = None) -> None:
    """Record this execution, its arguments and its headers in the runs table."""
    insert_run(self.request, entry, extra={"args": json.dumps(list(args))})
