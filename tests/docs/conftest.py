"""Fixtures of the docs tests: a scratch schema (PostgreSQL) or database (MariaDB) for
the least-privilege roles, dropped with the roles afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from tests.docs.test_database_role import operator_role, worker_role


@pytest.fixture
def pg_scratch(pg_dsn: str) -> Iterator[tuple[Engine, str, str]]:
    tag = uuid.uuid4().hex[:10]
    schema, role = f"priv_{tag}", f"elarion_beat_{tag}"
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield admin, schema, role
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            for name in (role, worker_role(role), operator_role(role)):
                exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"),
                                      {"r": name}).scalar()
                if exists:
                    conn.execute(text(f'DROP OWNED BY "{name}"'))
                    conn.execute(text(f'DROP ROLE "{name}"'))
        admin.dispose()


@pytest.fixture
def mysql_scratch(mysql_dsn: str) -> Iterator[tuple[Engine, str, str]]:
    tag = uuid.uuid4().hex[:10]
    database, user = f"priv_{tag}", f"elarion_beat_{tag}"
    server = make_url(mysql_dsn).set(drivername="mysql+pymysql")
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4"))
    try:
        yield create_engine(server.set(database=database), isolation_level="AUTOCOMMIT"), \
            database, user
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE `{database}`"))
            for name in (user, worker_role(user), operator_role(user)):
                conn.execute(text(f"DROP USER IF EXISTS '{name}'@'%'"))
        admin.dispose()
