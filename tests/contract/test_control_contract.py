"""Live control, on every backend: a pause is honoured inside the claim (stored
``skipped``/``paused``, the same answer for every node), expires by itself, and is
lifted by resume; a triggered run is a ``manual`` claim that a second trigger within
the window finds instead of running again; every action leaves an audit row."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest

from celery_elarion_beat import ClaimRequest
from celery_elarion_beat.config.overlap import OverlapRule
from celery_elarion_beat.store import PublishReport
from celery_elarion_beat.store.control_records import ALL_JOBS
from tests.contract.conftest import SLOT, slot_request, window_request

NEXT = SLOT + timedelta(minutes=1)
WINDOW = timedelta(seconds=10)


def test_a_paused_slot_is_skipped_by_every_node_with_the_pause(make_store) -> None:
    a, b = make_store(), make_store()
    a.pause("report", "alice@h1 (cli)", "db migration")
    (first,) = a.claim("node-a", [slot_request()])
    (second,) = b.claim("node-b", [slot_request()])
    for result in (first, second):
        assert not result.won and result.paused and not result.still_running
        assert result.pause is not None and result.pause.paused_by == "alice@h1 (cli)"
        assert result.pause.reason == "db migration"
    assert second.winner == "node-a"  # decided once, by the first claim
    (row,) = a.find_claims(job="report")
    assert (row.state, row.publish_error) == ("skipped", "paused")
    # other jobs go on
    (other,) = b.claim("node-b", [slot_request("other")])
    assert other.won and not other.paused


def test_a_paused_window_is_skipped_once_per_window(make_store) -> None:
    a, b = make_store(), make_store()
    a.pause("poll", "alice (cli)")
    (first,) = a.claim("node-a", [window_request(seconds=60)])
    (second,) = b.claim("node-b", [window_request(seconds=60)])
    assert first.paused and second.paused and not first.won and not second.won
    assert len(a.find_claims(job="poll")) == 1


def test_pause_all_pauses_every_job_but_not_the_purge_election(make_store) -> None:
    store = make_store()
    store.pause(ALL_JOBS, "ops (cli)", "maintenance")
    results = store.claim("node-a", [slot_request("x"), slot_request("y")])
    assert all(r.paused and r.pause and r.pause.all_jobs for r in results)
    untracked = ClaimRequest.for_window("elarion.purge", timedelta(seconds=60),
                                        str(uuid.uuid4()), tracked=False)
    (election,) = store.claim("node-a", [untracked])
    assert election.won


def test_a_job_pause_wins_over_the_pause_of_every_job(make_store) -> None:
    store = make_store()
    store.pause(ALL_JOBS, "ops (cli)", "maintenance")
    store.pause("report", "alice (cli)", "its own")
    (result,) = store.claim("node-a", [slot_request()])
    assert result.pause is not None and result.pause.reason == "its own"


def test_resume_lifts_the_pause_and_says_what_it_lifted(make_store) -> None:
    store = make_store()
    store.pause("report", "alice (cli)", "why")
    lifted = store.resume("report", "bob (cli)")
    assert lifted is not None and lifted.paused_by == "alice (cli)"
    assert store.resume("report", "bob (cli)") is None  # not paused: nothing written
    (result,) = store.claim("node-a", [slot_request()])
    assert result.won
    actions = [(a.action, a.actor) for a in store.audit(job="report")]
    assert actions == [("resume", "bob (cli)"), ("pause", "alice (cli)")]


def test_a_pause_with_until_expires_by_itself(make_store) -> None:
    store = make_store()
    until = store.clock() + timedelta(seconds=1.5)
    pause = store.pause("report", "alice (cli)", until=until)
    assert pause.until == until
    (held,) = store.claim("node-a", [slot_request()])
    assert held.paused
    _, active = store.pauses()
    assert [p.job for p in active] == ["report"]
    deadline = time.monotonic() + 10
    while store.clock() <= until and time.monotonic() < deadline:
        time.sleep(0.1)
    (later,) = store.claim("node-a", [slot_request(slot=NEXT)])
    assert later.won
    assert store.pauses()[1] == []
    assert store.resume("report", "bob (cli)") is None  # expired: nothing to lift


def test_pauses_of_jobs_lists_theirs_and_the_pause_of_every_job(make_store) -> None:
    store = make_store()
    store.pause("a", "x (cli)")
    store.pause("b", "x (cli)")
    store.pause(ALL_JOBS, "x (cli)")
    _, found = store.pauses(["a"])
    assert sorted(p.job for p in found) == [ALL_JOBS, "a"]


def test_a_trigger_is_a_manual_claim_and_a_second_one_finds_it(make_store) -> None:
    a, b = make_store(), make_store()
    first = a.claim_manual("report", "alice@h1 (cli)", "t1", "alice@h1 (cli)", WINDOW, "fix")
    assert first.row is not None and first.token and first.row.kind == "manual"
    second = b.claim_manual("report", "bob@h2 (cli)", "t2", "bob@h2 (cli)", WINDOW)
    assert second.row is None and second.duplicate is not None
    assert second.duplicate.task_id == "t1"
    forced = b.claim_manual("report", "bob@h2 (cli)", "t3", "bob@h2 (cli)", None)
    assert forced.row is not None
    a.report([PublishReport("report", first.row.occurrence, first.token)])
    rows = {r.task_id: r for r in a.find_claims(job="report")}
    assert set(rows) == {"t1", "t3"} and rows["t1"].state == "published"
    audit = a.audit(job="report")
    assert [(e.action, e.task_id, e.detail) for e in audit] == [
        ("trigger", "t3", "forced"), ("trigger", "t1", "")]
    assert audit[1].reason == "fix"


def test_a_failed_trigger_does_not_block_the_next(make_store) -> None:
    store = make_store()
    first = store.claim_manual("report", "a (cli)", "t1", "a (cli)", WINDOW)
    assert first.row is not None and first.token
    store.report([PublishReport("report", first.row.occurrence, first.token, "broker down")])
    again = store.claim_manual("report", "a (cli)", "t2", "a (cli)", WINDOW)
    assert again.row is not None


def test_a_manual_run_neither_holds_a_window_nor_says_where_the_schedule_stands(
        make_store) -> None:
    store = make_store()
    store.claim_manual("poll", "a (cli)", "t1", "a (cli)", WINDOW)
    (window,) = store.claim("node-a", [window_request(seconds=60)])
    assert window.won
    store.claim_manual("report", "a (cli)", "t2", "a (cli)", WINDOW)
    (slot,) = store.claim("node-a", [slot_request()])
    latest = store.latest_claims(["report", "poll"])
    assert latest["report"].occurrence == slot.occurrence
    assert latest["poll"].kind == "window"


def test_an_unpublished_manual_run_is_never_an_orphan_to_take_over(make_store) -> None:
    store = make_store()
    store.claim_manual("report", "a (cli)", "t1", "a (cli)", WINDOW)
    _, rows = store.unpublished(timedelta(hours=1))
    assert rows == []


def test_an_unfinished_manual_run_holds_back_overlap_skip(make_store) -> None:
    store = make_store()
    manual = store.claim_manual("report", "a (cli)", "t1", "a (cli)", WINDOW)
    assert manual.row is not None and manual.token
    store.report([PublishReport("report", manual.row.occurrence, manual.token)])
    rule = OverlapRule(timeout=timedelta(hours=1), pending=timedelta(seconds=30))
    request = ClaimRequest.for_slot("report", SLOT, str(uuid.uuid4()), overlap=rule)
    (result,) = store.claim("node-a", [request])
    assert result.still_running and not result.paused


@pytest.mark.parametrize("callers", [8])
def test_concurrent_triggers_give_one_run(make_store, callers: int) -> None:
    stores = [make_store() for _ in range(callers)]
    barrier = threading.Barrier(callers)
    outcomes: list = [None] * callers

    def trigger(i: int) -> None:
        barrier.wait()
        outcomes[i] = stores[i].claim_manual("report", f"op{i} (cli)", f"t{i}", f"op{i} (cli)",
                                             WINDOW)

    threads = [threading.Thread(target=trigger, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    won = [o for o in outcomes if o is not None and o.row is not None]
    assert len(won) == 1, outcomes
    assert all(o is not None and o.duplicate is not None for o in outcomes if o not in won)
    rows = stores[0].find_claims(job="report")
    assert [r.task_id for r in rows] == [won[0].row.task_id]
    assert len(stores[0].audit(job="report")) == 1


def test_concurrent_pauses_of_one_job_leave_one_pause(make_store) -> None:
    stores = [make_store() for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def pause(i: int) -> None:
        barrier.wait()
        try:
            stores[i].pause("report", f"op{i} (cli)", f"reason {i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pause, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    _, pauses = stores[0].pauses()
    assert len(pauses) == 1
    assert len(stores[0].audit(job="report")) == len(stores)
