"""The every-node runs half of the contract (issue #35), on every backend: the rows the
workers write for every-node runs are counted per job and beat node since each job's own
start; the newest run per job and node since the tracking horizon tells which nodes'
workers record runs at all; other kinds of rows, other jobs and other clusters never
count."""

from __future__ import annotations

import uuid
from datetime import timedelta

from celery_elarion_beat import ClaimRequest
from celery_elarion_beat.store.records import NodeRuns, RunReport
from tests.contract.conftest import SLOT

SECOND = timedelta(seconds=1)


def _ran(store, job: str, node: str, *seconds: float) -> None:
    """Runs of *job* on *node*'s worker, started *seconds* after SLOT."""
    store.record_runs([RunReport(job, SLOT + timedelta(seconds=s), str(uuid.uuid4()), "started",
                                 f"celery@{node}", node=node, every_node=True)
                       for s in seconds])


def test_runs_are_counted_per_job_and_node_since_each_jobs_start(make_store) -> None:
    worker, reader = make_store(), make_store()
    _ran(worker, "cache", "a", 0, 10, 20, 30.5)
    _ran(worker, "cache", "b", 1, 2)
    _ran(worker, "flush", "a", 5, 25)
    found = reader.node_runs({"cache": SLOT + 10 * SECOND, "flush": SLOT + 26 * SECOND},
                             tracked_since=SLOT)
    assert found.runs == {("cache", "a"): 3}  # 10, 20, 30.5: the start counts
    assert found.last == {("cache", "a"): SLOT + timedelta(seconds=30.5),
                          ("cache", "b"): SLOT + 2 * SECOND, ("flush", "a"): SLOT + 25 * SECOND}
    # b ran nothing since 10 s, and flush nothing since 26 s: both nodes are tracked
    assert found.tracked == {"a", "b"}


def test_the_tracking_horizon_bounds_what_tracks_a_node(make_store) -> None:
    store = make_store()
    _ran(store, "cache", "old", 0)
    _ran(store, "cache", "new", 60)
    found = store.node_runs({"cache": SLOT}, tracked_since=SLOT + 30 * SECOND)
    assert found.tracked == {"new"}
    assert found.runs == {("cache", "old"): 1, ("cache", "new"): 1}
    assert store.node_runs({}, tracked_since=SLOT) == NodeRuns()


def test_claims_other_jobs_and_other_clusters_never_count(make_store) -> None:
    store, other = make_store(), make_store("svc_b")
    (won,) = store.claim("a", [ClaimRequest.for_slot("cache", SLOT + 3 * SECOND, "t-claim")])
    assert won.won
    store.record_runs([RunReport("cache", won.occurrence, "t-claim", "started", "celery@a")])
    _ran(store, "report", "a", 4)  # a job not asked about
    _ran(other, "cache", "b", 5)  # another app's every-node run of a job of that name
    found = store.node_runs({"cache": SLOT}, tracked_since=SLOT)
    assert found == NodeRuns()
    assert other.node_runs({"cache": SLOT}, tracked_since=SLOT).runs == {("cache", "b"): 1}


def test_a_finished_run_counts_once(make_store) -> None:
    store = make_store()
    at = SLOT + timedelta(seconds=7, microseconds=250000)
    store.record_runs([RunReport("cache", at, "t1", "started", "celery@a", node="a",
                                 every_node=True)])
    store.record_runs([RunReport("cache", at, "t1", "succeeded", "celery@a", runtime=0.1,
                                 node="a", every_node=True)])
    found = store.node_runs({"cache": SLOT}, tracked_since=SLOT)
    assert found.runs == {("cache", "a"): 1} and found.last == {("cache", "a"): at}
