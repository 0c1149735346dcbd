"""An app for the every-node accountability tests (``status`` and ``node-missing``, #35):
an every-node entry every 10 s, a cluster entry beside it (never judged per node). The
tests point it at their store (``elarion_beat_dsn``)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery

PERIOD = timedelta(seconds=10)

app = Celery("proj_coverage", broker="memory://", set_as_current=False)
app.conf.update(
    beat_schedule={
        "cache": {"task": "coverage.cache", "schedule": PERIOD,
                  "options": {"placement": "every_node"}},
        "report": {"task": "coverage.report", "schedule": timedelta(hours=12)},
    },
)
