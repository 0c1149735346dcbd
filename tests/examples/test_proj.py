"""examples/proj: the example project's schedule claims and sends as documented.

The project is imported as a user's project is (``examples/proj`` on the path,
``import proj``) and two ClaimingSchedulers tick in one process as two nodes
against PostgreSQL (``proj_tick.py``, run in a fresh interpreter so the project's
tasks do not leak into other tests' apps): node-1 wins every cluster occurrence
and sends it, node-2 skips them as claimed elsewhere, and both send the
every-node entry to their own node queue.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_elarion_beat.testing._harness import clean_env

HERE = Path(__file__).resolve().parent
CLUSTER_JOBS = {"nightly-report", "sync-orders", "poll-partner-api"}


@pytest.fixture
def ticked(pg_dsn: str, table_name: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(HERE / "proj_tick.py"), pg_dsn, table_name],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_schedule_uses_every_kind_of_entry(ticked: dict[str, Any]) -> None:
    schedule = ticked["schedule"]
    assert {name: s["type"] for name, s in schedule.items()} == {
        "nightly-report": "crontab", "sync-orders": "cron", "poll-partner-api": "timedelta",
        "refresh-local-cache": "timedelta"}
    assert schedule["refresh-local-cache"]["options"] == {"placement": "every_node"}
    assert {s["task"] for s in schedule.values()} == set(ticked["tasks"])
    assert ticked["timezone"] == "Europe/Berlin"


def test_one_real_tick_on_two_nodes_against_postgresql(ticked: dict[str, Any]) -> None:
    first = {r["job"]: r for r in ticked["node-1"]}
    assert set(first) == CLUSTER_JOBS | {"refresh-local-cache"}
    assert all(r["outcome"] == "dispatched" for r in first.values()), first
    assert first["nightly-report"]["kind"] == "slot"
    assert first["poll-partner-api"]["kind"] == "window"

    claims = {c["job"]: c for c in ticked["claims"] if c["job"] != "elarion.purge"}
    assert set(claims) == CLUSTER_JOBS
    assert {c["node"] for c in claims.values()} == {"node-1"}
    # 03:00 Europe/Berlin is 01:00 or 02:00 UTC, depending on the season
    assert claims["nightly-report"]["occurrence"][11:] in ("01:00:00+00:00", "02:00:00+00:00")

    second = {r["job"]: r for r in ticked["node-2"]}
    for job in CLUSTER_JOBS:
        assert second[job]["outcome"] == "skipped", second
        assert (second[job]["reason"], second[job]["winner"]) == ("claimed-elsewhere", "node-1")
    assert second["refresh-local-cache"]["outcome"] == "dispatched"

    shared = ticked["shared_queue"]
    assert sorted(m["elarion_job"] for m in shared) == sorted(CLUSTER_JOBS)
    assert {m["elarion_node"] for m in shared} == {"node-1"}
    report = next(m for m in shared if m["elarion_job"] == "nightly-report")
    assert report["task"] == "proj.tasks.nightly_report"
    assert report["elarion_occurrence"] == claims["nightly-report"]["occurrence"][:19] + "Z"
    for node, messages in ticked["node_queues"].items():
        assert [(m["elarion_job"], m["elarion_node"]) for m in messages] == [
            ("refresh-local-cache", node)]
