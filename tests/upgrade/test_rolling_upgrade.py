"""A rolling upgrade from 0.2, with a REAL beat of 0.2 (:mod:`.old_release`) beside one
of this version on one claims table, then ``init-db``.

The acceptance app (:mod:`tests.acceptance.proj`: a slot every 2 s, an interval of
2 s, a minutely crontab) runs one worker; a beat of 0.2 (``old-1``) makes the tables
and claims; a beat of this version (``new-1``) joins: it adds the cluster column
(the old node's rows take its default) and keeps the keys of 0.2, so

* no slot runs twice and none is missed, no interval runs twice within its window
  (the two versions take the same window lock);
* the old node keeps claiming (never a ``claim-error``) until it stops;
* ``init-db`` refuses while the old node heartbeats, naming it; once it is gone
  ``init-db`` swaps the keys, and the new node claims on through the swap;
* the rows the old node wrote are in the app's cluster.

Marked ``slow`` (CI's second step): about a minute of real processes.
"""

from __future__ import annotations

import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

from celery_elarion_beat.testing._harness import ChildProcess, read_claims, wait_until
from tests.acceptance.cluster import (
    APP,
    CRON_JOB,
    INTERVAL_JOB,
    MIN_INTERVAL_GAP,
    START_TIMEOUT,
    Cluster,
)
from tests.upgrade.old_release import old_env

pytestmark = [pytest.mark.slow, pytest.mark.acceptance, pytest.mark.postgres]

CLUSTER = "elarion_acceptance"  # the app's main name: no cluster is set
QUICK = {"ELARION_BEAT_HEARTBEAT_INTERVAL": "1", "ELARION_BEAT_NODE_TIMEOUT": "3",
         "ELARION_BEAT_LOG_FORMAT": "json", "ELARION_BEAT_CLUSTER": ""}
TOGETHER = 10.0  # seconds both versions claim side by side
AFTER = 6.0      # seconds the new node claims after the swap


def _slots(runs: list, start: float, end: float) -> list[float]:
    return sorted(datetime.strptime(r.occurrence, "%Y-%m-%dT%H:%M:%SZ")
                  .replace(tzinfo=timezone.utc).timestamp()
                  for r in runs if r.entry == CRON_JOB and r.occurrence
                  and start < datetime.strptime(r.occurrence, "%Y-%m-%dT%H:%M:%SZ")
                  .replace(tzinfo=timezone.utc).timestamp() < end)


def _keys(pg_dsn: str, table: str) -> list[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                           "WHERE conrelid = to_regclass(%s) AND contype = 'p'",
                           (table,)).fetchone()
        assert row is not None
        return [c.strip() for c in str(row[0]).split("(", 1)[1].rstrip(")").split(",")]


def test_a_beat_of_0_2_and_one_of_this_version_share_a_table_until_init_db(
        tmp_path: Path, pg_dsn: str, redis_url: str) -> None:
    workdir = tmp_path / "procs"
    workdir.mkdir()
    cluster = Cluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, beats=0)
    env = {**cluster.env, **QUICK}
    try:
        cluster.prepare()
        cluster.worker = cluster.pm.worker("worker", env=QUICK)
        cluster.worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        old = ChildProcess(
            "beat-old-1", [sys.executable, "-m", "celery", "-A", APP, "beat", "-S",
                           "celery_elarion_beat.ClaimingScheduler", "-l", "INFO"],
            old_env({**env, "ELARION_ACC_NODE": "old-1"}), workdir / "beat-old-1.log",
            workdir / "beat-old-1")
        cluster.pm.processes.append(old.start())
        old.wait_for_record({"action": "dispatched"}, START_TIMEOUT)
        assert "cluster" not in old.records(action="started")[0]["message"]  # it is 0.2
        new = cluster.pm.beat("beat-new-1", env={**QUICK, "ELARION_ACC_NODE": "new-1"})
        new.wait_for_record({"action": "legacy-table"}, START_TIMEOUT)
        new.wait_for_record({"action": "dispatched"}, START_TIMEOUT)
        together = time.time()
        wait_until(lambda: time.time() > together + TOGETHER and any(
            r.entry == CRON_JOB and r.node == "new-1" for r in cluster.runs()), 60)

        def init_db(name: str) -> ChildProcess:
            cli = cluster.pm.celery(name, ["elarion-beat", "init-db"], env=QUICK)
            assert cli.wait(START_TIMEOUT) is not None, cli.tail()
            return cli

        refused = init_db("init-db-refused")
        assert refused.returncode == 1 and "old-1" in refused.log(), refused.tail()
        assert _keys(pg_dsn, cluster.claims_table) == ["job_name", "occurrence_utc"]
        old_claims = [r for r in old.records() if r.get("action") in ("dispatched", "skipped")
                      and r.get("reason") != "claim-error"]
        old.terminate()
        stopped = time.time()
        # the old node counts as dead after elarion_beat_node_timeout: then init-db swaps
        upgraded: list[ChildProcess] = []

        def swapped() -> bool:
            cli = init_db(f"init-db-{len(upgraded)}")
            upgraded.append(cli)
            return cli.returncode == 0

        wait_until(swapped, 60, interval=1.0, message=lambda: upgraded[-1].tail())
        swap = time.time()
        assert "upgraded the keys of" in upgraded[-1].log(), upgraded[-1].tail()
        assert _keys(pg_dsn, cluster.claims_table) == ["cluster", "job_name", "occurrence_utc"]
        wait_until(lambda: any(r.entry == CRON_JOB and r.occurrence and datetime.strptime(
            r.occurrence, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
            > swap + AFTER for r in cluster.runs()), 60, message=cluster.tails)
        end = swap + AFTER
        new.terminate()
        cluster.drain(end)
        runs = cluster.runs()
        claims = read_claims(pg_dsn, cluster.claims_table)
        new_records = new.records()
        old_records = old.records()
    finally:
        cluster.close()

    # no slot ran twice, none was missed: side by side, through the stop and the swap
    ran = _slots(runs, together, end)
    assert len(ran) == len(set(ran)), f"a slot ran twice: {ran}"
    wanted = [float(t) for t in range(math.floor(together) + 1, math.ceil(end))
              if t % 2 == 0]  # as _slots counts: together < slot < end
    assert ran == wanted, (sorted(set(wanted) - set(ran)), ran)
    # an interval never ran twice within its window: both versions took one lock
    polls = sorted(r.executed_at.timestamp() for r in runs if r.entry == INTERVAL_JOB
                   and together <= r.executed_at.timestamp() <= end)
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    assert polls and min(gaps) >= MIN_INTERVAL_GAP.total_seconds() - 0.3, gaps
    # the old node claimed beside the new one, never failing a claim, until it stopped
    assert [r for r in old_claims if r["ts"] > datetime.fromtimestamp(
        together, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")], "the old node stopped claiming"
    assert not [r for r in old_records if r.get("reason") == "claim-error"], old_records[-5:]
    assert not [r for r in new_records if r.get("reason") == "claim-error"], new_records[-5:]
    assert any(r.node == "old-1" for r in runs if r.entry == CRON_JOB)
    # every row is in the app's cluster, the old node's included
    assert {c.cluster for c in claims} == {CLUSTER}
    assert any(c.node == "old-1" for c in claims) and stopped < swap
