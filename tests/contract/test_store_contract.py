"""The claim-store contract, run against every backend: memory, PostgreSQL, SQLite and
MariaDB (the real servers)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from celery_elarion_beat import ClaimRequest
from tests.contract.conftest import SLOT, slot_request, window_request


def test_a_slot_can_be_won_once(make_store) -> None:
    a, b = make_store(), make_store()
    first = a.claim("node-a", [slot_request()])[0]
    second = b.claim("node-b", [slot_request()])[0]
    assert first.won and not second.won
    assert first.occurrence == SLOT == second.occurrence


def test_the_loser_learns_the_winner(make_store) -> None:
    a, b = make_store(), make_store()
    won = a.claim("node-a", [slot_request(task_id="task-of-a")])[0]
    lost = b.claim("node-b", [slot_request(task_id="task-of-b")])[0]
    assert (won.winner, won.winner_task_id) == ("node-a", "task-of-a")
    assert (lost.winner, lost.winner_task_id) == ("node-a", "task-of-a")


def test_different_slots_and_jobs_do_not_conflict(make_store) -> None:
    store = make_store()
    results = store.claim("node-a", [
        slot_request("report", SLOT), slot_request("report", SLOT + timedelta(minutes=1)),
        slot_request("digest", SLOT),
    ])
    assert [r.won for r in results] == [True, True, True]


def test_two_processes_with_one_node_name_do_not_both_win(make_store) -> None:
    """Exact-slot task ids are deterministic, so a second beat started under the same
    node name asks with the same node and task id: it must still lose."""
    first, second = make_store(), make_store()
    request = slot_request(task_id="same-task-id")
    assert first.claim("node-a", [request])[0].won
    again = second.claim("node-a", [slot_request(task_id="same-task-id")])[0]
    assert not again.won and again.winner == "node-a"
    window = ClaimRequest.for_window("poll", timedelta(seconds=30), "same-window-task")
    assert first.claim("node-a", [window])[0].won
    assert not second.claim("node-a", [window])[0].won


def test_results_come_back_in_request_order(make_store) -> None:
    store = make_store()
    store.claim("node-b", [slot_request("b")])
    requests = [slot_request("c"), slot_request("b"), slot_request("a")]
    results = store.claim("node-a", requests)
    assert [r.request for r in results] == requests
    assert [r.won for r in results] == [True, False, True]


def test_window_is_held_for_its_length_then_free(make_store) -> None:
    a, b = make_store(), make_store()
    # a window of 2 s: the second claim lands inside it even on a loaded machine
    first = a.claim("node-a", [window_request(seconds=2.0)])[0]
    assert first.won and first.winner == "node-a"
    again = b.claim("node-b", [window_request(seconds=2.0)])[0]
    assert not again.won
    assert again.winner == "node-a" and again.occurrence == first.occurrence
    time.sleep(2.1)
    later = b.claim("node-b", [window_request(seconds=2.0)])[0]
    assert later.won and later.winner == "node-b"
    assert later.occurrence - first.occurrence >= timedelta(seconds=2)


def test_windows_of_different_jobs_are_independent(make_store) -> None:
    store = make_store()
    results = store.claim("node-a", [window_request("poll"), window_request("sync")])
    assert [r.won for r in results] == [True, True]


def test_a_window_sees_exact_slot_claims_of_the_same_job(make_store) -> None:
    """A job whose schedule changed kind (rolling deploy) is still not run twice."""
    store = make_store()
    now = datetime.now(timezone.utc)
    store.claim("node-a", [slot_request("report", now)])
    assert not store.claim("node-b", [window_request("report", seconds=60)])[0].won


def test_purge_deletes_old_claims_only(make_store) -> None:
    store = make_store()
    earlier = SLOT - timedelta(hours=1)
    store.claim("node-a", [slot_request("old", earlier), slot_request("old")])
    time.sleep(0.3)
    store.claim("node-a", [slot_request("new")])
    assert store.purge(timedelta(seconds=0.2)) == 1
    # the purged slot can be claimed again; the recent one and the job's newest cannot
    assert store.claim("node-b", [slot_request("old", earlier)])[0].won
    assert not store.claim("node-b", [slot_request("old")])[0].won
    assert not store.claim("node-b", [slot_request("new")])[0].won


def test_purge_keeps_every_jobs_newest_claim_whatever_its_age(make_store) -> None:
    store = make_store()
    store.claim("node-a", [slot_request("monthly"), slot_request("daily", SLOT),
                           slot_request("daily", SLOT + timedelta(days=1))])
    time.sleep(0.3)
    assert store.purge(timedelta(seconds=0.2), dry_run=True) == 1
    assert store.purge(timedelta(seconds=0.2)) == 1
    assert sorted((r.job, r.occurrence) for r in store.find_claims()) == [
        ("daily", SLOT + timedelta(days=1)), ("monthly", SLOT)]


def test_job_names_compare_byte_for_byte(make_store) -> None:
    """Case, accents, trailing spaces and the 191st character all make another job
    (MariaDB's default collation merged them, and beat died with a KeyError)."""
    names = ["report", "Report", "cafe", "caf\u00e9", "x", "x ", "a" * 190 + "b", "a" * 190 + "c",
             "\U0001f600" * 191]
    a, b = make_store(), make_store()
    won = a.claim("node-a", [slot_request(name) for name in names])
    assert [r.won for r in won] == [True] * len(names)
    lost = b.claim("node-b", [slot_request(name) for name in names])
    assert [r.won for r in lost] == [False] * len(names)
    assert sorted(a.latest_claims()) == sorted(names)


def _race(make_store, requests_for, n: int = 16) -> list:
    stores = [make_store() for _ in range(n)]
    barrier = threading.Barrier(n)

    def contender(i: int):
        barrier.wait()
        return stores[i].claim(f"node-{i}", [requests_for(i)])[0]

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(contender, range(n)))


