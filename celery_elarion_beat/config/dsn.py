"""DSNs: everything the library knows about a claims database's address, in one table.

Each :class:`Backend` owns its schemes and drivers (how a DSN is normalised)
and the warning beat logs at start when the backend coordinates less than a
cluster. ``normalize_dsn``, ``mask_dsn`` and the store registry
(:mod:`celery_elarion_beat.store.registry`, which maps each backend's name to its
store class) read this table; nothing else looks at a DSN's scheme.

=================  =====================  ====================================
DSN                store                  coordinates
=================  =====================  ====================================
``postgresql://``  ``PostgresClaimStore`` a cluster (production)
``mysql://``       ``MysqlClaimStore``    a cluster (MariaDB, MySQL)
``sqlite:////p``   ``SqliteClaimStore``   the beat processes of one host
``memory://[n]``   ``MemoryClaimStore``   one process (tests, single beat)
=================  =====================  ====================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ..exceptions import ConfigurationError

__all__ = ["BACKENDS", "Backend", "backend_for", "conninfo_url", "is_conninfo", "mask_dsn",
           "normalize_dsn"]

#: libpq's key/value form starts with a keyword and "=" (``host=db user=beat ...``)
_CONNINFO_KEY = re.compile(r"^[a-z_]+\s*=")

_MEMORY = "memory://"


@dataclass(frozen=True)
class Backend:
    """One kind of claims database (its store class: :mod:`celery_elarion_beat.store.registry`)."""

    name: str
    #: URL backend names (before any ``+driver``) that select this backend
    schemes: tuple[str, ...]
    #: the SQLAlchemy driver we use, and the driver names we accept for it
    driver: str
    drivers: tuple[str, ...]
    #: logged at start: what this backend cannot coordinate (None for a cluster)
    scope: str | None = None


BACKENDS: tuple[Backend, ...] = (
    Backend("postgresql", ("postgresql", "postgres"), "psycopg", ("", "psycopg")),
    Backend("mysql", ("mysql", "mariadb"), "pymysql", ("", "pymysql")),
    Backend("sqlite", ("sqlite",), "", ("", "pysqlite"),
            scope="beat: SQLite claims coordinate the beat processes of this host only "
                  "(development and single-host use); use PostgreSQL or MariaDB to run "
                  "beat on several hosts"),
    Backend("memory", ("memory",), "", ("",),
            scope="beat: memory:// claims coordinate this process only; use PostgreSQL "
                  "to run beat on several nodes"),
)

_DRIVER_HINT = {
    "postgresql": "celery-elarion-beat talks to PostgreSQL through psycopg 3: use "
                  "postgresql:// or postgresql+psycopg://",
    "mysql": "use mysql:// (PyMySQL) for MariaDB and MySQL",
    "sqlite": "use sqlite:////path/to/claims.db",
}


def is_conninfo(dsn: str) -> bool:
    """Whether *dsn* is libpq's key/value form (``host=db user=beat dbname=app``)."""
    return "://" not in dsn and _CONNINFO_KEY.match(dsn.strip()) is not None


def conninfo_url(dsn: str) -> str:
    """libpq's key/value form as the ``postgresql+psycopg://`` URL of the same connection.

    ``host``, ``port``, ``user``, ``password`` and ``dbname`` become the URL's parts
    (a socket directory or a list of hosts stays a ``host`` parameter); every other
    keyword (``sslmode``, ``connect_timeout``, ``options``...) becomes a query parameter
    libpq reads back unchanged. libpq's own error text is not shown: it may quote the
    string, password included.
    """
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(dsn.strip()).items()}
    except psycopg.ProgrammingError:
        raise ConfigurationError(
            "elarion_beat_dsn is neither a URL nor a valid libpq key/value string "
            "(host=... user=... password=... dbname=...); check its quoting, or use "
            "postgresql://user:password@host:5432/dbname") from None
    host = params.pop("host", None)
    port = params.pop("port", None)
    if host and ("/" in host or "," in host):
        params["host"] = host
        host = None
    if port and not port.isdigit():
        params["port"] = port
        port = None
    url = URL.create("postgresql+psycopg", username=params.pop("user", None),
                     password=params.pop("password", None), host=host,
                     port=int(port) if port else None, database=params.pop("dbname", None),
                     query=params)
    return url.render_as_string(hide_password=False)


