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
from celery import Celery
from celery.schedules import crontab
from django.conf import settings as django_settings
from django.utils.functional import empty

from celery_elarion_beat import ClaimingScheduler
from celery_elarion_beat.testing import read_claims
from tests.helpers.fakes import FakeClock

pytestmark = [pytest.mark.postgres]

SETTINGS_MODULE = "tests.integration.django_settings"


@pytest.fixture
def django_configured(pg_dsn: str, table_name: str,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Django set up from :mod:`tests.integration.django_settings`; unconfigured after."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
    monkeypatch.setenv("ELARION_DJANGO_TEST_DSN", pg_dsn)
    monkeypatch.setenv("ELARION_DJANGO_TEST_TABLE", table_name)
    django.setup()
    try:
        yield
    finally:
        django_settings._wrapped = empty  # the next test sees Django unconfigured again
        sys.modules.pop(SETTINGS_MODULE, None)


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