def test_sixteen_racers_on_one_slot_make_one_winner(make_store) -> None:
    results = _race(make_store, lambda i: slot_request(task_id=f"task-{i}"))
    winners = [r for r in results if r.won]
    assert len(winners) == 1
    winner = winners[0].winner
    assert all(r.winner == winner for r in results)


def test_sixteen_racers_on_one_window_make_one_winner(make_store) -> None:
    results = _race(make_store, lambda i: window_request(seconds=30))
    assert sum(r.won for r in results) == 1
    winner = next(r.winner for r in results if r.won)
    assert all(r.winner == winner for r in results if not r.won)


#: Network round trips a batch of exact slots may cost, whatever its size: PostgreSQL
#: pipelines everything into one; MariaDB needs a clock read, one multi-row INSERT
#: IGNORE, one read of the holders and the commit; SQLite is one in-process
#: transaction; memory makes none.
MAX_ROUND_TRIPS = {"memory": 0, "postgres": 1, "postgres-partitioned": 1, "sqlite": 1,
                   "mysql": 4}


def test_a_batch_of_a_thousand_is_claimed_at_once(make_store, request) -> None:
    store = make_store()
    before = store.round_trips
    requests = [slot_request(f"job-{i}") for i in range(1000)]
    results = store.claim("node-a", requests)
    assert sum(r.won for r in results) == 1000
    backend = request.node.callspec.params["make_store"]
    assert store.round_trips - before <= MAX_ROUND_TRIPS[backend]
    # and a second node racing the same batch wins none of it
    other = make_store()
    assert not any(r.won for r in other.claim("node-b", [slot_request(f"job-{i}")
                                                         for i in range(1000)]))


def test_purge_goes_in_batches(make_store) -> None:
    store = make_store()
    store.claim("node-a", [slot_request(f"old-{i}", slot) for i in range(25)
                           for slot in (SLOT - timedelta(hours=1), SLOT)])
    time.sleep(0.3)
    assert store.purge(timedelta(seconds=0.2), dry_run=True) == 25
    assert store.purge(timedelta(seconds=0.2), batch_size=10) == 25
    assert {r.occurrence for r in store.find_claims(limit=100)} == {SLOT}


