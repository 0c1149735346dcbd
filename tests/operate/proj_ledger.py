"""An app for the reconciliation tests (``status --since``, ``claims``): one entry of
each kind. The tests point it at their store (``elarion_beat_dsn``)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

app = Celery("proj_ledger", broker="memory://", set_as_current=False)
app.conf.update(
    elarion_beat_publish_timeout=1,
    beat_schedule={
        "minutely": {"task": "ledger.minutely", "schedule": crontab()},
        "poll": {"task": "ledger.poll", "schedule": timedelta(minutes=10)},
        "cache": {"task": "ledger.cache", "schedule": crontab(),
                  "options": {"placement": "every_node"}},
        "fresh": {"task": "ledger.fresh", "schedule": crontab()},
    },
)
