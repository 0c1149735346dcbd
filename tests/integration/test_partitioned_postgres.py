"""The partitioned claims table on the real PostgreSQL server
(``elarion_beat_claims_layout = "partitioned"``).

* the nodes create the day partitions ahead, at start and from maintenance;
* the purge drops the day partitions past the retention, and only those, keeping
  each job's newest claim (moved to the DEFAULT partition) and the rows inside the
  retention;
* nodes racing to create the same partitions all succeed;
* a claim for a day without a partition lands in DEFAULT and moves into the day's
  partition when it is created;
* a table whose layout is not the setting's is refused, naming the setting.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime, time, timedelta, timezone

import psycopg
import pytest

from celery_elarion_beat import ClaimRequest, ConfigurationError, SchemaMissing, Settings
from celery_elarion_beat.beat.maintenance import Maintenance
from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.observe.outcome import Recorder
from celery_elarion_beat.store.partitions import partition_name
from celery_elarion_beat.store.postgres import PostgresClaimStore

pytestmark = pytest.mark.postgres


def open_pg(pg_dsn: str, table: str, layout: str = "partitioned", node: str = "node-a",
            **extra: object) -> PostgresClaimStore:
    return PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table, "elarion_beat_node": node,
        "elarion_beat_claims_layout": layout, **extra}))


@pytest.fixture
def stores(pg_dsn: str, table_name: str) -> Iterator[list[PostgresClaimStore]]:
    """Stores opened by the test (closed afterwards); the table is the test's own."""
    made: list[PostgresClaimStore] = []
    yield made
    for store in made:
        store.close()


def partitions(pg_dsn: str, table: str) -> dict[str, str]:
    """The partitions attached to *table*: name -> bound."""
    with psycopg.connect(pg_dsn) as conn:
        return dict(conn.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i "
            "JOIN pg_class AS c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            (table,)).fetchall())


def days_of(pg_dsn: str, table: str) -> set[date]:
    prefix = f"{table}_p"
    return {datetime.strptime(name[len(prefix):], "%Y%m%d").date()
            for name in partitions(pg_dsn, table) if name[len(prefix):].isdigit()}


def rows_by_partition(pg_dsn: str, table: str) -> dict[tuple[str, datetime], str]:
    """(job, occurrence) -> the partition holding the row."""
    with psycopg.connect(pg_dsn) as conn:
        return {(job, occ): part for part, job, occ in conn.execute(
            f'SELECT tableoid::regclass::text, job_name, occurrence_utc FROM "{table}"')}


def db_today(pg_dsn: str) -> date:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]


def insert_rows(pg_dsn: str, table: str, rows: list[tuple[str, datetime, datetime]],
                cluster: str = DEFAULT_CLUSTER) -> None:
    """Claims of *cluster* written straight into the table: (job, occurrence, claimed_at)."""
    with psycopg.connect(pg_dsn) as conn:
        for job, occurrence, claimed_at in rows:
            conn.execute(
                f'INSERT INTO "{table}" (cluster, job_name, occurrence_utc, node, task_id, '
                "kind, claimed_at, state) VALUES (%s, %s, %s, 'node-a', %s, 'slot', %s, "
                "'published')", (cluster, job, occurrence, str(uuid.uuid4()), claimed_at))


def midday(day: date) -> datetime:
    return datetime.combine(day, time(12), tzinfo=timezone.utc)


# -- creation ----------------------------------------------------------------------


