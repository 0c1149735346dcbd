"""The Celery app of the failure-table proofs (tests/fault/test_failure_table.py): real beat,
worker and ``celery elarion-beat`` processes.

Configured like :mod:`tests.acceptance.proj_control` (the ``ELARION_ACC_*`` variables:
broker, queue, claims and runs tables, node; quick liveness; JSON logs with
``ELARION_BEAT_LOG_FORMAT=json``; ``install_worker``), plus:

``ELARION_ACC_SCHEDULE``        which schedule: ``cluster`` (default), ``heavy``, ``dst``
``ELARION_ACC_CONSUME_NODES``   comma-separated beat nodes whose node queues the worker
                                consumes too (one worker runs every beat's every-node runs)
``ELARION_TABLE_CLAIM_TIMEOUT`` ``elarion_beat_claim_timeout`` in seconds (the start race
                                holds the DDL lock longer than the default 5 s)
``ELARION_TABLE_HEAVY``         how many every-second entries the ``heavy`` schedule has

Schedules:

* ``cluster``: :data:`STEADY_JOB` (claimed once per 2 s slot), two every-node entries
  (:data:`EVERY_NODE_JOB`, :data:`LATE_PAUSE_JOB`), a yearly :data:`MANUAL_JOB` with
  ``delivery: at_least_once`` that only ``elarion-beat trigger`` runs, and
  :data:`JITTER_JOB`, a 20 s cron with 19 s of jitter;
* ``heavy``: ``ELARION_TABLE_HEAVY`` entries on ``cron("* * * * * *")``: each tick claims
  a big batch, so beat spends most of its time in database I/O;
* ``dst``: the app runs in Europe/Berlin with a crontab at 02:30 (a wall time repeated on
  the last Sunday of October) and a crontab every minute (hour ``*``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab

import celery_elarion_beat
from celery_elarion_beat import cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import (
    QUICK_LIVENESS,
    configure_from_env,
    consume_beat_node_queues,
    insert_run,
    runs_table_ddl,
)

TASK = "elarion_table.record"

STEADY_JOB = "tbl-steady-2s"
EVERY_NODE_JOB = "tbl-every-node-2s"
LATE_PAUSE_JOB = "tbl-every-node-late-2s"
MANUAL_JOB = "tbl-manual"
JITTER_JOB = "tbl-jitter-20s"
#: the jitter of JITTER_JOB: slots every 20 s, each delayed by 0 .. 19 s
JITTER = timedelta(seconds=19)
JITTER_CRON = "*/20 * * * * *"

DST_REPEATED_JOB = "tbl-dst-0230"
DST_MINUTE_JOB = "tbl-dst-minutely"
HEAVY_PREFIX = "tbl-heavy-"

EVERY_2S = "*/2 * * * * *"

RUNS_TABLE_DDL = runs_table_ddl("pid integer", "outcome text",
                                "started_at timestamptz NOT NULL DEFAULT clock_timestamp()",
                                task_id="task_id text NOT NULL", end="finished_at timestamptz")


def _entry(name: str, schedule: Any, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"task": TASK, "schedule": schedule, "kwargs": {"entry": name}}
    if options:
        entry["options"] = options
    return entry


def cluster_schedule() -> dict[str, Any]:
    yearly = crontab(minute=0, hour=0, day_of_month=1, month_of_year=1)
    return {
        STEADY_JOB: _entry(STEADY_JOB, cron(EVERY_2S)),
        EVERY_NODE_JOB: _entry(EVERY_NODE_JOB, cron(EVERY_2S), placement="every_node"),
        LATE_PAUSE_JOB: _entry(LATE_PAUSE_JOB, cron(EVERY_2S), placement="every_node"),
        MANUAL_JOB: _entry(MANUAL_JOB, yearly, delivery="at_least_once"),
        JITTER_JOB: _entry(JITTER_JOB, cron(JITTER_CRON), jitter=JITTER),
    }


def heavy_schedule(count: int) -> dict[str, Any]:
    return {f"{HEAVY_PREFIX}{i:04}": _entry(f"{HEAVY_PREFIX}{i:04}", cron("* * * * * *"))
            for i in range(count)}


def dst_schedule() -> dict[str, Any]:
    return {DST_REPEATED_JOB: _entry(DST_REPEATED_JOB, crontab(minute=30, hour=2)),
            DST_MINUTE_JOB: _entry(DST_MINUTE_JOB, crontab())}


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    kind = env.get("ELARION_ACC_SCHEDULE") or "cluster"
    conf: dict[str, Any] = dict(QUICK_LIVENESS)
    if env.get("ELARION_TABLE_CLAIM_TIMEOUT"):
        conf["elarion_beat_claim_timeout"] = float(env["ELARION_TABLE_CLAIM_TIMEOUT"])
    if kind == "heavy":
        schedule = heavy_schedule(int(env.get("ELARION_TABLE_HEAVY") or 1500))
    elif kind == "dst":
        schedule = dst_schedule()
        conf.update(timezone="Europe/Berlin", enable_utc=True)
    else:
        schedule = cluster_schedule()
    return configure_from_env(app, env, schedule, "elarion-table", **conf)


def make_app(env: Mapping[str, str], main: str = "elarion_table") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_table"), os.environ)
celery_elarion_beat.install_worker(app)
connect_json_logging(app)


consume_beat_node_queues(app, "tests.fault.proj_table.node_queues")


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution, and the headers it came with, in the runs table."""
    insert_run(self.request, entry, {"pid": os.getpid(), "outcome": "succeeded"})
