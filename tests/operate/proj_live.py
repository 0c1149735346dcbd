"""A small app for the live-schedules tests: code entries, and database entries on
(``elarion_beat_db_entries``), the tasks ``live.*`` allowed; pointed at a table by the
test (or the ELARION_LIVE_* variables)."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

app = Celery("proj_live", broker=os.environ.get("ELARION_LIVE_BROKER", "memory://"))
app.conf.update(
    elarion_beat_dsn=os.environ.get("ELARION_LIVE_DSN"),
    elarion_beat_table=os.environ.get("ELARION_LIVE_TABLE", "live_claims"),
    elarion_beat_db_entries=True,
    elarion_beat_db_entry_tasks="live.*",
    timezone="UTC",
    result_expires=None,
    beat_schedule={
        "report": {"task": "live.report", "schedule": crontab(minute=0)},
        "poll": {"task": "live.poll", "schedule": timedelta(seconds=30)},
    },
)


@app.task(name="live.report")
def report() -> None: ...


@app.task(name="live.job")
def job(*args: object, **kwargs: object) -> None: ...
