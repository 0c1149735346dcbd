"""Which database errors are refusals: the one place that tells them from outages.

A *refusal* is an error that waiting does not fix: a wrong password, a database or
role that does not exist, a role that may not log in or has no right on the schema
or table, a SQLite file in a directory that does not exist. Everything else
(connection refused, a timeout, too many connections, a server shutting down) is an
outage, which ends by itself.

The store backends translate driver errors with :func:`refusal`: a refusal becomes
:class:`~celery_elarion_beat.exceptions.StoreRefused`, on which beat refuses to start
(``elarion_beat_startup_errors``).

PostgreSQL gives no SQLSTATE for an error at connect time (libpq reports the server's
FATAL message as text), so a connect error is recognized by the server's message
(English, the server's default ``lc_messages``); an error after connect by its SQLSTATE.
"""

from __future__ import annotations

import re

__all__ = ["refusal"]

_CHECK_DSN = "check the user and password in elarion_beat_dsn"
_CREATE_DB = "create the database, or fix its name in elarion_beat_dsn"
_GRANT = ("grant the role the rights beat needs (docs/howto/database-role.md), or run "
          "`celery -A proj elarion-beat init-db` as a role that may create the tables")

#: PostgreSQL SQLSTATE -> what to fix
_PG_SQLSTATES = {
    "28P01": _CHECK_DSN,  # invalid_password
    "28000": _CHECK_DSN,  # invalid_authorization_specification
    "3D000": _CREATE_DB,  # invalid_catalog_name
    "42501": _GRANT,  # insufficient_privilege
}

_PG_HBA = "allow this host in the server's pg_hba.conf, or check elarion_beat_dsn"

#: PostgreSQL's FATAL messages at connect time -> what to fix ("too many connections
#: for role", "the database system is shutting down" and the like are outages)
_PG_MESSAGES = tuple((re.compile(pattern), fix) for pattern, fix in (
    (r"password authentication failed", _CHECK_DSN),
    (r"no pg_hba\.conf entry|pg_hba\.conf rejects connection", _PG_HBA),
    (r'role ".*" is not permitted to log in',
     "give the role LOGIN (ALTER ROLE ... LOGIN), or use another role in elarion_beat_dsn"),
    (r"permission denied for database", "GRANT CONNECT ON DATABASE ... TO the role"),
    (r'database ".*" does not exist', _CREATE_DB),
    (r'role ".*" does not exist', "create the role, or fix the user name in elarion_beat_dsn"),
))

#: MySQL / MariaDB error codes -> what to fix
_MYSQL_CODES = {
    1045: _CHECK_DSN,  # ER_ACCESS_DENIED_ERROR
    1698: _CHECK_DSN,  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR
    1049: _CREATE_DB,  # ER_BAD_DB_ERROR
    1044: "GRANT the user rights on the database",  # ER_DBACCESS_DENIED_ERROR
    1142: _GRANT,  # ER_TABLEACCESS_DENIED_ERROR
    1143: _GRANT,  # ER_COLUMNACCESS_DENIED_ERROR (a column-level UPDATE grant lacks one)
}

#: SQLite's messages -> what to fix
_SQLITE_MESSAGES = (
    ("unable to open database file", "create the directory of the file in elarion_beat_dsn, "
                                     "writable by beat's user"),
    ("attempt to write a readonly database", "make the file in elarion_beat_dsn writable by "
                                             "beat's user"),
)


def refusal(exc: BaseException | None) -> str | None:
    """What to fix when *exc* (a driver error, or SQLAlchemy's wrapper of one) is a
    refusal; None when it is an outage or something else."""
    orig = getattr(exc, "orig", None) or exc
    if orig is None:
        return None
    module = type(orig).__module__.split(".")[0]
    text = str(orig)
    if module == "psycopg":
        sqlstate = getattr(orig, "sqlstate", None)
        if sqlstate:  # an error after connect
            return _PG_SQLSTATES.get(sqlstate)
        if "FATAL:" not in text:  # no answer at all (refused, timed out, cut): an outage
            return None
        return next((fix for pattern, fix in _PG_MESSAGES if pattern.search(text)), None)
    if module == "pymysql":
        args = getattr(orig, "args", ())
        return _MYSQL_CODES.get(args[0]) if args and isinstance(args[0], int) else None
    if module == "sqlite3":
        return next((fix for marker, fix in _SQLITE_MESSAGES if marker in text), None)
    return None