def backend_for(dsn: str) -> Backend:
    """The backend a (normalised or raw) DSN selects, or a ConfigurationError."""
    if dsn.startswith(_MEMORY):
        return BACKENDS[-1]
    if is_conninfo(dsn):
        return BACKENDS[0]
    try:
        url = make_url(dsn.strip())
    except ValueError:  # a port that is not a number (ArgumentError is not a ValueError)
        raise ConfigurationError(
            "elarion_beat_dsn has a port that is not a number; use "
            "postgresql://user:password@host:5432/dbname") from None
    except ArgumentError:
        raise ConfigurationError(
            "elarion_beat_dsn is not a URL; use postgresql://user:password@host:5432/dbname "
            "(a SQLAlchemy URL), libpq's key/value form (host=... user=... dbname=...) "
            "or memory://") from None
    scheme, _, driver = url.drivername.partition("+")
    for backend in BACKENDS:
        if scheme in backend.schemes:
            if driver not in backend.drivers:
                raise ConfigurationError(f"elarion_beat_dsn uses the driver {driver!r}; "
                                         f"{_DRIVER_HINT[backend.name]}")
            return backend
    raise ConfigurationError(
        f"elarion_beat_dsn has the unsupported scheme {url.drivername!r}; use "
        "postgresql://... (production), mysql://... (MariaDB/MySQL), sqlite:////path "
        "(one host) or memory:// (one process)")


def normalize_dsn(dsn: str) -> str:
    """Return *dsn* as the SQLAlchemy URL string of its backend's driver.

    ``memory://`` and ``memory://name`` are returned unchanged; libpq's key/value
    form becomes a PostgreSQL URL (:func:`conninfo_url`).
    """
    dsn = dsn.strip()
    if is_conninfo(dsn):
        dsn = conninfo_url(dsn)
    backend = backend_for(dsn)
    if backend.name == "memory":
        return dsn
    url = make_url(dsn)
    if backend.name == "sqlite" and (not url.database or url.database == ":memory:"):
        raise ConfigurationError(
            "elarion_beat_dsn = sqlite:// needs a file shared by the beat processes: "
            "use sqlite:////path/to/claims.db (memory:// is the in-process store)")
    if backend.driver:
        url = url.set(drivername=f"{backend.schemes[0]}+{backend.driver}")
    return url.render_as_string(hide_password=False)


#: Query parameters whose value is a credential (``?password=``, PyMySQL's ``passwd``,
#: libpq's ``sslpassword``, ``...token``, ``...secret``): masked like the URL password.
_CREDENTIAL_PARAM = re.compile(r"passw(?:or)?d|pwd|secret|token", re.IGNORECASE)


def mask_dsn(dsn: str | None) -> str:
    """Return *dsn* with its password replaced by ``***``, safe to log.

    Both places a driver takes a password from are masked: the URL's own
    (``postgresql://u:***@h/db``) and every credential query parameter
    (``?password=***``, ``?passwd=***``, ``?sslpassword=***``; see
    ``_CREDENTIAL_PARAM``). Other query parameters are kept.
    """
    if not dsn:
        return "(not configured)"
    if dsn.startswith(_MEMORY):
        return dsn
    try:
        url: URL = make_url(dsn)
    except ArgumentError:
        return "(unparsable DSN)"
    query = _masked_query(url.query)
    base = url.set(query={}).render_as_string(hide_password=True)
    return f"{base}?{query}" if query else base


def _masked_query(query: Mapping[str, str | tuple[str, ...]]) -> str:
    """*query* (as SQLAlchemy parsed it) as URL text, credential values as ``***``."""
    parts = []
    for key, value in query.items():
        name = quote(key, safe="/:@,")
        if _CREDENTIAL_PARAM.search(key):
            parts.append(f"{name}=***")  # once, however many values it had
            continue
        for item in (value,) if isinstance(value, str) else value:
            parts.append(f"{name}={quote(item, safe='/:@,')}")
    return "&".join(parts)

