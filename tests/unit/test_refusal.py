"""Which database errors refuse the node (waiting does not help) and which are outages:
the one classification, :func:`celery_elarion_beat.store.refusal.refusal`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pymysql
import pytest

from celery_elarion_beat import Settings, StoreRefused, StoreUnavailable
from celery_elarion_beat.store.refusal import refusal
from celery_elarion_beat.store.sqlite import SqliteClaimStore

CONNECT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(("error", "fix"), [
    (psycopg.OperationalError(CONNECT + 'FATAL:  password authentication failed for user "b"'),
     "check the user and password in elarion_beat_dsn"),
    (psycopg.OperationalError(CONNECT + 'FATAL:  database "app" does not exist'),
     "create the database"),
    (psycopg.OperationalError(CONNECT + 'FATAL:  role "beat" does not exist'),
     "create the role"),
    (psycopg.OperationalError(CONNECT + 'FATAL:  role "beat" is not permitted to log in'),
     "give the role LOGIN"),
    (psycopg.OperationalError(CONNECT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.9"'),
     "pg_hba.conf"),
    (psycopg.OperationalError(CONNECT + 'FATAL:  pg_hba.conf rejects connection for host "h"'),
     "pg_hba.conf"),
    (psycopg.OperationalError(CONNECT + 'FATAL:  permission denied for database "app"\n'
                              "DETAIL:  User does not have CONNECT privilege."),
     "GRANT CONNECT"),
    (psycopg.errors.InsufficientPrivilege("permission denied for schema public"),
     "grant the role the rights beat needs"),
    (psycopg.errors.InvalidPassword("password authentication failed"), "check the user"),
    (psycopg.errors.InvalidCatalogName("database does not exist"), "create the database"),
    (pymysql.err.OperationalError(1045, "Access denied for user 'b'@'h' (using password: YES)"),
     "check the user and password"),
    (pymysql.err.OperationalError(1049, "Unknown database 'app'"), "create the database"),
    (pymysql.err.OperationalError(1044, "Access denied for user 'b'@'%' to database 'app'"),
     "GRANT the user rights"),
    (pymysql.err.ProgrammingError(1142, "CREATE command denied to user 'b'"),
     "grant the role the rights"),
    (sqlite3.OperationalError("unable to open database file"), "create the directory"),
])
def test_refusals_name_the_fix(error: BaseException, fix: str) -> None:
    found = refusal(error)
    assert found is not None and fix in found, found


@pytest.mark.parametrize("error", [
    psycopg.OperationalError(CONNECT + "Connection refused\n\tIs the server running on that "
                             "host and accepting TCP/IP connections?"),
    psycopg.OperationalError(CONNECT + "timeout expired"),
    psycopg.OperationalError(CONNECT + "FATAL:  sorry, too many clients already"),
    psycopg.OperationalError(CONNECT + "FATAL:  the database system is shutting down"),
    psycopg.OperationalError(CONNECT + 'FATAL:  too many connections for role "beat"'),
    psycopg.OperationalError(CONNECT + "FATAL:  remaining connection slots are reserved for "
                             "roles with the SUPERUSER attribute"),
    psycopg.OperationalError("consuming input failed: server closed the connection "
                             "unexpectedly"),
    psycopg.errors.UndefinedTable('relation "claims" does not exist'),
    psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
    pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '10.0.0.5'"),
    pymysql.err.OperationalError(1040, "Too many connections"),
    sqlite3.OperationalError("database is locked"),
    ValueError("not a driver error"),
])
def test_outages_and_other_errors_are_no_refusal(error: BaseException) -> None:
    assert refusal(error) is None


def test_a_sqlite_file_in_a_missing_directory_is_refused_by_the_store(tmp_path: Path) -> None:
    settings = Settings.from_mapping(
        {"elarion_beat_dsn": f"sqlite:///{tmp_path}/missing-dir/claims.db"})
    store = SqliteClaimStore(settings)
    try:
        with pytest.raises(StoreRefused, match="refused this node .create the directory") as caught:
            store.ensure_schema()
        assert isinstance(caught.value, StoreUnavailable)  # once running: an outage as any
    finally:
        store.close()
