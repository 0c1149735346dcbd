"""The publish half of the contract, on every backend: a won claim is pending until its
publish is reported, an unpublished claim is visible to every node, and exactly one
node takes an orphan over."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from celery_elarion_beat import ClaimRequest
from celery_elarion_beat.store import PublishReport
from tests.contract.conftest import SLOT, slot_request, window_request

HOUR = timedelta(hours=1)
#: The publish timeout of these tests: a claim is an orphan one second after it was made.
TIMEOUT = timedelta(seconds=1)


def _state(store, job: str = "report"):
    (row,) = [r for r in store.find_claims(job=job)]
    return row


def test_a_won_claim_is_pending_until_its_publish_is_reported(make_store) -> None:
    store = make_store()
    (won,) = store.claim("node-a", [slot_request()])
    assert won.won and won.token
    assert _state(store).state == "pending" and _state(store).published_at is None
    store.report([PublishReport("report", SLOT, won.token)])
    row = _state(store)
    assert row.state == "published" and row.published_at is not None
    assert row.publish_error is None and row.takeovers == 0


def test_a_failed_publish_is_recorded_with_its_error(make_store) -> None:
    store = make_store()
    (won,) = store.claim("node-a", [slot_request()])
    store.report([PublishReport("report", SLOT, won.token, error="broker down: ECONNREFUSED")])
    row = _state(store)
    assert row.state == "failed" and row.published_at is None
    assert row.publish_error == "broker down: ECONNREFUSED"
    _, rows = store.unpublished(HOUR)
    assert [(r.job, r.state) for r in rows] == [("report", "failed")]


def test_a_report_under_another_token_changes_nothing(make_store) -> None:
    store = make_store()
    store.claim("node-a", [slot_request()])
    store.report([PublishReport("report", SLOT, "not-the-claims-token")])
    assert _state(store).state == "pending"


def test_every_node_sees_the_unpublished_claims_oldest_first(make_store) -> None:
    a, b = make_store(), make_store()
    first = a.claim("node-a", [slot_request("first")])[0]
    a.claim("node-a", [slot_request("second"), window_request("poll", 60)])
    a.report([PublishReport("first", SLOT, first.token)])
    # the purge election publishes nothing: never pending, never an orphan
    a.claim("node-a", [ClaimRequest.for_window("elarion.purge", timedelta(seconds=60), "p",
                                               tracked=False)])
    now, rows = b.unpublished(HOUR)
    assert {r.job for r in rows} == {"second", "poll"}
    assert all(r.state == "pending" and r.node == "node-a" for r in rows)
    assert [r.claimed_at for r in rows] == sorted(r.claimed_at for r in rows)
    assert all(r.orphaned(now + timedelta(seconds=31), timedelta(seconds=30)) for r in rows)
    assert not any(r.orphaned(now, timedelta(seconds=30)) for r in rows)


def test_a_fresh_claim_is_not_taken_over(make_store) -> None:
    a, b = make_store(), make_store()
    a.claim("node-a", [slot_request()])
    _, rows = b.unpublished(HOUR)
    assert b.take_over("node-b", rows, older_than=HOUR) == []
    assert _state(b).node == "node-a"


def test_an_orphan_is_taken_over_once_with_its_task_id(make_store) -> None:
    a, b = make_store(), make_store()
    a.claim("node-a", [slot_request(task_id="task-of-the-slot")])
    time.sleep(1.1)
    _, rows = b.unpublished(HOUR)
    (taken,) = b.take_over("node-b", rows, older_than=TIMEOUT)
    assert taken.previous == "node-a"
    assert (taken.row.node, taken.row.task_id, taken.row.takeovers, taken.row.state) == (
        "node-b", "task-of-the-slot", 1, "pending")
    # the original winner's late report no longer applies; the taker's does
    b.report([PublishReport("report", SLOT, taken.token)])
    row = _state(b)
    assert (row.state, row.node, row.takeovers) == ("published", "node-b", 1)
    # taking over restarts the clock: the taken-over claim is not an orphan again yet
    assert b.take_over("node-c", rows, older_than=TIMEOUT) == []


def test_sixteen_nodes_taking_one_orphan_over_make_one_taker(make_store) -> None:
    # a takeover is itself an orphan again once it is older_than unpublished: the
    # timeout must outlast sixteen serialized transactions on a loaded machine (with
    # 1 s, SQLite under a busy CI once let a late contender take the fresh takeover;
    # 5 s with four test workers on two cores)
    older_than = timedelta(seconds=5)
    make_store().claim("node-dead", [slot_request()])
    stores = [make_store() for _ in range(16)]
    time.sleep(older_than.total_seconds() + 0.1)
    _, rows = stores[0].unpublished(HOUR)
    barrier = threading.Barrier(16)

    def contender(i: int) -> int:
        barrier.wait()
        return len(stores[i].take_over(f"node-{i}", rows, older_than=older_than))

    with ThreadPoolExecutor(16) as pool:
        taken = list(pool.map(contender, range(16)))
    assert sum(taken) == 1
    assert _state(stores[0]).takeovers == 1


def test_an_orphan_is_marked_reported_by_one_node_once(make_store) -> None:
    """The node that marks an orphan reported reports it: of every node that finds it,
    restarted ones too, exactly one; a takeover makes it a claim of its own again."""
    a, b, c = make_store(), make_store(), make_store()
    _, later = a.claim("node-dead", [slot_request(), slot_request("published")])
    _, rows = b.unpublished(HOUR)
    assert {r.job: r.orphan_reported for r in rows} == {"report": False, "published": False}
    a.report([PublishReport("published", SLOT, later.token)])
    marked = b.mark_orphans_reported(rows)  # what b read: one of them is published now
    assert [(r.job, r.state) for r in marked] == [("report", "pending")]
    assert marked[0].orphan_reported
    assert c.mark_orphans_reported(rows) == []  # another node, or b restarted
    _, again = c.unpublished(HOUR)
    (row,) = again
    assert row.orphan_reported and row.node == "node-dead"
    assert c.mark_orphans_reported(again) == []
    time.sleep(1.1)
    (taken,) = c.take_over("node-c", again, older_than=TIMEOUT)
    assert not taken.row.orphan_reported  # the taker's claim: not reported yet
    _, fresh = a.unpublished(HOUR)
    assert c.mark_orphans_reported(rows) == []  # the row read before the takeover
    assert [r.takeovers for r in a.mark_orphans_reported(fresh)] == [1]
    (published,) = a.find_claims(job="published")
    assert published.orphan_reported_at is None


def test_sixteen_nodes_reporting_one_orphan_make_one_report(make_store) -> None:
    make_store().claim("node-dead", [slot_request()])
    stores = [make_store() for _ in range(16)]
    _, rows = stores[0].unpublished(HOUR)
    barrier = threading.Barrier(16)

    def contender(i: int) -> int:
        barrier.wait()
        return len(stores[i].mark_orphans_reported(rows))

    with ThreadPoolExecutor(16) as pool:
        marked = list(pool.map(contender, range(16)))
    assert sum(marked) == 1


def test_deferred_reports_ride_along_with_the_next_claim(make_store) -> None:
    store = make_store()
    (won,) = store.claim("node-a", [slot_request("first")])
    store.defer_report([PublishReport("first", SLOT, won.token)])
    assert store.deferred_reports == 1 and _state(store, "first").state == "pending"
    before = store.round_trips
    store.claim("node-a", [slot_request("second")])
    cost = store.round_trips - before
    assert store.deferred_reports == 0
    assert _state(store, "first").state == "published"
    # on PostgreSQL the report costs no round trip of its own
    if type(store).__name__ == "PostgresClaimStore":
        assert cost == 1
    (won,) = store.claim("node-a", [slot_request("third")])
    store.defer_report([PublishReport("third", SLOT, won.token, error="gone")])
    assert store.flush_reports() == 1 and store.flush_reports() == 0
    assert _state(store, "third").state == "failed"


def test_the_newest_claims_of_some_jobs(make_store) -> None:
    store = make_store()
    store.claim("node-a", [slot_request("a", SLOT), slot_request("a", SLOT + HOUR),
                           slot_request("b", SLOT), slot_request("c", SLOT)])
    latest = store.latest_claims(["a", "b", "missing"])
    assert sorted(latest) == ["a", "b"]
    assert latest["a"].occurrence == SLOT + HOUR


def test_any_publish_error_text_is_stored(make_store) -> None:
    """An exception's text may hold a NUL or a lone surrogate, which PostgreSQL refuses;
    the report must be written all the same (it rides along with every claim)."""
    store = make_store()
    (won,) = store.claim("node-a", [slot_request()])
    store.defer_report([PublishReport("report", SLOT, won.token, error="bad\x00byte \udcff")])
    (other,) = store.claim("node-a", [slot_request("next")])
    assert other.won and store.deferred_reports == 0
    row = _state(store)
    assert row.state == "failed" and row.publish_error == "badbyte \\udcff"
