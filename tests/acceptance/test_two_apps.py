"""Two apps, one database: claims never cross between applications (issue #31).

``Celery("svc_a")`` and ``Celery("svc_b")`` (:mod:`.proj_two_apps`): different tasks,
each an entry ``cleanup`` (a slot every 2 s) and ``poll`` (every 2 s, window claims),
both claiming in ONE claims table of one PostgreSQL database, as two services of a
team that share a database server. Two beats of each app, named alike in both apps
(``node-1``, ``node-2``: two services on the same two hosts), and one worker each.
Neither app sets ``elarion_beat_cluster``: each app's cluster is its main name.

Over about 12 s each app runs every one of its own ``cleanup`` slots, once, with its
own task, and its ``poll`` every 2 s; no beat names a node of the other app as a
winner, and no beat reports schedule drift (each compares only its own app's nodes).
Then ``elarion-beat pause --all`` of svc_a stops svc_a's entries and leaves svc_b's
running, and each app's ``status`` lists its own two nodes only.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
    stop_all,
    wait_until,
)
from tests.acceptance import proj_two_apps

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]

APPS = ("svc_a", "svc_b")
NODES = ("node-1", "node-2")
START_TIMEOUT = 120.0
OBSERVE = 12.0


def _runs(pg_dsn: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT app, entry, occurrence, node, task_id, executed_at "
                            "FROM {} ORDER BY id").format(sql.Identifier(table)))
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _even_slots(start: float, end: float) -> list[float]:
    """The slots of a 2 s cron strictly inside (start, end)."""
    return [float(t) for t in range(int(start), int(end) + 1) if t % 2 == 0 and start < t < end]


def test_two_apps_on_one_table_each_run_every_slot_of_their_own(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    run = uuid.uuid4().hex[:10]
    table, runs_table = f"two_claims_{run}", f"two_runs_{run}"
    env = {"ELARION_TWO_BROKER": redis_url, "ELARION_TWO_QUEUE": f"elarion-two-{run}",
           "ELARION_TWO_DSN": pg_dsn, "ELARION_TWO_TABLE": table,
           "ELARION_ACC_RUNS_DSN": pg_dsn, "ELARION_ACC_RUNS_TABLE": runs_table,
           # no pinned cluster: each app's is its main name
           "ELARION_BEAT_CLUSTER": ""}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(proj_two_apps.RUNS_TABLE_DDL).format(
            table=sql.Identifier(runs_table)))
    managers = {main: ProcessManager(workdir, f"tests.acceptance.proj_{main}", env)
                for main in APPS}
    beats: dict[tuple[str, str], ChildProcess] = {}

    def cleanups(main: str, after: float) -> list[dict[str, Any]]:
        return [r for r in _runs(pg_dsn, runs_table) if r["app"] == main
                and r["entry"] == "cleanup" and _when(r["occurrence"]) >= after]

    def tails() -> str:
        return "\n".join(pm.tails(20) for pm in managers.values())

    try:
        for main, pm in managers.items():
            pm.worker(f"worker-{main}").wait_for_log(r"\bready\.", START_TIMEOUT)
        for main, pm in managers.items():
            for node in NODES:
                beats[main, node] = pm.beat(f"beat-{main}-{node}",
                                            env={"ELARION_TWO_NODE": node})
        for beat in beats.values():
            beat.wait_for_record({"action": "started"}, START_TIMEOUT)
        for beat in beats.values():
            beat.wait_for_record({"action": "dispatched"}, START_TIMEOUT)
        start = time.time()
        end = start + OBSERVE
        # the slots up to the end of the window have run (or never will, for an app
        # that lost them): both apps ran a slot after it
        wait_until(lambda: cleanups("svc_a", end) and cleanups("svc_b", end), OBSERVE + 60,
                   message=tails)

        # svc_a pauses every job; svc_b goes on
        paused = managers["svc_a"].celery("pause-svc_a", ["elarion-beat", "pause", "--all",
                                                          "--reason", "two apps"])
        assert paused.wait(START_TIMEOUT) == 0, paused.tail()
        paused_at = time.time()
        wait_until(lambda: cleanups("svc_b", paused_at + 6), 60, message=tails)
        statuses = {}
        for main, pm in managers.items():
            status = pm.celery(f"status-{main}", ["elarion-beat", "status", "--json"])
            status.wait(START_TIMEOUT)
            out = status.log()
            statuses[main] = json.loads(out[out.index("{"):])
        stop_all(beats.values())

        def tracked() -> list[Any] | None:
            """The cleanup claims of the window, once each app's worker recorded its runs."""
            claims = [c for c in read_claims(pg_dsn, table) if c.job == "cleanup"
                      and start < c.occurrence.timestamp() < end]
            done = all(c.run_state == "succeeded" for c in claims)
            return claims if claims and done else None

        claims = wait_until(tracked, 30, message=tails)
        rows = _runs(pg_dsn, runs_table)
        logs = {key: beat.records() for key, beat in beats.items()}
    finally:
        for pm in managers.values():
            pm.stop_all()
        drop_tables(pg_dsn, runs_table, *claims_tables(table))

    # 1. every cleanup slot of each app ran once, with the app's own task
    for main in APPS:
        ran = sorted(_when(r["occurrence"]) for r in rows if r["app"] == main
                     and r["entry"] == "cleanup" and start < _when(r["occurrence"]) < end)
        assert ran == _even_slots(start, end), (main, ran, _even_slots(start, end))
    # ... and each slot has one claim row in each app's cluster, its run recorded there
    for main in APPS:
        mine = sorted(c.occurrence.timestamp() for c in claims if c.cluster == main)
        assert mine == _even_slots(start, end), (main, mine)
    assert {c.cluster for c in claims} == set(APPS)
    # 2. each app's poll ran every 2 s: the windows of one app never block the other's
    for main in APPS:
        polls = sorted(r["executed_at"].timestamp() for r in rows if r["app"] == main
                       and r["entry"] == "poll" and start <= r["executed_at"].timestamp() <= end)
        gaps = [b - a for a, b in zip(polls, polls[1:])]
        assert len(polls) >= OBSERVE / 2 - 1 and max(gaps) < 3.5, (main, polls, gaps)
    # 3. a beat lost claims only to a node of its own app, and saw no schedule drift
    for (main, node), records in logs.items():
        assert not [r for r in records if r.get("action") == "schedule-drift"], (main, node)
        sent_by_peer = {(r["job"], r["occurrence"]) for (m, n), peer in logs.items()
                        if m == main and n != node for r in peer
                        if r.get("action") == "dispatched"}
        lost = [(r["job"], r["occurrence"]) for r in records
                if r.get("action") == "skipped" and r.get("reason") == "claimed-elsewhere"
                and start < _when(r["occurrence"]) < end]
        assert set(lost) <= sent_by_peer, (main, node, sorted(set(lost) - sent_by_peer))
    # 4. after svc_a's pause --all, svc_a sent no cleanup; svc_b went on
    assert not [r for r in rows if r["app"] == "svc_a" and r["entry"] == "cleanup"
                and _when(r["occurrence"]) > paused_at + 2]
    assert [r for r in rows if r["app"] == "svc_b" and r["entry"] == "cleanup"
            and _when(r["occurrence"]) > paused_at + 2]
    # 5. each app's status names its cluster and lists its own two nodes, no drift
    for main, status in statuses.items():
        assert status.get("cluster") == main, status.get("cluster")
        assert sorted(n["node"] for n in status["nodes"]) == list(NODES), status["nodes"]
        assert "drift" not in status["findings"], status["drift"]
