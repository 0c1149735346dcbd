"""The soak script (benchmarks/soak.py) in small: 60 s, one kill -9, one cut of the
beats' database connections, and its verdict.

What it proves: on real beats, a real worker, Redis and PostgreSQL, a beat killed
with ``kill -9`` and every beat's claims connection terminated leave no slot run
twice and no miss the at-most-once rule does not explain (the script classifies
every miss from the ledger and the beats' log records, and exits 1 otherwise).
The test also checks that the faults really happened (one kill, with the node
back and claiming; one connection cut after which every beat that was cut has a
new backend and claims again), so it cannot pass on a quiet run, and that the script
cleaned up its tables.

Marked ``fault`` and ``acceptance``: CI's fault step runs it, the default run does
not. About 1.5-2 minutes with start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from benchmarks.common import PG_DSN

#: pytest-timeout's default (300 s) is too short for a loaded CI machine: 60 s of soak plus
#: start-up, drain and analysis
pytestmark = [pytest.mark.fault, pytest.mark.acceptance, pytest.mark.timeout(600)]
# 60 s of three beats, two workers, kill -9 and cut connections: it loads both cores, and a miss
# caused by load fails its verdict
pytestmark += [pytest.mark.alone, pytest.mark.xdist_group("elbench")]

ROOT = Path(__file__).resolve().parents[1]
#: 60 s of soak; start-up, drain and analysis come on top (generous: a loaded machine
#: may take a minute to start a celery process)
TIMEOUT = 540


def test_soak_smoke_verdict(tmp_path: Path) -> None:
    # one kill -9 near 30 s and one connection cut near 35 s (none in the last 20 s)
    cmd = [sys.executable, "-m", "benchmarks.soak", "--minutes", "1", "--entries", "60",
           "--kill-every", "30", "--db-kill-every", "20", "--seed", "3", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = proc.stdout + proc.stderr
    results = list(tmp_path.glob("soak-*.json"))
    assert len(results) == 1, f"no result written (rc {proc.returncode})\n{output[-6000:]}"
    result = json.loads(results[0].read_text())

    # the faults happened and were observed
    assert result["kills"] == 1, output[-4000:]
    assert result["kill_log"][0]["ready_at"] is not None, "the killed beat never claimed again"
    assert result["db_kills"] == 1
    cut = result["db_kill_log"][0]
    assert cut["backends"] >= 1, "no backend of the beats was terminated"
    # every node cut got a new backend and claimed again (the claim retries once on a
    # fresh connection, so a cut between two claims costs no skip at all)
    assert cut["reconnected"] == cut["nodes"], cut
    assert all(s is not None for s in cut["claimed_after_s"].values()), cut
    # the run checked something: about a slot a second of the minute (50 on a loaded CI
    # machine, whose slower start-up shortens the window that is checked)
    assert result["counts"]["slots"] >= 40 and result["counts"]["windows"] > 20, \
        result["counts"]

    # the verdict: no duplicate, every miss explained
    assert result["duplicates"] == 0, result["duplicate_log"]
    assert result["unexplained"] == [], result["unexplained"]
    assert result["verdict"] == "pass" and proc.returncode == 0, output[-4000:]

    # it cleaned up after itself
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        left = conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
                            (f"elbench_soak_{result['run_id']}%",)).fetchall()
    assert left == []
