"""The Celery app of the live-control acceptance tests (issue #14): real beat and worker
processes that an operator pauses, resumes and triggers with ``celery elarion-beat``.

Like :mod:`tests.acceptance.proj_runs` (same environment variables: broker, queue,
claims and runs tables, node; quick liveness; JSON logs with
``ELARION_BEAT_LOG_FORMAT=json``; ``install_worker``, so the workers record each run
on its claim row and consume their node's queue), with one more:

``ELARION_ACC_CONSUME_NODES``  comma-separated beat nodes whose node queues the
                               worker consumes too (one worker runs the every-node
                               entry of every beat)

The schedule:

* :data:`PAUSED_JOB` and :data:`STEADY_JOB`: ``cron("*/2 * * * * *")``, claimed once
  per slot for the cluster; the tests pause the first, never the second;
* :data:`EVERY_NODE_JOB`: ``cron("*/2 * * * * *")`` with ``placement: every_node``;
* :data:`MANUAL_JOBS`: yearly crontabs (1 January, 00:00) that beat never sends in a
  test: only ``elarion-beat trigger`` runs them.

The one task records each execution in the runs table (the elarion headers it came
with, ``elarion_manual`` among them), in one statement: it starts and finishes then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.schedules import crontab

import celery_elarion_beat
from celery_elarion_beat import cron
from celery_elarion_beat.config.headers import HEADER_MANUAL
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import (
    QUICK_LIVENESS,
    _header,
    configure_from_env,
    consume_beat_node_queues,
    insert_run,
    runs_table_ddl,
)

TASK = "elarion_control.record"

PAUSED_JOB = "ctl-paused-2s"
STEADY_JOB = "ctl-steady-2s"
EVERY_NODE_JOB = "ctl-every-node-2s"
#: triggered only: one run, a race of triggers, forced triggers
MANUAL_ONCE = "ctl-manual-once"
MANUAL_RACE = "ctl-manual-race"
MANUAL_JOBS = (MANUAL_ONCE, MANUAL_RACE)

EVERY_2S = "*/2 * * * * *"

RUNS_TABLE_DDL = runs_table_ddl("pid integer", "outcome text", "manual integer",
                                "started_at timestamptz NOT NULL DEFAULT clock_timestamp()",
                                task_id="task_id text NOT NULL",
                                end="finished_at timestamptz DEFAULT clock_timestamp()")


def _entry(name: str, schedule: Any, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"task": TASK, "schedule": schedule, "kwargs": {"entry": name}}
    if options:
        entry["options"] = options
    return entry


def beat_schedule() -> dict[str, Any]:
    yearly = crontab(minute=0, hour=0, day_of_month=1, month_of_year=1)
    return {
        PAUSED_JOB: _entry(PAUSED_JOB, cron(EVERY_2S)),
        STEADY_JOB: _entry(STEADY_JOB, cron(EVERY_2S)),
        EVERY_NODE_JOB: _entry(EVERY_NODE_JOB, cron(EVERY_2S), placement="every_node"),
        **{job: _entry(job, yearly) for job in MANUAL_JOBS},
    }


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    return configure_from_env(app, env, beat_schedule(), "elarion-control-acceptance",
                              **QUICK_LIVENESS)


def make_app(env: Mapping[str, str], main: str = "elarion_control") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_control"), os.environ)
celery_elarion_beat.install_worker(app)
connect_json_logging(app)


consume_beat_node_queues(app, "tests.acceptance.proj_control.node_queues")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution, and the headers it came with, in the runs table."""
    insert_run(self.request, entry, {"pid": os.getpid(), "outcome": "succeeded",
                                     "manual": _int(_header(self.request, HEADER_MANUAL))})
