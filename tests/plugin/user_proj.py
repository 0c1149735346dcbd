"""A user's project, as a user writes it: one Celery app and its beat schedule.

Its broker and claims database are names that do not resolve: a simulation that
tried to reach either would fail.
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import cron

app = Celery("user_proj", broker="amqp://guest:guest@rabbit.invalid:5672//",
             set_as_current=False)
app.conf.update(
    timezone="Europe/Berlin",
    elarion_beat_dsn="postgresql://beat:secret@db.invalid:5432/app",
    beat_schedule={
        # every day at 02:30 Berlin time: a wall time that is skipped on spring-forward
        # day and happens twice on fall-back day
        "nightly-report": {"task": "user_proj.report", "schedule": crontab(minute=30, hour=2)},
        # every hour, on the hour (our cron, in the app's time zone)
        "hourly-sync": {"task": "user_proj.sync", "schedule": cron("0 * * * *")},
        # every six hours on every node: a per-node cache
        "refresh-cache": {"task": "user_proj.refresh", "schedule": crontab(minute=0, hour="*/6"),
                          "options": {"placement": "every_node"}},
        # a plain interval: claimed as a window
        "poll-partner": {"task": "user_proj.poll", "schedule": timedelta(hours=4)},
    },
)


@app.task(name="user_proj.report")
def report() -> str:
    return "report"


@app.task(name="user_proj.sync")
def sync() -> str:
    return "sync"


@app.task(name="user_proj.refresh")
def refresh() -> str:
    return "refresh"


@app.task(name="user_proj.poll")
def poll() -> str:
    return "poll"
