"""The Django settings module of tests/integration/test_django_postgres.py.

The database comes from ``ELARION_DJANGO_TEST_DSN`` (the test's PostgreSQL); beat's
settings are Django settings under Celery's ``CELERY_`` namespace.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

_url = make_url(os.environ["ELARION_DJANGO_TEST_DSN"])

SECRET_KEY = "test-only"
INSTALLED_APPS: list[str] = []
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.database,
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.host or "",
        "PORT": str(_url.port or ""),
        "OPTIONS": {"application_name": "elarion-django-test"},
    },
}

CELERY_ELARION_BEAT_DJANGO_DATABASE = "default"
CELERY_ELARION_BEAT_TABLE = os.environ["ELARION_DJANGO_TEST_TABLE"]
CELERY_ELARION_BEAT_NODE = "django-node"
