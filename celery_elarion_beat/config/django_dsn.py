"""The claims DSN of a Django project: ``elarion_beat_django_database``.

With ``elarion_beat_django_database = "default"`` (and no ``elarion_beat_dsn``), the
DSN is built from ``django.conf.settings.DATABASES["default"]``: beat claims in the
project's own database, under the project's own credentials.

:func:`dsn_from_databases` is the pure conversion; :func:`django_dsn` reads Django's
settings. Every error is a :class:`~celery_elarion_beat.exceptions.ConfigurationError` naming the
setting and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ..exceptions import ConfigurationError

__all__ = ["ENGINES", "django_alias_of", "django_dsn", "dsn_from_databases", "same_database"]

_SETTING = "elarion_beat_django_database"

#: Django's database ENGINE -> our DSN scheme
ENGINES = {
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.postgresql_psycopg2": "postgresql",
    "django.contrib.gis.db.backends.postgis": "postgresql",
    "django.db.backends.mysql": "mysql",
    "django.contrib.gis.db.backends.mysql": "mysql",
    "django.db.backends.sqlite3": "sqlite",
    "django.contrib.gis.db.backends.spatialite": "sqlite",
}

#: The libpq connection parameters of Django's PostgreSQL ``OPTIONS`` that the DSN
#: carries (the others, such as ``isolation_level`` or ``pool``, are Django's own).
_PG_OPTIONS = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslpassword", "sslnegotiation",
    "channel_binding", "gssencmode", "krbsrvname", "application_name", "connect_timeout",
    "options", "target_session_attrs", "keepalives", "keepalives_idle",
    "keepalives_interval", "keepalives_count", "service", "passfile",
})


def django_dsn(alias: str) -> str:
    """The DSN of Django's database *alias* (``settings.DATABASES[alias]``)."""
    try:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        raise ConfigurationError(
            f"{_SETTING} = {alias!r} needs Django, which is not installed: install Django, "
            "or set elarion_beat_dsn instead") from None
    try:
        databases = settings.DATABASES
    except ImproperlyConfigured as exc:
        raise ConfigurationError(
            f"{_SETTING} = {alias!r}, but Django's settings are not configured ({exc}); set "
            "DJANGO_SETTINGS_MODULE before the Celery app is configured, or set "
            "elarion_beat_dsn instead") from None
    return dsn_from_databases(alias, databases)


def dsn_from_databases(alias: str, databases: Mapping[str, Mapping[str, Any]]) -> str:
    """The DSN of ``databases[alias]``, a Django ``DATABASES`` setting."""
    db = databases.get(alias)
    if db is None:
        raise ConfigurationError(
            f"{_SETTING} = {alias!r}, but Django's DATABASES has no such alias (it has "
            f"{', '.join(map(repr, sorted(databases))) or 'none'}); name one of them")
    engine = str(db.get("ENGINE") or "")
    scheme = ENGINES.get(engine)
    if scheme is None:
        raise ConfigurationError(
            f"{_SETTING} = {alias!r}: its ENGINE {engine!r} is not supported; the claims "
            f"database is PostgreSQL, MySQL/MariaDB or SQLite ({', '.join(sorted(ENGINES))}): "
            "set elarion_beat_dsn instead")
    name = str(db.get("NAME") or "")
    if scheme == "sqlite":
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ConfigurationError(
                f"{_SETTING} = {alias!r}: its SQLite NAME {name!r} is not a file the beat "
                "processes can share; give it a file path, or set elarion_beat_dsn")
        return "sqlite:///" + os.path.abspath(name)
    options = db.get("OPTIONS") or {}
    query: dict[str, str] = {}
    host = str(db.get("HOST") or "") or None
    if scheme == "postgresql":
        query.update({k: str(v) for k, v in options.items() if k in _PG_OPTIONS})
        if host and host.startswith("/"):  # a Unix socket directory
            query["host"], host = host, None
    else:
        if "charset" in options:
            query["charset"] = str(options["charset"])
        ssl = options.get("ssl")
        if isinstance(ssl, Mapping):
            query.update({f"ssl_{k}": str(v) for k, v in ssl.items()
                          if k in ("ca", "cert", "key")})
    port = str(db.get("PORT") or "")
    if port and not port.isdigit():
        raise ConfigurationError(f"{_SETTING} = {alias!r}: its PORT {port!r} is not a number")
    url = URL.create(scheme, username=str(db.get("USER") or "") or None,
                     password=str(db.get("PASSWORD") or "") or None, host=host,
                     port=int(port) if port else None, database=name or None, query=query)
    return url.render_as_string(hide_password=False)


#: The port a DSN without one connects to, per backend.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def _place(dsn: str) -> tuple[str, str, int | None, str] | None:
    """Where *dsn* connects: (backend, host, port, database), or None when it names no
    server or file (``memory://``, text that is no URL)."""
    try:
        url = make_url(dsn)
    except ArgumentError:
        return None
    backend = url.get_backend_name()
    backend = {"postgres": "postgresql", "mariadb": "mysql"}.get(backend, backend)
    if backend == "sqlite":
        name = url.database or ""
        return (backend, "", None, os.path.abspath(name)) if name and name != ":memory:" \
            else None
    if backend not in _DEFAULT_PORTS:
        return None
    host = url.host or str(url.query.get("host") or "") or "localhost"
    if host in ("127.0.0.1", "::1"):
        host = "localhost"
    return backend, host.lower(), url.port or _DEFAULT_PORTS[backend], url.database or ""


def same_database(dsn: str, other: str) -> bool:
    """Whether two DSNs name the same database (backend, host, port and database name;
    the user and the options may differ): a transaction on one is a transaction on
    the other. ``localhost`` and the loopback addresses count as one host; a host
    named two ways (a name and its address) counts as two (never a false "same")."""
    mine, theirs = _place(dsn), _place(other)
    return mine is not None and mine == theirs


def django_alias_of(dsn: str, databases: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The alias of Django's ``DATABASES`` that names the database of *dsn* (the claims
    database), or None; ``default`` first when several do."""
    for alias in sorted(databases, key=lambda a: (a != "default", a)):
        try:
            if same_database(dsn, dsn_from_databases(alias, databases)):
                return alias
        except ConfigurationError:  # an engine the claims database cannot be
            continue
    return None