def test_the_purge_estimate_is_quick_and_at_most_one_per_job_over(make_store) -> None:
    """The total of ``purge``'s progress line: about what it deletes, never fewer,
    and at most each job's newest claim (which the purge keeps) more."""
    store = make_store()
    store.claim("node-a", [slot_request(f"old-{i}", slot) for i in range(7)
                           for slot in (SLOT - timedelta(hours=2), SLOT - timedelta(hours=1))])
    time.sleep(0.3)
    store.claim("node-a", [slot_request("fresh", SLOT)])
    estimate = store.estimate_purge(timedelta(seconds=0.2))
    exact = store.purge(timedelta(seconds=0.2), dry_run=True)
    assert exact == 7 and exact <= estimate <= exact + 7, (exact, estimate)
    assert store.purge(timedelta(seconds=0.2)) == 7


def test_heartbeats_list_every_node_on_the_store_clock(make_store) -> None:
    from celery_elarion_beat.store.records import NodeState

    a, b = make_store(), make_store()
    state = NodeState(node="node-a", boot_id="boot-1", version="1.0", fingerprint="f1",
                      entries={"report": "d1"}, counts={("report", "dispatched", ""): 3},
                      host="h", pid=1)
    now1, nodes = a.heartbeat(state)
    assert [n.node for n in nodes] == ["node-a"]
    # the heartbeat reads no counts, and no entries of a node with this node's schedule
    assert nodes[0].entries == {} and nodes[0].counts == {}
    first = a.nodes()[1][0]
    assert first.entries == {"report": "d1"} and first.counts == {("report", "dispatched", ""): 3}
    assert first.started_at is not None and first.last_seen is not None
    assert abs((first.last_seen - now1).total_seconds()) < 5
    time.sleep(0.05)
    b.heartbeat(NodeState(node="node-b", boot_id="boot-2", version="1.0", fingerprint="f2",
                          entries={"report": "d2"}))
    _, nodes = a.heartbeat(state)  # same boot: started_at is kept, last_seen moves on
    again = {n.node: n for n in nodes}
    assert set(again) == {"node-a", "node-b"}
    assert again["node-b"].entries == {"report": "d2"}  # another schedule: its entries come
    assert again["node-a"].started_at == first.started_at
    assert again["node-a"].last_seen > first.last_seen
    time.sleep(0.05)
    _, nodes = a.heartbeat(NodeState(node="node-a", boot_id="boot-3", version="1.1",
                                     fingerprint="f1"))
    restarted = {n.node: n for n in nodes}["node-a"]
    assert restarted.started_at > first.started_at and restarted.version == "1.1"
    assert [n.node for n in b.nodes()[1]] == ["node-a", "node-b"]


def test_a_heartbeat_writes_the_entries_only_when_they_changed(make_store) -> None:
    """At 100,000 entries the digests are megabytes: a heartbeat of the same schedule
    moves last_seen and the counts on, and leaves the entries as written."""
    from celery_elarion_beat.store.records import NodeState

    a, b = make_store(), make_store()

    def beat(fingerprint: str, entries: dict[str, str], dispatched: int,
             boot: str = "boot-1") -> None:
        a.heartbeat(NodeState(node="node-a", boot_id=boot, version="1.0",
                              fingerprint=fingerprint, entries=entries,
                              counts={("report", "dispatched", ""): dispatched}))

    def stored() -> NodeState:
        return {n.node: n for n in b.nodes()[1]}["node-a"]

    beat("f1", {"report": "d1"}, 1)
    first = stored()
    time.sleep(0.05)
    beat("f1", {"report": "not written: same fingerprint"}, 2)
    again = stored()
    assert again.entries == {"report": "d1"}
    assert again.counts == {("report", "dispatched", ""): 2}
    assert again.last_seen > first.last_seen and again.started_at == first.started_at
    beat("f2", {"report": "d2", "digest": "d3"}, 3)  # an edit: written whole
    assert stored().entries == {"report": "d2", "digest": "d3"}
    time.sleep(0.3)  # node-a's row expires, deleted by node-b's heartbeat
    b.heartbeat(NodeState(node="node-b", boot_id="boot-2", version="1.0", fingerprint="f2"),
                retention=timedelta(seconds=0.2))
    assert "node-a" not in {n.node for n in b.nodes()[1]}
    beat("f2", {"report": "d2", "digest": "d3"}, 4)  # the row is back, whole
    assert stored().entries == {"report": "d2", "digest": "d3"}
    beat("f2", {"report": "d2", "digest": "d3"}, 5, boot="boot-9")  # a restart: whole
    assert stored().boot_id == "boot-9" and stored().counts == {("report", "dispatched", ""): 5}


