"""A claim never holds beat longer than ``elarion_beat_claim_timeout`` plus a margin
(real PostgreSQL; the real-process form is tests/fault/test_database_faults.py).

* Under a lock held on the claims table the server cancels the claim at the timeout.
  ``QueryCanceled`` is an ``OperationalError``, which the store's stale-connection
  retry used to take for a dead connection: the claim waited the timeout twice.
* Through a proxy that stops passing bytes (a hung middlebox) the server never sees
  the statement, so no server timeout fires: the claim waited as long as the proxy
  hung. The store's watchdog now cuts the connection 0.5 s after the timeout.

Each test states the bound it checks, with a margin for a loaded machine that stays
below what the bug took (two timeouts; the whole hang).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

import psycopg
import pytest

from celery_elarion_beat import ClaimRequest, Settings, StoreError
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.postgres

TIMEOUT = 3.0
#: the bug took 2 x TIMEOUT (lock) or the whole HANG (proxy); the margin covers a
#: loaded machine (four test workers on two cores) and stays under one TIMEOUT, so
#: the bug still fails the bound
MARGIN = 2.0
HANG = 12.0


def _store(dsn: str, table: str) -> PostgresClaimStore:
    return PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": dsn, "elarion_beat_table": table,
        "elarion_beat_claim_timeout": TIMEOUT}))


def _request() -> ClaimRequest:
    slot = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=30)
    return ClaimRequest.for_slot("timeout-job", slot, "tid-timeout")


@pytest.fixture
def store(pg_dsn: str, table_name: str) -> Iterator[PostgresClaimStore]:
    store = _store(pg_dsn, table_name)
    store.ensure_schema()
    store.claim("warm", [ClaimRequest.for_slot(
        "warm-job", datetime(2026, 1, 1, tzinfo=timezone.utc), "tid-warm")])
    yield store
    store.close()


def _timed_claim(store: PostgresClaimStore) -> tuple[float, BaseException | None]:
    start = time.monotonic()
    try:
        store.claim("node-a", [_request()])
    except StoreError as exc:
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


def test_a_claim_under_a_table_lock_waits_one_timeout_not_two(
        store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    with psycopg.connect(pg_dsn.replace("postgresql+psycopg://", "postgresql://")) as locker:
        locker.execute(f'LOCK TABLE "{table_name}" IN ACCESS EXCLUSIVE MODE')
        took, error = _timed_claim(store)
        locker.rollback()
    assert error is not None, "the claim went through a table locked by another session"
    assert "timeout" in str(error).lower() or "cancel" in str(error).lower(), error
    assert took <= TIMEOUT + MARGIN, (
        f"a claim under a lock took {took:.2f}s; elarion_beat_claim_timeout is {TIMEOUT}s")


def test_a_claim_through_a_hung_path_is_cut_after_the_timeout(
        pg_dsn: str, table_name: str) -> None:
    target = urlparse(pg_dsn)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    dsn = pg_dsn.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}")
    store = _store(dsn, table_name)
    release = threading.Timer(HANG, proxy.unpause)
    try:
        store.ensure_schema()
        store.claim("warm", [ClaimRequest.for_slot(
            "warm-job", datetime(2026, 1, 1, tzinfo=timezone.utc), "tid-warm")])
        proxy.pause()
        release.start()
        took, error = _timed_claim(store)
        assert error is not None, "a claim through a hung proxy succeeded"
        assert took <= TIMEOUT + 0.5 + MARGIN, (
            f"a claim through a hung path held beat for {took:.2f}s; "
            f"elarion_beat_claim_timeout is {TIMEOUT}s")
        proxy.unpause()
        assert store.claim("node-a", [_request()])[0].won, "no claim after the path came back"
    finally:
        release.cancel()
        proxy.unpause()
        store.close()
        proxy.stop()