def test_the_partitions_are_created_ahead_at_start_and_by_maintenance(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore]) -> None:
    before = db_today(pg_dsn)
    store = open_pg(pg_dsn, table_name, elarion_beat_partitions_ahead=2)
    stores.append(store)
    store.ensure_schema()
    after = db_today(pg_dsn)
    assert f"{table_name}_pdefault" in partitions(pg_dsn, table_name)
    # today's partition and the two days after it (midnight may have passed meanwhile)
    assert any(days_of(pg_dsn, table_name) == {d, d + timedelta(days=1), d + timedelta(days=2)}
               for d in {before, after})
    assert "partitioned by day" in store.describe()
    # maintenance: again on the same day costs no round trip; a new day makes its own
    later = datetime.combine(after + timedelta(days=5), time(0, 5), tzinfo=timezone.utc)
    node_clock = [later]
    m = Maintenance(store.settings, store, Recorder(), lambda: node_clock[0], entries=dict)
    m.run()
    want = {after + timedelta(days=n) for n in (5, 6, 7)}
    assert want <= days_of(pg_dsn, table_name)
    trips = store.round_trips
    assert m.partitions() == [] and store.round_trips == trips
    # the partitions are complete tables: the key and the indexes of the plain table
    with psycopg.connect(pg_dsn) as conn:
        indexes = {r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s",
            (partition_name(table_name, after + timedelta(days=5)),))}
    assert len(indexes) == 4 and any("UNIQUE" in i and "job_name, occurrence_utc" in i
                                     for i in indexes)


def together(racers: list[PostgresClaimStore],
             step: Callable[[PostgresClaimStore], object]) -> list[object]:
    """Run *step* on every racer at once (threads released by a barrier); the results,
    or the first error raised."""
    barrier = threading.Barrier(len(racers))
    results: list[object] = []

    def race(store: PostgresClaimStore) -> None:
        barrier.wait()
        try:
            results.append(step(store))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test below
            results.append(exc)

    threads = [threading.Thread(target=race, args=(s,)) for s in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors
    return results


def test_nodes_racing_to_create_the_partitions_all_succeed(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore]) -> None:
    racers = [open_pg(pg_dsn, table_name, node=f"node-{i}") for i in range(6)]
    stores.extend(racers)
    together(racers, lambda store: store.ensure_schema())  # the table, then its partitions
    today = db_today(pg_dsn)
    assert today in days_of(pg_dsn, table_name) or today - timedelta(days=1) in days_of(
        pg_dsn, table_name)
    future = datetime.combine(today + timedelta(days=30), time(), tzinfo=timezone.utc)
    created = together(racers, lambda store: store.ensure_partitions(future))
    # each of the four partitions was created by exactly one of the racers
    names = [name for made in created for name in made]  # type: ignore[attr-defined]
    days = [future.date() + timedelta(days=d) for d in range(4)]
    assert sorted(names) == sorted(partition_name(table_name, day) for day in days)
    assert set(days) <= days_of(pg_dsn, table_name)


def test_a_claim_for_a_day_without_partition_lands_in_default_then_moves(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore]) -> None:
    store = open_pg(pg_dsn, table_name)
    stores.append(store)
    store.ensure_schema()
    day = db_today(pg_dsn) + timedelta(days=20)
    slot = midday(day)
    won = store.claim("node-a", [ClaimRequest.for_slot("report", slot, "task-a")])[0]
    assert won.won
    assert rows_by_partition(pg_dsn, table_name)[("report", slot)] == f"{table_name}_pdefault"
    created = store.ensure_partitions(datetime.combine(day, time(), tzinfo=timezone.utc))
    assert partition_name(table_name, day) in created
    assert rows_by_partition(pg_dsn, table_name) == {
        ("report", slot): partition_name(table_name, day)}
    # still one claim: the slot stays won by its first claimer
    again = store.claim("node-b", [ClaimRequest.for_slot("report", slot, "task-b")])[0]
    assert not again.won and again.winner == "node-a" and again.winner_task_id == "task-a"


