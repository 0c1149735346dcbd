"""A Django project's beat: Celery configured from Django's settings (namespace
``CELERY``) with ``CELERY_ELARION_BEAT_DJANGO_DATABASE = "default"`` claims in the
database of ``DATABASES["default"]``, the real PostgreSQL."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import django
import pytest
from celery import Celery, signals
from celery import _state as celery_state
from celery.schedules import crontab
from django.conf import settings as django_settings
from django.utils.functional import empty

from celery_elarion_beat import ClaimingScheduler
from celery_elarion_beat.testing._harness import read_claims
from tests.helpers.fakes import FakeClock

# the Django tests share one worker: Django is set up once per process (the app registry)
pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("django")]

SETTINGS_MODULE = "tests.integration.django_settings"


@pytest.fixture
def django_configured(pg_dsn: str, table_name: str,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Django set up from :mod:`tests.integration.django_settings`; unconfigured after.

    An app made meanwhile reads its settings from Django, and Celery's Django fixup
    connects receivers to Celery's signals. Once Django is unconfigured, such an app
    raises ``ImproperlyConfigured`` when a later test's shared task binds to it (Celery
    5.3.0 keeps every app alive: a class-level observer list) or its fixup answers
    another app's ``import_modules`` (before 5.7, which passes ``sender=app``). So the
    apps made here are forgotten and the signals' receivers put back as they were."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
    monkeypatch.setenv("ELARION_DJANGO_TEST_DSN", pg_dsn)
    monkeypatch.setenv("ELARION_DJANGO_TEST_TABLE", table_name)
    receivers = {signal: list(signal.receivers)
                 for signal in (signals.import_modules, signals.worker_init)}
    apps = set(celery_state._get_active_apps())
    django.setup()
    try:
        yield
    finally:
        django_settings._wrapped = empty  # the next test sees Django unconfigured again
        sys.modules.pop(SETTINGS_MODULE, None)
        for signal, before in receivers.items():
            signal.receivers[:] = before
            signal.sender_receivers_cache.clear()
        for app in set(celery_state._get_active_apps()) - apps:
            celery_state._deregister_app(app)


def test_a_django_project_claims_in_its_default_database(
        django_configured: None, pg_dsn: str, table_name: str) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    app = Celery(f"dj{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(beat_schedule={"report": {"task": "tasks.report",
                                              "schedule": crontab(nowfun=clock)}},
                    result_expires=None, task_default_queue=f"q-{uuid.uuid4().hex[:8]}")
    beat = ClaimingScheduler(app, clock=clock)
    try:
        assert beat.settings.django_database == "default"
        assert beat.settings.table == table_name and beat.settings.node == "django-node"
        assert beat.settings.safe_dsn.startswith("postgresql+psycopg://postgres")
        assert "application_name=elarion-django-test" in beat.settings.safe_dsn
        clock.advance(30.2)  # 03:00:00.2: the slot is due
        beat.tick()
    finally:
        beat.close()
    claims = [c for c in read_claims(pg_dsn, table_name) if c.job == "report"]
    assert [c.node for c in claims] == ["django-node"], claims
    assert claims[0].occurrence == datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
