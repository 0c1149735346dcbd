"""One-offs on the real MariaDB server: concurrent leases (SELECT ... FOR UPDATE SKIP
LOCKED in one transaction) and a cancel racing a lease."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celery_elarion_beat import Settings
from celery_elarion_beat.store.mysql import MysqlClaimStore
from celery_elarion_beat.testing._harness import claims_tables
from tests.conftest import drop_mysql_tables
from tests.integration.one_off_races import insert_due, race_cancel_and_lease, race_leases

pytestmark = pytest.mark.mysql


@pytest.fixture
def make(mysql_dsn: str) -> Iterator[object]:
    table = f"claims_{uuid.uuid4().hex[:12]}"
    made: list[MysqlClaimStore] = []

    def factory() -> MysqlClaimStore:
        store = MysqlClaimStore(Settings.from_mapping({
            "elarion_beat_dsn": mysql_dsn, "elarion_beat_table": table,
            "elarion_beat_claim_timeout": 3}))
        store.ensure_schema()
        made.append(store)
        return store

    yield factory
    for store in made:
        assert not store.engine.pool.checkedout(), "a connection is still checked out"
        store.close()
    drop_mysql_tables(mysql_dsn, *claims_tables(table))


def test_three_connections_lease_two_thousand_rows_each_once(make) -> None:  # type: ignore[no-untyped-def]
    stores = [make() for _ in range(3)]
    ids = insert_due(stores[0], 2000)
    race = race_leases(stores, batch=200)
    everything = [id_ for ids_ in race.leased for id_ in ids_]
    assert len(everything) == len(set(everything)) == 2000
    assert set(everything) == set(ids)
    print(f"2,000 one-offs leased by 3 MariaDB connections in {race.seconds:.2f}s, "
          f"split {race.split}")


def test_a_cancel_racing_a_lease_has_one_winner(make) -> None:  # type: ignore[no-untyped-def]
    wins = race_cancel_and_lease(make, trials=40)
    assert sum(wins.values()) == 40
    print(f"MariaDB cancel racing lease, 40 trials: {wins}")