def test_new_partitions_are_logged_at_info_without_breaking_the_log_record(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore],
        caplog: pytest.LogCaptureFixture) -> None:
    """With beat's usual ``-l INFO``, creating a day partition logs one line; its
    machine-readable field must not clash with a LogRecord attribute (``created``)."""
    store = open_pg(pg_dsn, table_name)
    stores.append(store)
    store.ensure_schema()
    day = db_today(pg_dsn) + timedelta(days=30)
    with caplog.at_level(logging.INFO, logger="celery_elarion_beat"):
        made = store.ensure_partitions(datetime.combine(day, time(), tzinfo=timezone.utc))
    assert partition_name(table_name, day) in made
    (record,) = [r for r in caplog.records if getattr(r, "action", None) == "partitions"]
    assert record.partitions == made  # type: ignore[attr-defined]


# -- the purge -----------------------------------------------------------------------


def test_the_purge_drops_only_the_partitions_past_the_retention(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore]) -> None:
    store = open_pg(pg_dsn, table_name)
    stores.append(store)
    store.ensure_schema()
    today = db_today(pg_dsn)
    old = [today - timedelta(days=n) for n in (10, 9, 8, 7)]  # d-10 .. d-7
    store.ensure_partitions(datetime.combine(old[0], time(), tzinfo=timezone.utc))
    now = datetime.now(timezone.utc)
    insert_rows(pg_dsn, table_name, [
        # a daily job: a claim on each old day, and today's
        *[("daily", midday(d), midday(d)) for d in old], ("daily", midday(today), now),
        # a claim older than any partition: in DEFAULT, purged row by row
        ("daily", midday(today - timedelta(days=20)), midday(today - timedelta(days=20))),
        # a job that stopped: its newest claim is on d-9, past the retention
        ("stopped", midday(old[0]), midday(old[0])), ("stopped", midday(old[1]), midday(old[1])),
        # a slot of d-10 claimed (taken over) late: claimed inside the retention
        ("late", midday(old[0]), now), ("late", midday(today), now),
    ])
    # the cutoff: one hour into d-8, so d-10 and d-9 lie wholly before it, d-8 does not
    cutoff = datetime.combine(old[2], time(1), tzinfo=timezone.utc)
    retention = datetime.now(timezone.utc) - cutoff
    assert store.purge(retention, dry_run=True) == 4
    assert days_of(pg_dsn, table_name) >= set(old)  # a dry run drops nothing
    assert store.purge(retention) == 4
    left = days_of(pg_dsn, table_name)
    assert old[0] not in left and old[1] not in left
    assert {old[2], old[3], today} <= left
    with psycopg.connect(pg_dsn) as conn:  # dropped, not left detached
        assert conn.execute("SELECT to_regclass(%s)",
                            (partition_name(table_name, old[0]),)).fetchone() == (None,)
    default = f"{table_name}_pdefault"
    assert rows_by_partition(pg_dsn, table_name) == {
        # inside the retention: untouched, in their day partitions
        ("daily", midday(old[2])): partition_name(table_name, old[2]),
        ("daily", midday(old[3])): partition_name(table_name, old[3]),
        ("daily", midday(today)): partition_name(table_name, today),
        ("late", midday(today)): partition_name(table_name, today),
        # kept from the dropped partitions, now in DEFAULT: the stopped job's newest
        # claim, and the claim made inside the retention
        ("stopped", midday(old[1])): default,
        ("late", midday(old[0])): default,
    }
    # the job's newest claim still says where it stands; a second purge finds nothing
    assert store.latest_claims(["stopped"])["stopped"].occurrence == midday(old[1])
    assert store.purge(retention) == 0


def test_the_purge_through_maintenance_drops_partitions_and_logs_them(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore],
        caplog: pytest.LogCaptureFixture) -> None:
    store = open_pg(pg_dsn, table_name, elarion_beat_claim_retention=3 * 86400)
    stores.append(store)
    store.ensure_schema()
    today = db_today(pg_dsn)
    gone = today - timedelta(days=20)
    store.ensure_partitions(datetime.combine(gone, time(), tzinfo=timezone.utc))
    insert_rows(pg_dsn, table_name, [("job", midday(gone), midday(gone)),
                                     ("job", midday(today), midday(today))])
    m = Maintenance(store.settings, store, Recorder(), lambda: datetime.now(timezone.utc),
                    entries=dict)
    caplog.set_level("INFO", logger="celery_elarion_beat")
    assert m.purge() == 1
    assert gone not in days_of(pg_dsn, table_name)
    dropped = [r for r in caplog.records if getattr(r, "action", "") == "purge-partitions"]
    assert dropped and partition_name(table_name, gone) in dropped[0].dropped


