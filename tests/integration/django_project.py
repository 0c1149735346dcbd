"""The Django test project of tests/integration/test_django_*.py: a PostgreSQL database
of its own (made once per process, dropped at the end: django-celery-beat's and Django's
tables have fixed names, and other runs share the server), Django set up against it and
migrated, and the Celery app (tests/integration/django_celery.py) pointed at a claims
table of the test's own. A second database, alias ``other``, holds django-celery-beat's
tables for the import from a database that is not the claims database."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celery._state
import django
import psycopg
import pytest
from asgiref.local import Local
from django.conf import settings as django_settings
from django.utils.functional import empty
from sqlalchemy.engine import make_url

from celery_elarion_beat.one_offs.api import close_stores
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.testing._harness import claims_tables, drop_tables
from tests.operate.support import settings_for

SETTINGS_MODULE = "tests.integration.django_settings"
_ENV = ("DJANGO_SETTINGS_MODULE", "ELARION_DJANGO_TEST_DSN", "ELARION_DJANGO_TEST_TABLE",
        "ELARION_DJANGO_TEST_OTHER_DSN")


@dataclass
class Project:
    """The test project: its databases, and the claims table of the test."""

    dsn: str
    other_dsn: str
    table: str = ""
    store: Any = None

    @property
    def app(self) -> Any:
        from tests.integration import django_celery  # sets DJANGO_SETTINGS_MODULE

        return django_celery.app


def _dsn_of(base: str, name: str) -> str:
    return make_url(base).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def django_databases(pg_dsn: str) -> Iterator[tuple[str, str]]:
    names = [f"elarion_dj_{uuid.uuid4().hex[:10]}", f"elarion_djo_{uuid.uuid4().hex[:10]}"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _dsn_of(pg_dsn, names[0]), _dsn_of(pg_dsn, names[1])
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _reset_django() -> None:
    """Django unconfigured, its connections closed and forgotten (the next setup reads
    DATABASES again); the app registry stays (it is the same for every Django test)."""
    from django.db import connections

    connections.close_all()
    connections.__dict__.pop("settings", None)
    connections._settings = None
    connections._connections = Local(connections.thread_critical)
    django_settings._wrapped = empty
    sys.modules.pop(SETTINGS_MODULE, None)


@pytest.fixture(scope="module")
def django_setup(django_databases: tuple[str, str]) -> Iterator[Project]:
    """Django set up against the test project's databases, migrated."""
    dsn, other = django_databases
    saved = {key: os.environ.get(key) for key in _ENV}
    os.environ.update({"DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
                       "ELARION_DJANGO_TEST_DSN": dsn, "ELARION_DJANGO_TEST_OTHER_DSN": other,
                       "ELARION_DJANGO_TEST_TABLE": "claims_unused"})
    try:  # a failing setup gives the variables back too (later tests start processes)
        _reset_django()
        django.setup()
        from django.core.management import call_command

        for alias in ("default", "other"):
            call_command("migrate", database=alias, verbosity=0, interactive=False)
        yield Project(dsn, other)
    finally:
        _reset_django()
        # the project's Celery app reads its configuration from Django's settings, gone
        # now: out of Celery's apps, or the next shared task (celery.contrib.testing's
        # ping, made by every test app) is bound to it and asks Django for its settings
        project_celery = sys.modules.get("tests.integration.django_celery")
        if project_celery is not None:
            celery._state._deregister_app(project_celery.app)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def django_project(django_setup: Project,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """The project with a claims table (and entries tables) of this test, and no
    django-celery-beat rows."""
    from django_celery_beat import models

    table = f"claims_{uuid.uuid4().hex[:12]}"
    monkeypatch.setitem(django_setup.app.conf, "elarion_beat_table", table)
    for alias in ("default", "other"):
        models.PeriodicTask.objects.using(alias).all().delete()
        for model in (models.CrontabSchedule, models.IntervalSchedule, models.SolarSchedule,
                      models.ClockedSchedule, models.PeriodicTasks):
            model.objects.using(alias).all().delete()
    store = PostgresClaimStore(settings_for(django_setup.dsn, table,
                                            elarion_beat_db_entries=True))
    store.ensure_schema()
    store.ensure_entries_schema()
    project = Project(django_setup.dsn, django_setup.other_dsn, table, store)
    try:
        yield project
    finally:
        store.close()
        close_stores()
        drop_tables(django_setup.dsn, *claims_tables(table))
