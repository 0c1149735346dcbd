"""The one-offs contract (``schedule_once``'s rows), run against every backend: memory,
PostgreSQL (both claims layouts), SQLite and MariaDB (the real servers)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

from celery_elarion_beat.store.interface import ClaimStore
from celery_elarion_beat.store.one_off_records import NewOneOff, OneOffState

LEASE = timedelta(seconds=60)


def new(store: ClaimStore, due_in: float = -5.0, key: str | None = None,
        task: str = "proj.tasks.remind", at: datetime | None = None) -> NewOneOff:
    due = at if at is not None else store.clock() + timedelta(seconds=due_in)
    return NewOneOff(id=str(uuid.uuid4()), task=task, content_type="application/json",
                     content_encoding="utf-8", body=b'[[1], {"a": "\\u00e9"}]',
                     options={"queue": "q1", "priority": 3}, due=due, key=key)


def test_add_writes_a_scheduled_row_and_reads_it_back(make_store) -> None:
    store = make_store()
    row = store.add_one_off(new(store, due_in=3600, key="k-1"))
    assert row.state is OneOffState.SCHEDULED and row.attempts == 0 and row.node is None
    assert row.key == "k-1" and row.task == "proj.tasks.remind"
    assert dict(row.options) == {"queue": "q1", "priority": 3}
    assert store.one_offs(id_or_key=row.id) == [row]
    assert store.one_offs(id_or_key="k-1") == [row]
    assert row.due.tzinfo is not None


def test_the_same_key_twice_is_one_row(make_store) -> None:
    a, b = make_store(), make_store()
    first = a.add_one_off(new(a, due_in=3600, key="invoice-42"))
    again = b.add_one_off(new(b, due_in=60, key="invoice-42", task="proj.tasks.other"))
    assert again == first
    assert [r.id for r in a.one_offs()] == [first.id]
    # a key is compared byte for byte (MariaDB's collation would merge these)
    other = a.add_one_off(new(a, due_in=3600, key="Invoice-42"))
    assert other.id != first.id


def test_a_delay_counts_from_the_store_clock(make_store) -> None:
    store = make_store()
    before = store.clock()
    one = NewOneOff(id=str(uuid.uuid4()), task="t", content_type="application/json",
                    content_encoding="utf-8", body=b"[[], {}]", options={}, delay=120.0)
    row = store.add_one_off(one)
    assert before + timedelta(seconds=119) <= row.due <= store.clock() + timedelta(seconds=121)


def test_lease_takes_only_due_rows_oldest_first_with_payload(make_store) -> None:
    store = make_store()
    now = store.clock()
    later = store.add_one_off(new(store, at=now - timedelta(seconds=1)))
    older = store.add_one_off(new(store, at=now - timedelta(seconds=30)))
    store.add_one_off(new(store, due_in=3600))
    leased = store.lease_one_offs("node-a", limit=10, lease=LEASE)
    assert [x.id for x in leased] == [older.id, later.id]
    first = leased[0]
    assert first.one_off.state is OneOffState.LEASED and first.one_off.node == "node-a"
    assert first.one_off.attempts == 1 and first.one_off.lease_until is not None
    assert first.body == b'[[1], {"a": "\\u00e9"}]'
    assert (first.content_type, first.content_encoding) == ("application/json", "utf-8")
    assert store.lease_one_offs("node-b", limit=10, lease=LEASE) == []


def test_lease_respects_the_limit(make_store) -> None:
    store = make_store()
    for _ in range(5):
        store.add_one_off(new(store))
    assert len(store.lease_one_offs("node-a", limit=3, lease=LEASE)) == 3
    assert len(store.lease_one_offs("node-b", limit=3, lease=LEASE)) == 2


def test_an_expired_lease_is_taken_over_and_the_stale_node_cannot_finish(make_store) -> None:
    a, b = make_store(), make_store()
    row = a.add_one_off(new(a))
    # a lease of 1 s: long enough that node-b asks within it on a loaded machine
    (first,) = a.lease_one_offs("node-a", limit=10, lease=timedelta(seconds=1))
    assert b.lease_one_offs("node-b", limit=10, lease=LEASE) == []  # lease still held
    time.sleep(1.2)
    (second,) = b.lease_one_offs("node-b", limit=10, lease=LEASE)
    assert second.id == first.id == row.id
    assert second.one_off.attempts == 2 and second.one_off.node == "node-b"
    # node-a wakes up and reports: nothing changes, node-b's outcome stands
    a.finish_one_offs("node-a", published=[row.id], failed={})
    a.finish_one_offs("node-a", published=[], failed={row.id: "late"})
    (now,) = a.one_offs(id_or_key=row.id)
    assert now.state is OneOffState.LEASED and now.node == "node-b"
    b.finish_one_offs("node-b", published=[row.id], failed={})
    (done,) = a.one_offs(id_or_key=row.id)
    assert done.state is OneOffState.PUBLISHED and done.published is not None
    assert done.node == "node-b" and done.attempts == 2


def test_finish_records_published_failed_and_released(make_store) -> None:
    store = make_store()
    ids = [store.add_one_off(new(store)).id for _ in range(3)]
    assert len(store.lease_one_offs("node-a", limit=10, lease=LEASE)) == 3
    store.finish_one_offs("node-a", published=[ids[0]], failed={ids[1]: "task 'x' is not "
                                                                "registered"},
                          released=[ids[2]])
    states = {r.id: r for r in store.one_offs()}
    assert states[ids[0]].state is OneOffState.PUBLISHED
    assert states[ids[1]].state is OneOffState.FAILED
    assert states[ids[1]].error == "task 'x' is not registered"
    assert states[ids[2]].state is OneOffState.SCHEDULED and states[ids[2]].node is None
    # the released one is leased again (next tick), its attempts counting on
    (again,) = store.lease_one_offs("node-b", limit=10, lease=LEASE)
    assert again.id == ids[2] and again.one_off.attempts == 2


def test_cancel_before_the_lease_wins(make_store) -> None:
    store = make_store()
    row = store.add_one_off(new(store, key="cancel-me"))
    cancelled = store.cancel_one_off("cancel-me")
    assert cancelled is not None and cancelled.state is OneOffState.CANCELLED
    assert store.lease_one_offs("node-a", limit=10, lease=LEASE) == []
    assert store.cancel_one_off(row.id).state is OneOffState.CANCELLED  # type: ignore[union-attr]
    assert store.cancel_one_off("no-such-one-off") is None


def test_cancel_after_the_lease_loses(make_store) -> None:
    store = make_store()
    row = store.add_one_off(new(store))
    store.lease_one_offs("node-a", limit=10, lease=LEASE)
    late = store.cancel_one_off(row.id)
    assert late is not None and late.state is OneOffState.LEASED
    store.finish_one_offs("node-a", published=[row.id], failed={})
    assert store.cancel_one_off(row.id).state is OneOffState.PUBLISHED  # type: ignore[union-attr]


def test_next_due_is_the_earliest_scheduled_or_lease_expiry(make_store) -> None:
    store = make_store()
    assert store.next_one_off_due() is None
    now = store.clock()
    far = store.add_one_off(new(store, at=now + timedelta(hours=2)))
    near = store.add_one_off(new(store, at=now + timedelta(hours=1)))
    assert abs((store.next_one_off_due() - near.due).total_seconds()) < 0.001  # type: ignore[operator]
    store.cancel_one_off(near.id)
    assert abs((store.next_one_off_due() - far.due).total_seconds()) < 0.001  # type: ignore[operator]
    store.add_one_off(new(store))
    (leased,) = store.lease_one_offs("node-a", limit=10, lease=timedelta(minutes=5))
    expiry = leased.one_off.lease_until
    assert expiry is not None
    assert abs((store.next_one_off_due() - expiry).total_seconds()) < 0.001  # type: ignore[operator]


def test_list_filters_by_state_and_orders(make_store) -> None:
    store = make_store()
    now = store.clock()
    rows = [store.add_one_off(new(store, at=now + timedelta(minutes=m))) for m in (3, 1, 2)]
    store.cancel_one_off(rows[2].id)
    assert [r.id for r in store.one_offs()] == [rows[0].id, rows[2].id, rows[1].id]
    assert [r.id for r in store.one_offs(order="due")] == [rows[1].id, rows[2].id, rows[0].id]
    assert [r.id for r in store.one_offs(states=[OneOffState.SCHEDULED], order="due")] == [
        rows[1].id, rows[0].id]
    assert [r.id for r in store.one_offs(states=[OneOffState.CANCELLED])] == [rows[2].id]
    assert len(store.one_offs(limit=2)) == 2


def test_purge_counts_with_dry_run_and_goes_a_batch_per_stretch(make_store) -> None:
    """``purge --dry-run`` counts the finished one-offs; ``purge`` on a terminal deletes
    them one batch per stretch (``budget=0``), each stretch resumed with the same
    cutoff, so it can show its progress and stop between batches."""
    store = make_store()
    rows = [store.add_one_off(new(store)) for _ in range(5)]
    store.lease_one_offs("node-a", limit=5, lease=LEASE)
    store.finish_one_offs("node-a", published=[r.id for r in rows], failed={})
    time.sleep(0.05)
    assert store.purge_one_offs(timedelta(milliseconds=10), dry_run=True) == 5
    assert len(store.one_offs()) == 5
    first = store.purge_one_offs_pass(timedelta(milliseconds=10), batch_size=2, budget=0)
    assert (first.deleted, first.total) == (2, 2) or first.done  # the default: in one go
    step = first
    while not step.done:
        step = store.purge_one_offs_pass(timedelta(milliseconds=10), batch_size=2, budget=0,
                                         resume=step)
        assert step.cutoff == first.cutoff and step.deleted <= 2
    assert step.total == 5 and store.one_offs() == []


def test_purge_deletes_only_old_finished_rows(make_store) -> None:
    store = make_store()
    done = [store.add_one_off(new(store)) for _ in range(3)]
    waiting = store.add_one_off(new(store, due_in=3600))
    store.lease_one_offs("node-a", limit=2, lease=LEASE)
    store.finish_one_offs("node-a", published=[done[0].id], failed={done[1].id: "x"})
    store.cancel_one_off(done[2].id)
    assert store.purge_one_offs(timedelta(hours=1)) == 0
    time.sleep(0.05)
    assert store.purge_one_offs(timedelta(milliseconds=10), batch_size=2) == 3
    assert [r.id for r in store.one_offs()] == [waiting.id]
