"""The app of the ``elarion-beat preview`` tests: a Europe/Berlin schedule with a
crontab at 02:30, our cron in New York, a crontab every hour of the night, an interval,
an every-node entry and one broken entry; configured from ELARION_PREVIEW_* variables."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import cron

app = Celery("proj_preview", broker="memory://")
app.conf.update(
    timezone="Europe/Berlin",
    elarion_beat_dsn=os.environ.get("ELARION_PREVIEW_DSN"),
    elarion_beat_table=os.environ.get("ELARION_PREVIEW_TABLE", "preview_claims"),
    result_expires=None,
    beat_schedule={
        "nightly-report": {"task": "preview.report", "schedule": crontab(minute=30, hour=2)},
        "ny-export": {"task": "preview.export",
                      "schedule": cron("30 2 * * *", tz="America/New_York")},
        "night-batch": {"task": "preview.batch", "schedule": crontab(minute=0, hour="0-4")},
        "poll-partner": {"task": "preview.poll", "schedule": timedelta(hours=6)},
        "refresh-cache": {"task": "preview.refresh", "schedule": crontab(minute=0, hour="*/12"),
                          "options": {"placement": "every_node"}},
        "broken": {"task": "preview.broken", "schedule": "every day"},
    },
)