def test_the_ledger_answers_queries(make_store) -> None:
    store = make_store()
    store.claim("node-a", [slot_request("report", SLOT, "t1"), slot_request("digest", SLOT, "t2")])
    later = SLOT + timedelta(hours=1)
    store.claim("node-b", [slot_request("report", later, "t3")])
    assert [r.task_id for r in store.find_claims()] == ["t3", "t2", "t1"]
    assert [r.task_id for r in store.find_claims(job="report")] == ["t3", "t1"]
    assert [r.task_id for r in store.find_claims(node="node-a")] == ["t2", "t1"]
    assert [r.task_id for r in store.find_claims(since=later)] == ["t3"]
    assert [r.task_id for r in store.find_claims(limit=1)] == ["t3"]
    latest = store.latest_claims()
    assert {job: row.task_id for job, row in latest.items()} == {"report": "t3", "digest": "t2"}
    assert latest["report"].occurrence == later and latest["report"].node == "node-b"
    assert store.existing([("report", SLOT), ("report", SLOT + timedelta(minutes=1)),
                           ("digest", SLOT)]) == {("report", SLOT), ("digest", SLOT)}


def test_the_job_ledger_gives_the_oldest_claim_and_the_claims_in_range(make_store) -> None:
    store = make_store()
    slots = [SLOT + timedelta(hours=h) for h in range(5)]
    store.claim("node-a", [slot_request("hourly", s) for s in slots if s != slots[2]])
    ledger = store.job_ledger({"hourly": (slots[1], slots[3]), "never": (slots[0], slots[4])})
    assert ledger["hourly"].first == slots[0]
    assert ledger["hourly"].claimed == {slots[1], slots[3]}
    assert ledger["never"].first is None and ledger["never"].claimed == frozenset()


def test_the_store_clock_is_aware_utc_and_near_the_heartbeat_clock(make_store) -> None:
    from celery_elarion_beat.store.records import NodeState

    store = make_store()
    now, _ = store.heartbeat(NodeState(node="node-a", boot_id="b", version="0", fingerprint="f"))
    clock = store.clock()
    assert clock.utcoffset() == timedelta(0) and 0 <= (clock - now).total_seconds() < 5


def test_a_slot_claimed_before_it_came_on_the_store_clock_is_refused(make_store) -> None:
    """A claim whose slot is more than its lead ahead of the store's clock (a node whose
    clock runs ahead) is refused as early and writes nothing; within its lead, or
    without one (a replay, an operator's claim), it is an ordinary claim."""
    store = make_store()
    now = store.clock()
    ahead = now.replace(microsecond=0) + timedelta(seconds=30)
    lead = timedelta(seconds=2)

    def at(slot: datetime, job: str = "report", lead: timedelta | None = lead) -> ClaimRequest:
        return replace(slot_request(job, slot), lead=lead)

    early, near, open_ = store.claim("node-fast", [
        at(ahead), at(now.replace(microsecond=0) + timedelta(seconds=1), "digest"),
        at(ahead, "unled", lead=None)])
    assert early.early and not early.won and early.winner is None
    assert near.won and not near.early
    assert open_.won and not open_.early
    # nothing was written: the slot is won when it comes (here: asked without a lead)
    assert store.claim("node-true", [at(ahead, lead=None)])[0].won
