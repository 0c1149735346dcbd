"""The foreign beats half of the contract, on every backend: the workers' sightings of a
beat that claims nothing add up per sender and task, whoever records them and however
many record at once; ``foreign_beats(within)`` answers from any store of the namespace;
old rows go with the retention; a missing table (DDL off) names its fix."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from celery_elarion_beat import SchemaMissing, Settings, open_store
from celery_elarion_beat.store.foreign_records import ForeignSighting, foreign_senders
from celery_elarion_beat.testing._harness import drop_tables

ORIGIN = "gen4242@web-3"
TASK = "proj.tasks.report"


def test_sightings_add_up_per_sender_and_task(make_store) -> None:
    worker_a, worker_b, reader = make_store(), make_store(), make_store()
    assert reader.foreign_beats()[1] == []
    worker_a.record_foreign_beats([ForeignSighting(ORIGIN, TASK, 2, "nightly", "w1@a")])
    worker_b.record_foreign_beats([ForeignSighting(ORIGIN, TASK, 3, "nightly", "w2@b"),
                                   ForeignSighting(ORIGIN, "proj.tasks.poll", 1, None, "w2@b"),
                                   ForeignSighting("gen7@old-1", TASK, 1, "nightly", "w2@b")])
    now, rows = reader.foreign_beats()
    by_key = {(r.origin, r.task): r for r in rows}
    assert set(by_key) == {(ORIGIN, TASK), (ORIGIN, "proj.tasks.poll"), ("gen7@old-1", TASK)}
    report = by_key[(ORIGIN, TASK)]
    assert (report.count, report.entry, report.worker, report.host) == (5, "nightly", "w2@b",
                                                                         "web-3")
    assert report.first_seen <= report.last_seen <= now + timedelta(seconds=1)
    assert by_key[(ORIGIN, "proj.tasks.poll")].entry is None
    # newest first, and grouped by sender for status
    assert [r.last_seen for r in rows] == sorted((r.last_seen for r in rows), reverse=True)
    senders = {s.origin: s for s in foreign_senders(rows)}
    assert senders[ORIGIN].count == 6 and senders[ORIGIN].host == "web-3"
    assert [t.task for t in senders["gen7@old-1"].tasks] == [TASK]


def test_first_seen_stays_and_last_seen_moves(make_store) -> None:
    store = make_store()
    store.record_foreign_beats([ForeignSighting(ORIGIN, TASK, 1, None, "w1")])
    (first,) = store.foreign_beats()[1]
    time.sleep(0.05)
    store.record_foreign_beats([ForeignSighting(ORIGIN, TASK, 1, "nightly", "w2")])
    (later,) = store.foreign_beats()[1]
    assert later.first_seen == first.first_seen and later.last_seen > first.last_seen
    assert (later.count, later.entry, later.worker) == (2, "nightly", "w2")


def test_within_and_retention(make_store) -> None:
    store = make_store()
    store.record_foreign_beats([ForeignSighting("gen1@old", TASK, 1)])
    time.sleep(0.3)
    store.record_foreign_beats([ForeignSighting("gen2@new", TASK, 1)])
    assert [r.origin for r in store.foreign_beats(within=timedelta(seconds=0.2))[1]] == [
        "gen2@new"]
    assert {r.origin for r in store.foreign_beats()[1]} == {"gen1@old", "gen2@new"}
    # a record call deletes the rows not seen for the retention (nothing to add is fine)
    store.record_foreign_beats([], retention=timedelta(seconds=0.2))
    assert [r.origin for r in store.foreign_beats()[1]] == ["gen2@new"]


def test_workers_recording_at_once_lose_no_count(make_store) -> None:
    stores = [make_store() for _ in range(4)]

    def record(i: int) -> None:
        for _ in range(5):
            stores[i].record_foreign_beats([ForeignSighting(ORIGIN, TASK, 1, None, f"w{i}")])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(record, range(4)))
    (row,) = stores[0].foreign_beats()[1]
    assert row.count == 20


@pytest.mark.postgres
def test_a_missing_table_names_its_fix(pg_dsn: str, table_name: str) -> None:
    """DDL off and a schema made before this table: the call says how to make it."""
    settings = Settings.from_mapping({"elarion_beat_dsn": pg_dsn,
                                      "elarion_beat_table": table_name})
    owner = open_store(settings)
    try:
        owner.ensure_schema()
        drop_tables(pg_dsn, settings.foreign_beats_table)
    finally:
        owner.close()
    store = open_store(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
        "elarion_beat_create_table": False}))
    try:
        with pytest.raises(SchemaMissing, match="foreign_beats_table\\(metadata\\)"):
            store.foreign_beats()
        with pytest.raises(SchemaMissing, match="elarion-beat init-db"):
            store.record_foreign_beats([ForeignSighting(ORIGIN, TASK, 1)])
    finally:
        store.close()
