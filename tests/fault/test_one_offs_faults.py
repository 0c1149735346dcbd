"""Durable one-offs under faults (issue #18), on real beat processes, Redis and PostgreSQL.

* restart: every beat node stopped, then started again, between scheduling and the
  due time: the one-off still runs once, on time (due + poll + a few seconds);
* kill -9 between lease and publish: the node holding the lease is killed (the test
  hook ``ELARION_TEST_PAUSE_ONE_OFF`` stops it right after its lease); another node
  publishes once the lease expires, with the same task id, ``attempts`` 2; the delay
  from the kill to the publish is printed;
* two beats racing 10,000 due one-offs (written before the beats start): each is
  published exactly once (the queue is drained and every message's task id counted),
  the split between the nodes and the time are printed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from celery_elarion_beat import OneOffState, schedule_once
from celery_elarion_beat.testing._harness import wait_until
from tests.acceptance import proj_one_offs as proj
from tests.acceptance.cluster import summary
from tests.acceptance.one_offs import OneOffCluster, settle

pytestmark = [pytest.mark.postgres]
# real beats racing 10,000 one-offs, and a kill -9 between lease and publish
pytestmark += [pytest.mark.heavy]

POLL = 1.0
LEASE = 5.0
PAUSING = "celery_elarion_beat.testing.hooks.PausingScheduler"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "procs"
    path.mkdir()
    return path


@pytest.fixture
def make_cluster(workdir: Path, pg_dsn: str, redis_url: str) -> Iterator[Any]:
    made: list[OneOffCluster] = []

    def make(**env: str) -> OneOffCluster:
        c = OneOffCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url,
                          ELARION_ACC_ONE_OFFS_POLL=str(POLL), **env)
        made.append(c)
        c.prepare()
        return c

    yield make
    for c in made:
        c.close()


def test_every_beat_restarted_before_the_due_time_still_runs_once_on_time(
        make_cluster: Any, workdir: Path) -> None:
    c: OneOffCluster = make_cluster()
    c.start_worker()
    for node in ("node-1", "node-2", "node-3"):
        c.start_beat(node, wait=False)
    for beat in c.beats.values():
        beat.wait_for_log(r"beat: claiming occurrences in .* as node ", 90)
    one = c.schedule_in_child(countdown=20.0, args=["restart"])
    old = list(c.beats.values())
    stopped_at = time.time()
    for beat in old:
        beat.sigterm()
    for beat in old:
        beat.terminate(20, sigterm=False)
    assert not any(b.alive() for b in old)
    down = time.time() - stopped_at
    row = c.one_off(one["id"])
    assert row.state is OneOffState.SCHEDULED and c.runs_of(one["id"]) == []
    for node in ("node-1", "node-2", "node-3"):
        c.start_beat(node, wait=False)
    for node in ("node-1", "node-2", "node-3"):
        c.beats[node].wait_for_log(r"beat: claiming occurrences in .* as node ", 90)
    restarted = time.time()
    assert restarted < row.due.timestamp(), "the beats took longer to restart than the lead"
    wait_until(lambda: c.runs_of(one["id"]), 60, interval=0.25,
               message=lambda: f"the one-off to run\n{c.tails()}")
    settle(POLL + 1.0)
    runs = c.runs_of(one["id"])
    row = c.one_off(one["id"])
    late = (runs[0].executed_at - row.due).total_seconds()
    summary(workdir, "one-off across a restart of every beat",
            f"beats stopped in {down:.1f}s, restarted {row.due.timestamp() - restarted:.1f}s "
            f"before due; ran {late:+.2f}s after due, published by {row.node}")
    assert len(runs) == 1 and runs[0].task_id == one["id"], runs
    assert row.state is OneOffState.PUBLISHED and row.attempts == 1
    assert 0 <= late <= POLL + 5.0, f"ran {late:.2f}s after its due time"


def test_kill_9_between_lease_and_publish_another_node_publishes_after_the_lease(
        make_cluster: Any, workdir: Path) -> None:
    marker = workdir / "paused.json"
    c: OneOffCluster = make_cluster(ELARION_ACC_ONE_OFFS_LEASE=str(LEASE))
    c.start_worker()
    hook = {"ELARION_TEST_PAUSE_ONE_OFF": "1", "ELARION_TEST_PAUSE_MARKER": str(marker)}
    for node in ("node-1", "node-2"):
        c.start_beat(node, scheduler=PAUSING, env=hook, wait=False)
    for beat in c.beats.values():
        beat.wait_for_log(r"beat: claiming occurrences in .* as node ", 90)
    one = c.schedule(proj.TASK, "kill", countdown=2.0)
    paused = wait_until(lambda: marker.exists() and marker.read_text().strip(), 30,
                        interval=0.1, message=lambda: f"a beat to pause\n{c.tails()}")
    held = json.loads(paused)
    victim = next(node for node, b in c.beats.items() if b.pid == held["pid"])
    survivor = next(node for node in c.beats if node != victim)
    leased = c.one_off(one.id)
    assert (leased.state, leased.node, leased.attempts) == (OneOffState.LEASED, victim, 1)
    c.beats[victim].kill9()
    killed_at = c.beats[victim].killed_at
    assert killed_at is not None
    wait_until(lambda: c.runs_of(one.id), 60, interval=0.2,
               message=lambda: f"the survivor to publish\n{c.tails()}")
    settle(POLL + 1.0)
    row = c.one_off(one.id)
    runs = c.runs_of(one.id)
    assert row.published is not None and leased.lease_until is not None
    delay = row.published.timestamp() - killed_at
    after_expiry = (row.published - leased.lease_until).total_seconds()
    summary(workdir, "one-off: kill -9 between lease and publish",
            f"lease {LEASE:g}s held by {victim}; killed; {survivor} published {delay:.2f}s "
            f"after the kill, {after_expiry:.2f}s after the lease expired "
            f"(attempts {row.attempts})")
    assert len(runs) == 1, runs
    assert runs[0].task_id == one.id and runs[0].node == survivor
    assert (row.state, row.node, row.attempts) == (OneOffState.PUBLISHED, survivor, 2)
    assert row.published >= leased.lease_until, "taken over before the lease expired"
    assert after_expiry <= POLL + 5.0


def test_two_beats_racing_10000_due_one_offs_publish_each_once(
        make_cluster: Any, workdir: Path) -> None:
    n = 10_000
    c: OneOffCluster = make_cluster()
    started = time.time()
    with psycopg.connect(c.pg_dsn) as conn:  # one transaction: the outbox path, fast
        ids = [schedule_once(c.app, proj.TASK, (i,), connection=conn).id for i in range(n)]
    written = time.time() - started
    assert len(set(ids)) == n
    for node in ("node-1", "node-2"):
        c.start_beat(node, wait=False)
    t0 = time.time()
    wait_until(lambda: not c.store.one_offs(states=[OneOffState.SCHEDULED,
                                                    OneOffState.LEASED], limit=1),
               240, interval=1.0, message=lambda: f"every one-off to be published\n{c.tails()}")
    published_in = time.time() - t0
    rows = c.store.one_offs(limit=n + 10)
    messages = drain_ids(c)
    split = Counter(r.node for r in rows)
    counts = Counter(messages)
    first = min(r.published for r in rows if r.published)
    last = max(r.published for r in rows if r.published)
    summary(workdir, "two beats racing 10,000 due one-offs",
            f"written in {written:.1f}s; all published {published_in:.1f}s after the beats "
            f"were started, {(last - first).total_seconds():.2f}s from the first publish to "
            f"the last; split {dict(sorted(split.items()))}; messages {len(messages)}")
    assert Counter(r.state for r in rows) == {OneOffState.PUBLISHED: n}
    assert set(counts) == set(ids), "messages missing or foreign"
    assert [i for i, k in counts.items() if k > 1] == [], "published more than once"
    assert all(r.attempts == 1 for r in rows)
    assert set(split) == {"node-1", "node-2"}


def drain_ids(c: OneOffCluster) -> list[str]:
    """The task id of every message in the cluster's queue (nothing consumes it)."""
    ids: list[str] = []
    with c.app.connection_for_read() as conn:
        queue = c.app.amqp.queues[c.queue].bind(conn.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
    return ids
