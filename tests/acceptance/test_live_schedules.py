"""Acceptance: live schedules (#28) on real beat and worker processes, Redis, and the
claims database (PostgreSQL; MariaDB for the first scenario too).

Three ``celery beat -S celery_elarion_beat.ClaimingScheduler`` nodes and one worker of
:mod:`tests.acceptance.proj_live` (database entries on, no code entry). Every check
reads what happened from the claims table (one row per occurrence, with the revision it
ran under), the runs table the task writes, and the entry's revision history:

* ``schedule add`` of a cron every 2 s (the real CLI): runs within 2 s, each slot once;
  ``edit`` to every 3 s: the new rhythm from its effective time, no duplicate, no run
  fired by the edit; ``remove``: nothing after it (PostgreSQL and MariaDB);
* edits landing within +-2 s of a due instant (arguments, time, disable and enable,
  delete and recreate), on PostgreSQL one node's LISTEN connection killed twice: 0
  duplicates, 0 lost slots, each occurrence under the revision that governs it;
* a raw SQL ``UPDATE`` of the entries table is followed like any edit.

The database down during an edit is in :mod:`tests.fault.test_live_schedules_faults`.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.testing._harness import sleep_until, wait_until
from tests.acceptance.cluster import summary, utc
from tests.acceptance.live import LiveCluster, check
from tests.acceptance.proj_live import TASK

pytestmark = [pytest.mark.acceptance]
# a module cluster of 3 real beats and a worker, with bounds of a few seconds
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("acceptance-live")]

#: a loaded 2-core machine: the first run may come a little after its slot
SLACK = 1.5


#: one xdist group per backend: the two clusters run side by side on two workers
BACKENDS = [pytest.param(name, marks=pytest.mark.xdist_group(f"live-{name}"))
            for name in ("postgres", "mysql")]


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            pg_dsn: str, redis_url: str) -> Iterator[LiveCluster]:
    claims = request.getfixturevalue("mysql_dsn") if request.param == "mysql" else pg_dsn
    c = LiveCluster(tmp_path_factory.mktemp(f"live-{request.param}"), pg_dsn=pg_dsn,
                    broker_url=redis_url, claims_dsn=claims)
    c.backend = request.param  # type: ignore[attr-defined]
    try:
        c.start()
        yield c
    except BaseException:
        print(c.tails())
        raise
    finally:
        c.close()


def _kwargs(name: str) -> str:
    return json.dumps({"entry": name})


def test_add_edit_remove_from_the_cli(cluster: LiveCluster) -> None:
    c = cluster
    sleep_until(math.floor(time.time()) + 1.3)  # away from an even second
    done = c.cli("add", "tick", "--task", TASK, "--cron", "*/2 * * * * *", "--kwargs-json",
                 _kwargs("tick"), "--reason", "acceptance")
    assert done.returncode == 0, done.stdout + done.stderr
    added = c.history("tick")[0].effective_at
    wait_until(lambda: c.runs("tick"), 2.0 + SLACK + 2, interval=0.1,
               message=lambda: f"a run of tick\n{c.tails()}")
    first = min(r.executed_at for r in c.runs("tick"))
    first_slot = utc(math.ceil(added.timestamp() / 2) * 2)
    time.sleep(6)
    sleep_until(math.floor(time.time()) + 1.5)
    done = c.cli("edit", "tick", "--cron", "*/3 * * * * *", "--revision", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    edited = c.history("tick")[-1].effective_at
    time.sleep(10)
    done = c.cli("remove", "tick")
    assert done.returncode == 0, done.stdout + done.stderr
    removed = c.history("tick")[-1].effective_at
    time.sleep(5)
    c.drain()
    verdict = check(c, "tick", added - timedelta(seconds=10), utc(time.time() - 1))
    claims = c.claims("tick")
    runs = Counter(r.task_id for r in c.runs("tick"))
    summary(c.workdir, f"add/edit/remove ({c.backend})",  # type: ignore[attr-defined]
            f"added {added:%H:%M:%S.%f}, first run {first:%H:%M:%S.%f} "
            f"({(first - added).total_seconds():.2f}s later), edited "
            f"{edited:%H:%M:%S.%f}, removed {removed:%H:%M:%S.%f}\n"
            f"claims: {[(f'{x.occurrence:%S}', x.revision) for x in claims]}\n"
            f"{verdict.line()}")
    assert verdict.problems == []
    assert (first - added).total_seconds() <= 2.0 + SLACK  # within 2 s of the add
    assert min(x.occurrence for x in claims) == first_slot  # the first slot at or after it
    assert all(n == 1 for n in runs.values())
    assert {x.occurrence.second % 2 for x in claims if x.occurrence < edited} == {0}
    assert {x.occurrence.second % 3 for x in claims if x.occurrence >= edited} == {0}
    assert not [x for x in claims if x.occurrence >= removed]  # nothing after the remove
    assert not [x for x in claims if edited <= x.occurrence < edited + timedelta(seconds=1)
                and x.occurrence.second % 3]  # the edit fired nothing by itself


def _kill_listener(c: LiveCluster, node: str) -> int:
    with psycopg.connect(c.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            # this run's node only: other runs (other tests) name their nodes alike
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
            "application_name = %s AND query LIKE %s",
            (f"celery-elarion-beat listen {node}", f"LISTEN %{c.claims_table}%")).fetchall()
    return len(rows)


def test_edits_near_due_instants_with_a_listener_killed(cluster: LiveCluster) -> None:
    """On PostgreSQL node-2's LISTEN connection is killed twice (it polls until it
    reconnects); MariaDB has none: every node polls the version."""
    c = cluster
    pg = c.backend == "postgres"  # type: ignore[attr-defined]
    name = "storm"
    schedules = ["*/4 * * * * *", "2-59/5 * * * * *"]
    live.add_entry(c.app, name, TASK, {"cron": schedules[0]}, args=[0],
                   kwargs={"entry": name}, reason="storm")
    start = c.history(name)[0].effective_at
    killed = _kill_listener(c, "node-2") if pg else 0
    offsets = [-2.0, -1.0, -0.3, -0.05, 0.0, 0.05, 0.3, 1.0, 2.0, -1.5, 0.15, 1.5]
    done = []
    current, enabled, step = 0, True, 0
    for i, offset in enumerate(offsets):
        if i == 6 and pg:
            killed += _kill_listener(c, "node-2")  # and again, mid-way
        now = time.time()
        period = 4 if current == 0 else 5
        phase = 0 if current == 0 else 2
        due = math.floor((now - phase) / period) * period + phase
        # the next due instant this edit reaches with the last one 1.5 s behind it
        while due + offset < now + 1.5:
            due += period
        sleep_until(due + offset)
        kind = ["args", "time", "disable", "enable", "recreate", "args"][step % 6]
        step += 1
        if kind == "args":
            live.edit_entry(c.app, name, args=[i], reason=f"args at {offset:+}")
        elif kind == "time":
            current = 1 - current
            live.edit_entry(c.app, name, schedule={"cron": schedules[current]},
                            reason=f"time at {offset:+}")
        elif kind == "disable":
            live.disable_entry(c.app, name, reason=f"disable at {offset:+}")
            enabled = False
        elif kind == "enable":
            live.enable_entry(c.app, name, reason=f"enable at {offset:+}")
            enabled = True
        else:
            live.remove_entry(c.app, name, reason=f"delete at {offset:+}")
            live.add_entry(c.app, name, TASK, {"cron": schedules[current]}, args=[i],
                           kwargs={"entry": name}, reason=f"recreate at {offset:+}")
        done.append((kind, offset))
    assert enabled
    time.sleep(6)
    end = utc(time.time() - 1)
    c.drain()
    verdict = check(c, name, start, end)
    summary(c.workdir, f"edits near due instants ({c.backend})",  # type: ignore[attr-defined]
            f"{len(done)} edits {done}; LISTEN backends of node-2 killed: {killed}\n"
            f"{verdict.line()}")
    assert killed >= 1 or not pg
    # not a vacuous run: 12 edits about one period apart, less the two stretches the entry
    # is disabled for, leave 9 to 14 slots (a CI run on a quiet machine saw 9)
    assert len(verdict.expected) >= 8
    assert verdict.problems == []


def test_a_raw_sql_update_is_followed(cluster: LiveCluster) -> None:
    c = cluster
    name = "raw"
    live.add_entry(c.app, name, TASK, {"cron": "*/2 * * * * *"}, kwargs={"entry": name})
    start = c.history(name)[0].effective_at
    time.sleep(4)
    sleep_until(math.floor(time.time()) + 1.5)
    table = c.store._quoted(c.store.entries)  # type: ignore[attr-defined]
    key: object = name.encode() if c.backend == "mysql" else name  # type: ignore[attr-defined]
    engine = c.store.engine  # type: ignore[attr-defined]
    from sqlalchemy import text
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {table} SET schedule = :s WHERE name = :n"),
                     {"s": '{"cron": "*/3 * * * * *"}', "n": key})
    rev = c.history(name)[-1]
    assert rev.actor.startswith("sql:") and rev.action == "edit"
    time.sleep(8)
    end = utc(time.time() - 1)
    c.drain()
    verdict = check(c, name, start, end)
    summary(c.workdir, f"raw SQL ({c.backend})",  # type: ignore[attr-defined]
            f"raw update at {rev.effective_at:%H:%M:%S.%f} by {rev.actor}\n{verdict.line()}")
    assert verdict.problems == []
    assert any(slot >= rev.effective_at for slot in verdict.expected)
    live.remove_entry(c.app, name)