# -- layouts -------------------------------------------------------------------------


def test_a_table_of_the_other_layout_is_refused_naming_the_setting(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore]) -> None:
    plain = open_pg(pg_dsn, table_name, layout="plain")
    stores.append(plain)
    plain.ensure_schema()
    for create in (True, False):
        wrong = open_pg(pg_dsn, table_name, elarion_beat_create_table=create)
        stores.append(wrong)
        with pytest.raises(SchemaMissing, match="is a plain table.*elarion_beat_claims_layout"
                                                ".*large-claims-tables"):
            wrong.ensure_schema()
    assert partitions(pg_dsn, table_name) == {}  # nothing was converted or added
    other = f"{table_name}_x"
    try:
        partitioned = open_pg(pg_dsn, other)
        stores.append(partitioned)
        partitioned.ensure_schema()
        wrong = open_pg(pg_dsn, other, layout="plain")
        stores.append(wrong)
        with pytest.raises(SchemaMissing, match="is a partitioned table.*"
                                                "elarion_beat_claims_layout = 'partitioned'"):
            wrong.ensure_schema()
        # a strict store wants the DEFAULT partition made
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f'DROP TABLE "{other}_pdefault"')
        strict = open_pg(pg_dsn, other, elarion_beat_create_table=False)
        stores.append(strict)
        with pytest.raises(SchemaMissing, match="no DEFAULT partition.*PARTITION OF"):
            strict.ensure_schema()
    finally:
        from celery_elarion_beat.testing._harness import claims_tables, drop_tables

        for store in stores:
            store.close()
        stores.clear()
        drop_tables(pg_dsn, *claims_tables(other))


@pytest.mark.parametrize("dsn", ["memory://", "sqlite:////tmp/claims.db",
                                 "mysql://root@127.0.0.1:3306/test"])
def test_the_partitioned_layout_needs_postgresql(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="elarion_beat_claims_layout.*PostgreSQL"):
        Settings.from_mapping({"elarion_beat_dsn": dsn,
                               "elarion_beat_claims_layout": "partitioned"})



def test_the_cli_makes_and_purges_the_partitioned_table(pg_dsn: str, table_name: str) -> None:
    from tests.operate import proj_ops
    from tests.operate.support import invoke

    conf = proj_ops.app.conf
    saved = {k: conf.get(k) for k in ("elarion_beat_dsn", "elarion_beat_table",
                                      "elarion_beat_claims_layout")}
    conf.update(elarion_beat_dsn=pg_dsn, elarion_beat_table=table_name,
                elarion_beat_claims_layout="partitioned")
    try:
        code, out = invoke("init-db")
        assert code == 0 and "partitioned by day" in out, out
        today = db_today(pg_dsn)
        gone = today - timedelta(days=30)
        store = open_pg(pg_dsn, table_name)
        try:
            store.ensure_partitions(datetime.combine(gone, time(), tzinfo=timezone.utc))
        finally:
            store.close()
        insert_rows(pg_dsn, table_name, [("job", midday(gone), midday(gone)),
                                         ("job", midday(today), midday(today))])
        code, out = invoke("purge", "--dry-run", "--older-than", "7d")
        assert (code, out.split(" claims")[0]) == (0, "would delete 1"), out
        assert gone in days_of(pg_dsn, table_name)
        code, out = invoke("purge", "--older-than", "7d")
        assert (code, out.split(" claims")[0]) == (0, "deleted 1"), out
        assert gone not in days_of(pg_dsn, table_name)
    finally:
        conf.update(saved)
