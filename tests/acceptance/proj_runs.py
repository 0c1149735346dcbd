"""The Celery app of the "know what ran" acceptance tests (issue #13): real beat and
worker processes that record their runs in the claims ledger.

Like :mod:`tests.acceptance.proj_missed` (same environment variables: broker,
queue, claims and runs tables, node, ``ELARION_ACC_SCHEDULE``), and the app calls
:func:`celery_elarion_beat.install_worker`: its workers consume their node's queue
and write each run's start and finish on the claim row. Started with
``ELARION_BEAT_LOG_FORMAT=json`` (the tests do), beats and workers log JSON lines.

``ELARION_ACC_SCHEDULE`` picks the entries, comma-separated groups:

* ``recorded``: :data:`QUICK_CRON` (``cron("* * * * * *")``, the quick task),
  :data:`QUICK_INTERVAL` (every :data:`INTERVAL`, the quick task) and
  :data:`FAILING` (``cron("*/2 * * * * *")``, the task that raises ValueError);
* ``overlap``: :data:`SKIP_JOB` (``overlap: skip``) and :data:`ALLOW_JOB` (the
  default, ``allow``), both the :data:`SLOW` s task on ``cron("* * * * * *")``;
* ``killed``: :data:`KILLED_JOB`, a :data:`LONG` s task on ``cron("* * * * * *")``
  with ``overlap: skip`` and ``overlap_timeout`` :data:`KILLED_TIMEOUT`;
* ``everynode``: :data:`EVERY_NODE_JOB`, the quick task on every node every second;
* ``coverage``: :data:`COVERAGE_JOB`, the quick task on every node every
  :data:`COVERAGE_PERIOD` (an interval).

Each task writes its own record of the execution in the runs table, independently
of the ledger: a row when its body starts (with the elarion headers it came with,
the worker's host name and the DB clock), completed with the outcome and the DB
clock when the body ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery

import celery_elarion_beat
from celery_elarion_beat import cron
from celery_elarion_beat.config.headers import HEADERS
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import (
    QUICK_LIVENESS,
    _header,
    configure_from_env,
    runs_table_ddl,
)

QUICK_TASK = "elarion_runs.quick"
FAILING_TASK = "elarion_runs.fail"
SLOW_TASK = "elarion_runs.slow"

#: the quick task's body sleeps this long
QUICK = 0.2
#: the slow task of the group "overlap": longer than the cron's period
SLOW = 3.0
#: the task of the group "killed": far longer than the test waits for it
LONG = 30.0

# -- group "recorded" ----------------------------------------------------------------
QUICK_CRON = "quick-cron-1s"
QUICK_INTERVAL = "quick-interval-2s"
INTERVAL = timedelta(seconds=2)
FAILING = "failing-cron-2s"
#: the message of the failing task's exception
FAILURE = "elarion acceptance: this task always fails"

# -- group "overlap" -----------------------------------------------------------------
SKIP_JOB = "slow-skip-1s"
ALLOW_JOB = "slow-allow-1s"

# -- group "killed" ------------------------------------------------------------------
KILLED_JOB = "long-skip-timeout-1s"
KILLED_TIMEOUT = timedelta(seconds=6)

# -- group "everynode" ----------------------------------------------------------------
EVERY_NODE_JOB = "quick-every-node-1s"

# -- group "coverage" -----------------------------------------------------------------
COVERAGE_JOB = "quick-every-node-3s"
COVERAGE_PERIOD = timedelta(seconds=3)


EVERY_SECOND = "* * * * * *"
EVERY_2S = "*/2 * * * * *"

RUNS_TABLE_DDL = runs_table_ddl("pid integer", "outcome text",
                                "started_at timestamptz NOT NULL DEFAULT clock_timestamp()",
                                task_id="task_id text NOT NULL", end="finished_at timestamptz")


def _entry(name: str, task: str, schedule: Any, kwargs: Mapping[str, Any] | None = None,
           **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"task": task, "schedule": schedule,
                             "kwargs": {"entry": name, **(kwargs or {})}}
    if options:
        entry["options"] = options
    return entry


def beat_schedule(groups: str) -> dict[str, Any]:
    schedule: dict[str, Any] = {}
    for group in filter(None, (g.strip() for g in groups.split(","))):
        if group == "recorded":
            schedule.update({
                QUICK_CRON: _entry(QUICK_CRON, QUICK_TASK, cron(EVERY_SECOND)),
                QUICK_INTERVAL: _entry(QUICK_INTERVAL, QUICK_TASK, INTERVAL),
                FAILING: _entry(FAILING, FAILING_TASK, cron(EVERY_2S)),
            })
        elif group == "overlap":
            schedule.update({
                SKIP_JOB: _entry(SKIP_JOB, SLOW_TASK, cron(EVERY_SECOND), {"seconds": SLOW},
                                 overlap="skip"),
                ALLOW_JOB: _entry(ALLOW_JOB, SLOW_TASK, cron(EVERY_SECOND), {"seconds": SLOW}),
            })
        elif group == "killed":
            schedule[KILLED_JOB] = _entry(KILLED_JOB, SLOW_TASK, cron(EVERY_SECOND),
                                          {"seconds": LONG}, overlap="skip",
                                          overlap_timeout=KILLED_TIMEOUT)
        elif group == "everynode":
            schedule[EVERY_NODE_JOB] = _entry(EVERY_NODE_JOB, QUICK_TASK, cron(EVERY_SECOND),
                                              placement="every_node")
        elif group == "coverage":
            schedule[COVERAGE_JOB] = _entry(COVERAGE_JOB, QUICK_TASK, COVERAGE_PERIOD,
                                            placement="every_node")
        else:
            raise ValueError(f"unknown ELARION_ACC_SCHEDULE group {group!r}")
    return schedule


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    return configure_from_env(app, env, beat_schedule(env.get("ELARION_ACC_SCHEDULE", "")),
                              "elarion-runs-acceptance", **QUICK_LIVENESS)


def make_app(env: Mapping[str, str], main: str = "elarion_runs") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_runs"), os.environ)
celery_elarion_beat.install_worker(app)
connect_json_logging(app)


# -- the independent record of each execution ------------------------------------------


def _execute(query: Any, params: list[Any]) -> Any:
    import psycopg

    with psycopg.connect(os.environ["ELARION_ACC_RUNS_DSN"], autocommit=True,
                         connect_timeout=10) as conn:
        return conn.execute(query, params).fetchone()


def begin(request: Any, entry: str | None) -> int:
    """Insert the start of this execution (DB clock) and the headers it came with."""
    from psycopg import sql

    values = {name: _header(request, name) for name in HEADERS}
    row = {"entry": entry, "job": values["elarion_job"],
           "occurrence": values["elarion_occurrence"], "node": values["elarion_node"],
           "placement": values["elarion_placement"], "claim": values["elarion_claim"],
           "task_id": request.id, "worker": request.hostname, "pid": os.getpid()}
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
        sql.Identifier(os.environ["ELARION_ACC_RUNS_TABLE"]),
        sql.SQL(", ").join(map(sql.Identifier, row)),
        sql.SQL(", ").join(sql.Placeholder() * len(row)))
    return int(_execute(query, list(row.values()))[0])


def end(row_id: int, outcome: str) -> None:
    """Complete the record of this execution: its outcome, and its end (DB clock)."""
    from psycopg import sql

    query = sql.SQL("UPDATE {} SET outcome = %s, finished_at = clock_timestamp() "
                    "WHERE id = %s RETURNING id").format(
        sql.Identifier(os.environ["ELARION_ACC_RUNS_TABLE"]))
    _execute(query, [outcome, row_id])


@app.task(bind=True, name=QUICK_TASK)
def quick(self: Any, entry: str | None = None) -> None:
    """Sleep :data:`QUICK` seconds."""
    row = begin(self.request, entry)
    time.sleep(QUICK)
    end(row, "succeeded")


@app.task(bind=True, name=FAILING_TASK)
def fail(self: Any, entry: str | None = None) -> None:
    """Raise ValueError (after recording that it did)."""
    row = begin(self.request, entry)
    end(row, "failed")
    raise ValueError(FAILURE)


@app.task(bind=True, name=SLOW_TASK)
def slow(self: Any, entry: str | None = None, seconds: float = SLOW) -> None:
    """Sleep *seconds*."""
    row = begin(self.request, entry)
    time.sleep(seconds)
    end(row, "succeeded")
