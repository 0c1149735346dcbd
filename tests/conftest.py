"""Shared fixtures: real service addresses, unique table names, stores.

Services are never skipped: a test that needs PostgreSQL or a broker fails
with a message naming the environment variable when the service is missing.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from urllib.parse import urlparse

import celery._state
import psycopg
import pytest

from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.one_offs.api import close_stores
from celery_elarion_beat.testing._harness import claims_tables, drop_tables

# xdist_group that groups on pytest 9 too (tests/helpers/groups.py); the lanes of
# the xdist workers: which tests may run at once (tests/helpers/lanes.py)
from tests.helpers.groups import pytest_collection_modifyitems  # noqa: F401
from tests.helpers.lanes import pytest_configure_node, pytest_runtest_protocol  # noqa: F401

#: One cluster for the whole run (``elarion_beat_cluster``): the stores a test opens
#: with ``Settings.from_mapping`` (whose cluster is DEFAULT_CLUSTER) read what the
#: test's beats, workers and CLI processes wrote, whatever their apps' main names. The
#: harness passes it on to child processes (``clean_env``); a test of the cluster
#: itself sets it (an empty value: derived from the app's main name) or drops it.
os.environ.setdefault("ELARION_BEAT_CLUSTER", DEFAULT_CLUSTER)

#: DJANGO_SETTINGS_MODULE as the run found it: Celery installs its Django fixup in
#: every app made while the variable is set, and every beat and worker the tests start
#: inherits it, so a test module that sets it at import breaks tests far from Django.
_DJANGO_SETTINGS_AT_START = os.environ.get("DJANGO_SETTINGS_MODULE")


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("DJANGO_SETTINGS_MODULE") != _DJANGO_SETTINGS_AT_START:
        raise pytest.UsageError(
            "a test module set DJANGO_SETTINGS_MODULE while it was collected; import the "
            "Django test project inside a fixture (tests/integration/django_project.py)")


PG_DSN = os.environ.get("ELARION_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ELARION_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("ELARION_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
MYSQL_DSN = os.environ.get("ELARION_TEST_MYSQL_DSN", "mysql://root@127.0.0.1:3306/test")


def require_tcp(url: str, variable: str) -> None:
    """Fail (never skip) when the service behind *url* does not accept connections."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        pytest.fail(f"service at {host}:{port} is not reachable ({exc}); start it or point "
                    f"{variable} at one", pytrace=False)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    require_tcp(PG_DSN, "ELARION_TEST_PG_DSN")
    with psycopg.connect(PG_DSN, connect_timeout=5) as conn:
        conn.execute("SELECT 1")
    return PG_DSN


@pytest.fixture(scope="session")
def mysql_dsn() -> str:
    require_tcp(MYSQL_DSN, "ELARION_TEST_MYSQL_DSN")
    return MYSQL_DSN


#: the contract suites import it under this name; it drops tables on any backend
drop_mysql_tables = drop_tables


@pytest.fixture(scope="session")
def redis_url() -> str:
    require_tcp(REDIS_URL, "ELARION_TEST_REDIS_URL")
    return REDIS_URL


@pytest.fixture(scope="session")
def amqp_url() -> str:
    require_tcp(AMQP_URL, "ELARION_TEST_AMQP_URL")
    return AMQP_URL


@pytest.fixture
def table_name(pg_dsn: str) -> Iterator[str]:
    """A claims table name owned by this test; dropped afterwards."""
    name = f"claims_{uuid.uuid4().hex[:12]}"
    yield name
    drop_tables(pg_dsn, *claims_tables(name))


@pytest.fixture(autouse=True)
def _close_one_off_stores() -> Iterator[None]:
    """``schedule_once`` and friends keep a store per app open until exit: close them
    after each test, so their connection pools do not pile up on the server."""
    yield
    close_stores()


@pytest.fixture(autouse=True)
def _keep_celery_current_app() -> Iterator[None]:
    """A test that imports a project module (``Celery("proj")`` is set as current) must
    not change the app that later tests' schedules read their time zone from, nor leave
    the root logger's level where an in-process worker put it."""
    current = getattr(celery._state._tls, "current_app", None)
    default = celery._state.default_app
    level = logging.root.level  # an in-process Celery worker sets the root logger's level
    yield
    celery._state._set_current_app(current)
    celery._state.set_default_app(default)
    logging.root.setLevel(level)
