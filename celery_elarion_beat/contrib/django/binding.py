"""How the Django side reaches beat: the Celery app, its settings, and the claims
database as one of Django's ``DATABASES``.

* **The Celery app**: the Django setting ``ELARION_BEAT_CELERY_APP`` (``"proj.celery:app"``)
  when set, else Celery's current app (the one ``proj/__init__.py`` imports in the usual
  Celery-Django layout).
* **The claims database alias**: ``elarion_beat_django_database`` when set (the claims
  DSN is built from that alias), else the alias of ``DATABASES`` whose database is the
  one ``elarion_beat_dsn`` names (:func:`~...config.django_dsn.django_alias_of`).
* **One transaction**: :func:`transaction_connection` is the caller's connection to pass
  to the live-schedules API inside ``transaction.atomic(using=alias)``, so the change
  commits with Django's own writes: the raw psycopg 3 connection of a PostgreSQL alias
  that is the claims database. Elsewhere (MySQL, SQLite, psycopg 2, another database)
  there is none, and the API commits on its own connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.db import connections
from kombu.utils.imports import symbol_by_name

from ...config.django_dsn import django_alias_of, dsn_from_databases, same_database
from ...config.live_entries import live_cluster
from ...config.settings import Settings
from ...exceptions import ConfigurationError
from ...store.interface import ClaimStore
from ...store.registry import app_store

__all__ = ["APP_SETTING", "Beat", "beat", "bind_table", "celery_app", "claims_alias",
           "is_claims_database", "transaction_connection"]

#: The Django setting that names the Celery app (optional).
APP_SETTING = "ELARION_BEAT_CELERY_APP"


def celery_app() -> Any:
    """The Celery app whose schedule the admin edits (see the module docstring)."""
    path = getattr(django_settings, APP_SETTING, None)
    if path:
        try:
            return symbol_by_name(path)  # type: ignore[no-untyped-call]
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigurationError(
                f"{APP_SETTING} = {path!r} cannot be imported ({exc}); name the Celery app "
                "as 'proj.celery:app'") from None
    from celery import current_app

    return current_app._get_current_object()


def claims_alias(settings: Settings) -> str:
    """The alias of Django's ``DATABASES`` that is the claims database."""
    if settings.django_database:
        return settings.django_database
    found = django_alias_of(settings.dsn or "", django_settings.DATABASES)
    if found is None:
        raise ConfigurationError(
            "the claims database (elarion_beat_dsn) is none of Django's DATABASES: the admin "
            "reads the entries table through Django; set elarion_beat_django_database (e.g. "
            "CELERY_ELARION_BEAT_DJANGO_DATABASE = 'default') instead of elarion_beat_dsn, or "
            "add the claims database to DATABASES")
    return found


def is_claims_database(alias: str, settings: Settings) -> bool:
    """Whether Django's database *alias* is the claims database (one transaction can
    hold writes to both)."""
    if settings.django_database == alias:
        return True
    try:
        return same_database(settings.dsn or "",
                             dsn_from_databases(alias, django_settings.DATABASES))
    except ConfigurationError:
        return False


def transaction_connection(alias: str, settings: Settings) -> Any | None:
    """The connection to give the live-schedules API (and ``schedule_once``) inside
    ``transaction.atomic(using=alias)``, so its writes commit with Django's; None when
    Django's connection cannot carry them (see the module docstring)."""
    if not is_claims_database(alias, settings):
        return None
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        return None
    wrapper.ensure_connection()
    raw = wrapper.connection
    try:
        import psycopg
    except ImportError:  # pragma: no cover - a dependency of this package
        return None
    return raw if isinstance(raw, psycopg.Connection) else None


@dataclass(frozen=True)
class Beat:
    """The Celery app, its settings, its cluster, the claims database's alias, and the
    app's store (opened once per app, closed at exit)."""

    app: Any
    settings: Settings
    cluster: str
    alias: str
    store: ClaimStore


def beat() -> Beat:
    """What the admin works with; :class:`ConfigurationError` naming the fix when the
    database entries are off or the claims database is not one of Django's."""
    app = celery_app()
    settings = Settings.from_app(app)
    if not settings.db_entries:
        raise ConfigurationError(
            "database entries are off for the Celery app "
            f"{getattr(app, 'main', None) or '(unnamed)'!r}: set CELERY_ELARION_BEAT_DB_ENTRIES "
            f"= True (elarion_beat_db_entries), or name the app with {APP_SETTING}")
    alias = claims_alias(settings)
    if alias not in django_settings.DATABASES:
        raise ConfigurationError(f"elarion_beat_django_database = {alias!r} is not in Django's "
                                 "DATABASES; name one of its aliases")
    return Beat(app, settings, live_cluster(settings, app), alias, app_store(app))


def bind_table(model: Any, settings: Settings) -> None:
    """Point the unmanaged *model* at the entries table the settings name (quoted as
    ``schema"."table`` when a schema is set, which Django's quoting completes). The table
    is a setting of the Celery app, read when the admin first needs it (a Django model's
    table is fixed when its class is made, before the Celery app may be loaded)."""
    table = settings.entries_table
    if settings.schema:
        table = f'{settings.schema}"."{table}' if connections[
            claims_alias(settings)].vendor != "mysql" else f"{settings.schema}`.`{table}"
    if model._meta.db_table == table:
        return
    model._meta.db_table = table
    for each in model._meta.concrete_fields:  # their columns name the table they were made for
        each.__dict__.pop("cached_col", None)
