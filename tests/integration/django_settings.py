"""The Django settings module of the Django tests (tests/integration/test_django_*.py).

The database comes from ``ELARION_DJANGO_TEST_DSN`` (the test's PostgreSQL; an optional
second alias ``other`` from ``ELARION_DJANGO_TEST_OTHER_DSN``); beat's settings are Django
settings under Celery's ``CELERY_`` namespace. Every Django test of a process shares one
app registry (Django populates it once per process), so the apps are the same for all:
the admin, django-celery-beat and celery-elarion-beat's own app.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url


def _database(dsn: str) -> dict[str, object]:
    url = make_url(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
        "OPTIONS": {"application_name": "elarion-django-test"},
    }


SECRET_KEY = "test-only"
INSTALLED_APPS: list[str] = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_celery_beat",
    "celery_elarion_beat.contrib.django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
ROOT_URLCONF = "tests.integration.django_urls"
USE_TZ = True
ALLOWED_HOSTS = ["testserver", "localhost"]
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": _database(os.environ["ELARION_DJANGO_TEST_DSN"])}
if os.environ.get("ELARION_DJANGO_TEST_OTHER_DSN"):
    DATABASES["other"] = _database(os.environ["ELARION_DJANGO_TEST_OTHER_DSN"])

CELERY_ELARION_BEAT_DJANGO_DATABASE = "default"
CELERY_ELARION_BEAT_TABLE = os.environ["ELARION_DJANGO_TEST_TABLE"]
CELERY_ELARION_BEAT_NODE = "django-node"
# the Celery app the admin edits (the project's Celery module)
ELARION_BEAT_CELERY_APP = "tests.integration.django_celery:app"
