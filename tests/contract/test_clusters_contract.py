"""Several apps on one table: the cluster contract (``elarion_beat_cluster``), run
against every backend (memory, PostgreSQL with both claims layouts, SQLite, MariaDB).

Two stores of two clusters, ``svc_a`` and ``svc_b``, on ONE set of tables: neither
ever claims, pauses, reports, purges, leases or lists the other's rows, while two
stores of one cluster still coordinate as before.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from celery_elarion_beat.store.control_records import ALL_JOBS
from celery_elarion_beat.store.one_off_records import NewOneOff, OneOffState
from celery_elarion_beat.store.records import NodeState, PublishReport, RunReport
from tests.contract.conftest import SLOT, slot_request, window_request

A, B = "svc_a", "svc_b"


def test_both_clusters_win_the_same_slot_and_each_only_once(make_store) -> None:
    a, b, a2 = make_store(A), make_store(B), make_store(A)
    won_a = a.claim("node-1", [slot_request("cleanup", task_id="task-a")])[0]
    won_b = b.claim("node-1", [slot_request("cleanup", task_id="task-b")])[0]
    assert won_a.won and won_b.won, (won_a, won_b)
    lost = a2.claim("node-2", [slot_request("cleanup", task_id="task-a2")])[0]
    assert not lost.won and (lost.winner, lost.winner_task_id) == ("node-1", "task-a")
    assert not make_store(B).claim("node-2", [slot_request("cleanup")])[0].won
    assert [(r.job, r.task_id) for r in a.find_claims()] == [("cleanup", "task-a")]
    assert [(r.job, r.task_id) for r in b.find_claims()] == [("cleanup", "task-b")]
    assert {r.cluster for r in a.find_claims() + b.find_claims()} == {A, B}
    assert a.existing([("cleanup", SLOT)]) == {("cleanup", SLOT)}
    assert a.latest_claims()["cleanup"].task_id == "task-a"
    assert b.job_ledger({"cleanup": (SLOT, SLOT)})["cleanup"].claimed == frozenset({SLOT})


def test_a_window_of_one_cluster_never_blocks_the_other(make_store) -> None:
    a, b = make_store(A), make_store(B)
    assert a.claim("node-1", [window_request("poll", seconds=30)])[0].won
    assert b.claim("node-1", [window_request("poll", seconds=30)])[0].won
    assert not make_store(A).claim("node-2", [window_request("poll", seconds=30)])[0].won
    assert not make_store(B).claim("node-2", [window_request("poll", seconds=30)])[0].won


def test_pause_all_of_one_cluster_leaves_the_other_claiming(make_store) -> None:
    a, b = make_store(A), make_store(B)
    a.pause(ALL_JOBS, "ops", "maintenance of svc_a")
    paused = a.claim("node-1", [slot_request("cleanup")])[0]
    assert paused.paused and not paused.won
    free = b.claim("node-1", [slot_request("cleanup")])[0]
    assert free.won and not free.paused
    assert b.pauses()[1] == [] and [p.job for p in a.pauses()[1]] == [ALL_JOBS]
    # a pause of one job, in each cluster: two pauses, each lifted on its own
    a.pause("report", "ops", "a")
    b.pause("report", "ops", "b")
    assert [p.reason for p in b.pauses(["report"])[1]] == ["b"]
    lifted = b.resume("report", "ops")
    assert lifted is not None and lifted.reason == "b"
    assert [p.reason for p in a.pauses(["report"])[1] if p.job == "report"] == ["a"]
    assert b.resume(ALL_JOBS, "ops") is None  # svc_b was never paused
    assert [e.action for e in a.audit()] == ["pause", "pause"]
    assert [(e.action, e.reason) for e in b.audit()] == [("resume", ""), ("pause", "b")]


def test_the_purge_of_one_cluster_leaves_the_others_rows(make_store) -> None:
    a, b = make_store(A), make_store(B)
    earlier = SLOT - timedelta(hours=1)
    for store in (a, b):
        store.claim("node-1", [slot_request("old", earlier), slot_request("old")])
    time.sleep(0.3)
    assert a.purge(timedelta(seconds=0.2), dry_run=True) == 1
    assert a.purge(timedelta(seconds=0.2)) == 1
    assert sorted(r.occurrence for r in b.find_claims()) == [earlier, SLOT]
    assert [r.occurrence for r in a.find_claims()] == [SLOT]
    assert b.purge(timedelta(seconds=0.2)) == 1
    assert [r.occurrence for r in b.find_claims()] == [SLOT]


def test_unpublished_claims_and_takeovers_stay_in_their_cluster(make_store) -> None:
    a, b = make_store(A), make_store(B)
    mine = a.claim("node-1", [slot_request("cleanup")])[0]
    b.claim("node-1", [slot_request("cleanup")])
    time.sleep(0.3)
    _, rows = a.unpublished(timedelta(hours=1))
    assert [(r.job, r.cluster) for r in rows] == [("cleanup", A)]
    # svc_b's node sees only its own orphan, and takes over only that one
    _, theirs = b.unpublished(timedelta(hours=1))
    taken = b.take_over("node-2", theirs, timedelta(seconds=0.2))
    assert [t.row.cluster for t in taken] == [B]
    # a report of svc_a's claim never touches svc_b's row of the same key
    a.report([PublishReport("cleanup", SLOT, mine.token or "")])
    assert [r.state for r in a.find_claims()] == ["published"]
    assert [r.state for r in b.find_claims()] == ["pending"]


def test_run_records_reach_the_row_of_their_cluster(make_store) -> None:
    a, b = make_store(A), make_store(B)
    a.claim("node-1", [slot_request("cleanup", task_id="same-task")])
    b.claim("node-1", [slot_request("cleanup", task_id="same-task")])
    a.record_runs([RunReport("cleanup", SLOT, "same-task", RunReport.STARTED, "w-a")])
    assert [r.run_state for r in a.find_claims()] == ["running"]
    assert [r.run_state for r in b.find_claims()] == [None]
    # an every-node run of one cluster is a row of its own there, none in the other
    b.record_runs([RunReport("hourly", SLOT, "t-n", RunReport.STARTED, "w-b",
                             node="node-1", every_node=True)])
    assert [r.job for r in b.find_claims(job="hourly")] == ["hourly"]
    assert a.find_claims(job="hourly") == []


def test_manual_claims_and_their_audit_are_per_cluster(make_store) -> None:
    a, b = make_store(A), make_store(B)
    first = a.claim_manual("report", "cli", "t-a", "ops", timedelta(seconds=60))
    assert first.row is not None
    # svc_b's trigger of the same job is no duplicate of svc_a's
    other = b.claim_manual("report", "cli", "t-b", "ops", timedelta(seconds=60))
    assert other.row is not None and other.duplicate is None
    again = make_store(A).claim_manual("report", "cli", "t-a2", "ops", timedelta(seconds=60))
    assert again.row is None and again.duplicate is not None
    assert again.duplicate.task_id == "t-a"
    assert [e.task_id for e in a.audit()] == ["t-a"]
    assert [e.task_id for e in b.audit(job="report")] == ["t-b"]


def test_heartbeats_list_the_nodes_of_their_cluster(make_store) -> None:
    a, b = make_store(A), make_store(B)

    def state(fingerprint: str) -> NodeState:
        return NodeState(node="node-1", boot_id=str(uuid.uuid4()), version="1.0",
                         fingerprint=fingerprint, entries={"cleanup": fingerprint})

    _, seen_a = a.heartbeat(state("fa"))
    _, seen_b = b.heartbeat(state("fb"))  # the same node name, another app
    assert [(n.node, n.cluster) for n in seen_a] == [("node-1", A)]
    assert [(n.node, n.cluster, n.fingerprint) for n in seen_b] == [("node-1", B, "fb")]
    _, again = a.heartbeat(state("fa"))
    assert [n.fingerprint for n in again] == ["fa"]
    assert [(n.node, n.fingerprint) for n in a.nodes()[1]] == [("node-1", "fa")]
    assert [(n.node, n.fingerprint) for n in b.nodes()[1]] == [("node-1", "fb")]
    census = a.census(timedelta(minutes=1))
    assert census.clusters == (A, B) and census.others == (B,)
    assert not census.legacy and not census.colliding and census.old_nodes == ()


def _one_off(store, key: str | None, task: str) -> NewOneOff:
    return NewOneOff(id=str(uuid.uuid4()), task=task, content_type="application/json",
                     content_encoding="utf-8", body=b"[[], {}]", options={},
                     due=store.clock() - timedelta(seconds=5), key=key)


def test_one_key_in_two_clusters_is_two_one_offs_each_leased_by_its_cluster(make_store) -> None:
    a, b = make_store(A), make_store(B)
    mine = a.add_one_off(_one_off(a, "invoice-42", "svc_a.tasks.bill"))
    theirs = b.add_one_off(_one_off(b, "invoice-42", "svc_b.tasks.bill"))
    assert mine.id != theirs.id and (mine.task, theirs.task) == (
        "svc_a.tasks.bill", "svc_b.tasks.bill")
    assert a.add_one_off(_one_off(a, "invoice-42", "other")) == mine  # still one per cluster
    assert [r.id for r in a.one_offs()] == [mine.id]
    assert [r.id for r in b.one_offs(id_or_key="invoice-42")] == [theirs.id]
    assert a.one_offs(id_or_key=theirs.id) == []
    assert a.cancel_one_off(theirs.id) is None  # svc_a cannot cancel svc_b's
    leased = a.lease_one_offs("node-1", limit=10, lease=timedelta(seconds=60))
    assert [x.id for x in leased] == [mine.id]
    assert [x.id for x in b.lease_one_offs("node-1", limit=10, lease=timedelta(seconds=60))
            ] == [theirs.id]
    # node-1 of svc_a finishes its lease only: svc_b's lease by its node-1 stays
    a.finish_one_offs("node-1", [mine.id, theirs.id], {})
    assert a.one_offs(id_or_key=mine.id)[0].state is OneOffState.PUBLISHED
    assert b.one_offs(id_or_key=theirs.id)[0].state is OneOffState.LEASED
    assert a.next_one_off_due() is None and b.next_one_off_due() is not None
