"""The Celery module of the Django test project, as a Django project writes it
(``celery -A tests.integration.django_celery elarion-beat ...``): Django's settings
(tests/integration/django_settings.py), Celery configured from them (``CELERY_``
namespace), database entries on, the tasks ``dj.*`` allowed, one code entry."""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.django_settings")

app = Celery("djproj", broker=os.environ.get("ELARION_DJANGO_TEST_BROKER", "memory://"),
             set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    elarion_beat_db_entries=True,
    elarion_beat_db_entry_tasks="dj.*",
    timezone="UTC",
    result_expires=None,
    # its own queue: the memory broker's queues are one per process, and a message the
    # project's beat left behind must not reach another test's worker
    task_default_queue="djproj",
    beat_schedule={"code-report": {"task": "dj.code_report", "schedule": crontab(minute=0)}},
)


@app.task(name="dj.report", shared=False)  # not in every later app of the run
def report(*args: object, **kwargs: object) -> None: ...
