"""Acceptance: durable one-offs (issue #18) on real beat and worker processes.

One cluster for the module: two ``celery beat -S celery_elarion_beat.ClaimingScheduler``
nodes and one ``celery worker`` of :mod:`tests.acceptance.proj_one_offs` on Redis and
PostgreSQL (the one-offs table is the cluster's own). Each test schedules its own
one-offs and reads what ran from the runs table the task writes (task id, arguments,
the ``elarion_one_off`` and ``elarion_node`` headers), and their rows from the store.

* a one-off scheduled by a separate process that then exits runs at its time, once,
  on the worker, with task id = the one-off's id;
* the same key twice: one row, one run (the first call's arguments);
* cancelled before its time: never runs, stays cancelled;
* cancels racing the nodes' leases (one every 50 ms across the due time): each one-off
  ends either cancelled and never run, or leased/published and run exactly once;
* a one-off of a task no one registered: failed with an error that says so and one
  log line, and the one-offs due beside it still run.

The longer scenarios (every beat restarted, kill -9 between lease and publish, two
beats racing 10,000 one-offs) are in tests/fault/test_one_offs_faults.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from celery_elarion_beat import OneOffState, cancel
from celery_elarion_beat.testing._harness import wait_until
from tests.acceptance import proj_one_offs as proj
from tests.acceptance.cluster import summary
from tests.acceptance.one_offs import OneOffCluster, settle

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# a module cluster of real beats and a worker
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("acceptance-one-offs")]

POLL = 1.0
#: due + the pick-up delay (the poll) + a margin for a loaded 2-core machine
LATE_BOUND = POLL + 4.0
RUN_TIMEOUT = 30.0
FINISHED = {OneOffState.PUBLISHED, OneOffState.FAILED, OneOffState.CANCELLED}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
            redis_url: str) -> Iterator[OneOffCluster]:
    workdir = tmp_path_factory.mktemp("one-offs")
    c = OneOffCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url,
                      ELARION_ACC_ONE_OFFS_POLL=str(POLL))
    try:
        c.prepare()
        c.start_worker()
        for node in ("node-1", "node-2"):
            c.start_beat(node, wait=False)
        for beat in c.beats.values():
            beat.wait_for_log(r"beat: claiming occurrences in .* as node ", 90)
        yield c
    except BaseException:
        print(c.tails())
        raise
    finally:
        c.close()


def _wait_runs(c: OneOffCluster, task_id: str, count: int = 1) -> None:
    wait_until(lambda: len(c.runs_of(task_id)) >= count, RUN_TIMEOUT, interval=0.25,
               message=lambda: f"{count} run(s) of {task_id}\n{c.tails()}")


def test_scheduled_by_a_process_that_exits_runs_once_at_its_time(
        cluster: OneOffCluster, workdir: Path) -> None:
    made = cluster.schedule_in_child(countdown=4.0, args=["from-child", 7])
    one_id = made["id"]
    # the scheduling process has exited: only the row remains
    row = cluster.one_off(one_id)
    assert row.state is OneOffState.SCHEDULED and row.task == proj.TASK
    _wait_runs(cluster, one_id)
    settle()
    runs = cluster.runs_of(one_id)
    row = cluster.one_off(one_id)
    late = (runs[0].executed_at - row.due).total_seconds()
    summary(workdir, "one-off from a separate process",
            f"due {row.due.isoformat()}, ran {late:+.2f}s after due on {runs[0].worker}, "
            f"published by {row.node}, attempts {row.attempts}")
    assert len(runs) == 1, runs
    (run,) = runs
    assert run.task_id == one_id and run.one_off == one_id
    assert run.args == ["from-child", 7]
    assert run.node == row.node and row.node in cluster.beats
    assert row.state is OneOffState.PUBLISHED and row.attempts == 1
    assert row.published is not None and row.published >= row.due
    assert 0 <= late <= LATE_BOUND, f"ran {late:.2f}s after its due time"


def test_same_key_twice_is_one_row_and_one_run(cluster: OneOffCluster) -> None:
    key = f"invoice-{uuid.uuid4().hex[:8]}"
    first = cluster.schedule(proj.TASK, "first", countdown=2.0, key=key)
    second = cluster.schedule(proj.TASK, "second", countdown=30.0, key=key)
    assert second.id == first.id and second.due == first.due
    assert [o.id for o in cluster.store.one_offs(id_or_key=key, limit=10)] == [first.id]
    _wait_runs(cluster, first.id)
    settle(POLL + 1.0)
    runs = cluster.runs_of(first.id)
    assert [r.args for r in runs] == [["first"]]
    third = cluster.schedule(proj.TASK, "third", countdown=0, key=key)  # after it ran
    assert third.id == first.id and third.state is OneOffState.PUBLISHED


def test_cancelled_before_its_time_never_runs(cluster: OneOffCluster) -> None:
    doomed = cluster.schedule(proj.TASK, "doomed", countdown=3.0)
    witness = cluster.schedule(proj.TASK, "witness", countdown=4.0)
    cancelled = cancel(cluster.app, doomed.id)
    assert cancelled.id == doomed.id and cancelled.state is OneOffState.CANCELLED
    _wait_runs(cluster, witness.id)  # beat went past the doomed one's due time
    settle(POLL + 1.0)
    assert cluster.runs_of(doomed.id) == []
    assert cluster.one_off(doomed.id).state is OneOffState.CANCELLED
    # too late for the witness: the row is returned as it is
    assert cancel(cluster.app, witness.id).state is OneOffState.PUBLISHED


def test_cancels_racing_the_leases_have_one_outcome_each(cluster: OneOffCluster) -> None:
    ones = [cluster.schedule(proj.TASK, "race", i, countdown=3.0) for i in range(60)]
    due = max(o.due for o in ones)
    # cancel them one after another, every 50 ms from 1 s before their due time to 2 s
    # after, while both beats lease them: the early cancels win, the late ones lose
    wait_until(lambda: cluster.store.clock() >= due - timedelta(seconds=1.0), 10,
               interval=0.02)
    answers = []
    for one in ones:
        answers.append(cancel(cluster.app, one.id))
        time.sleep(0.05)
    wait_until(lambda: all(cluster.one_off(o.id).state in FINISHED for o in ones),
               RUN_TIMEOUT, interval=0.5, message="every raced one-off to finish")
    settle(POLL + 1.0)
    ran = {}
    for run in cluster.runs():
        ran[run.task_id] = ran.get(run.task_id, 0) + 1
    won = [a for a in answers if a.state is OneOffState.CANCELLED]
    lost = [a for a in answers if a.state is not OneOffState.CANCELLED]
    print(f"cancel race: {len(won)} cancels won, {len(lost)} too late "
          f"({sorted({a.state.value for a in lost})})")
    # both outcomes happened (else the race was not run: the timing above is off)
    assert won and lost, f"{len(won)} cancels won, {len(lost)} lost"
    for answer in won:
        assert ran.get(answer.id, 0) == 0, f"{answer.id} was cancelled, yet ran"
        assert cluster.one_off(answer.id).state is OneOffState.CANCELLED
    for answer in lost:
        assert answer.state in {OneOffState.LEASED, OneOffState.PUBLISHED}, answer
        assert ran.get(answer.id, 0) == 1, f"{answer.id} ({answer.state}) ran " \
                                          f"{ran.get(answer.id, 0)} times"
        assert cluster.one_off(answer.id).state is OneOffState.PUBLISHED


def test_an_unregistered_task_fails_and_the_others_still_run(cluster: OneOffCluster) -> None:
    before = [cluster.schedule(proj.TASK, "before", countdown=2.0)]
    bad = cluster.schedule(proj.UNREGISTERED, "x", countdown=2.0)
    after = [cluster.schedule(proj.TASK, "after", i, countdown=2.0) for i in range(3)]
    for one in before + after:
        _wait_runs(cluster, one.id)
    wait_until(lambda: cluster.one_off(bad.id).state is OneOffState.FAILED, RUN_TIMEOUT,
               interval=0.25, message=lambda: f"{bad.id} to fail\n{cluster.tails()}")
    settle()
    row = cluster.one_off(bad.id)
    assert row.error is not None and "not registered" in row.error, row.error
    assert proj.UNREGISTERED in row.error
    assert cluster.runs_of(bad.id) == []
    for one in before + after:
        assert len(cluster.runs_of(one.id)) == 1
    lines = [line for beat in cluster.beats.values()
             for line in beat.lines(f"beat: one-off {bad.id}", "failed")]
    assert len(lines) == 1, lines
    assert "ERROR" in lines[0] and proj.UNREGISTERED in lines[0]
