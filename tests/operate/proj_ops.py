"""A small app for the operations tests; configured from ELARION_OPS_* variables."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import cron

app = Celery("proj_ops", broker=os.environ.get("ELARION_OPS_BROKER", "memory://"))
schedule = {
    "report": {"task": "ops.report", "schedule": crontab()},
    "tick": {"task": "ops.tick", "schedule": cron("*/2 * * * * *")},
    "poll": {"task": "ops.poll", "schedule": timedelta(seconds=2)},
}
if os.environ.get("ELARION_OPS_EXTRA"):
    schedule["extra-cleanup"] = {"task": "ops.cleanup", "schedule": timedelta(seconds=30)}
app.conf.update(
    elarion_beat_dsn=os.environ.get("ELARION_OPS_DSN"),
    elarion_beat_table=os.environ.get("ELARION_OPS_TABLE", "ops_claims"),
    elarion_beat_heartbeat_interval=float(os.environ.get("ELARION_OPS_HEARTBEAT", "30")),
    task_default_queue=os.environ.get("ELARION_OPS_QUEUE", "ops"),
    beat_max_loop_interval=1,
    result_expires=None,
    beat_schedule=schedule,
)


@app.task(name="ops.report")
def report() -> None: ...
