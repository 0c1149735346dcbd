"""``celery -A proj elarion-beat preview`` as a real subprocess: across the Berlin spring
forward of 2026-03-29, with two live nodes in a real PostgreSQL nodes table, and with the
database unreachable (the schedule is still shown, exit 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import NodeState
from tests.operate.support import invoke

ROOT = Path(__file__).parents[2]
APP = "tests.operate.proj_preview"
WEEKEND = ("--from", "2026-03-28T12:00Z", "--hours", "48", "--tz", "Europe/Berlin")
FIELDS = {"job", "task", "utc", "local", "zone", "offset", "dst_mark", "kind", "placement",
          "nodes", "paused", "window", "anchor"}


def preview(dsn: str, table: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ELARION_PREVIEW_DSN": dsn, "ELARION_PREVIEW_TABLE": table,
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "celery", "-A", APP, "elarion-beat",
                           "preview", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def lines_of(out: str, *words: str) -> list[str]:
    return [line for line in out.splitlines() if all(word in line for word in words)]


@pytest.mark.postgres
def test_preview_shows_the_dst_jump_and_the_live_nodes_of_every_node_entries(
        pg_dsn: str, table_name: str, store: PostgresClaimStore) -> None:
    for node in ("node-b", "node-a"):
        store.heartbeat(NodeState(node=node, boot_id=f"boot-{node}", version="test",
                                  fingerprint="f", host="vm", pid=1))
    store.pause("ny-export", "tester", "partner holiday")

    done = preview(pg_dsn, table_name, *WEEKEND)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "live nodes: node-a, node-b" in out
    assert lines_of(out, "Sun 2026-03-29",
                    "[Europe/Berlin: clocks 02:00 CET -> 03:00 CEST (+1h) at 2026-03-29 01:00:00Z]")
    (jump,) = lines_of(out, "nightly-report", "2026-03-29 01:00:00Z")
    assert "03:00:00 CEST" in jump and "DST +1h (CET->CEST)" in jump
    assert "02:30 does not exist: Celery sends it once, at 03:30 CEST (01:30Z)" in jump
    cache = lines_of(out, "refresh-cache", "every_node")
    assert len(cache) == 4 and all("node-a, node-b" in line for line in cache), out
    assert all("PAUSED" in line for line in lines_of(out, "ny-export", "slot")), out
    assert lines_of(out, "broken", "not a schedule")

    done = preview(pg_dsn, table_name, *WEEKEND, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["nodes"] == ["node-a", "node-b"] and doc["nodes_error"] is None
    assert all(set(occ) == FIELDS for occ in doc["occurrences"])
    (nightly,) = [o for o in doc["occurrences"]
                  if o["job"] == "nightly-report" and o["utc"] == "2026-03-29T01:00:00Z"]
    assert nightly["local"] == "2026-03-29T03:00:00+02:00" and nightly["offset"] == "+02:00"
    assert nightly["dst_mark"].startswith("DST +1h (CET->CEST)")
    assert (nightly["kind"], nightly["placement"], nightly["nodes"]) == ("slot", "cluster", None)
    cache_rows = [o for o in doc["occurrences"] if o["job"] == "refresh-cache"]
    assert [o["nodes"] for o in cache_rows] == [["node-a", "node-b"]] * 4
    assert {o["kind"] for o in cache_rows} == {"none"}
    polls = [o for o in doc["occurrences"] if o["job"] == "poll-partner"]
    assert polls and {o["window"] for o in polls} == {21599.0}
    assert polls[0]["anchor"].startswith("cluster anchor: no claim yet")
    paused = [o["paused"] for o in doc["occurrences"] if o["job"] == "ny-export"]
    assert paused and all(p["reason"] == "partner holiday" for p in paused)
    assert doc["invalid"] == [{"job": "broken", "reason": doc["invalid"][0]["reason"]}]


def test_with_the_database_unreachable_the_schedule_is_shown_and_nodes_unknown() -> None:
    done = preview("postgresql://beat:s3cret@127.0.0.1:1/test", "preview_claims", *WEEKEND)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    (unknown,) = lines_of(out, "node list unknown")
    assert "unreachable" in unknown and "s3cret" not in out + done.stderr
    (jump,) = lines_of(out, "nightly-report", "2026-03-29 01:00:00Z")
    assert "DST +1h (CET->CEST)" in jump
    cache = lines_of(out, "refresh-cache", "every_node")
    assert len(cache) == 4 and all("each live node (unknown)" in line for line in cache)

    done = preview("postgresql://beat:s3cret@127.0.0.1:1/test", "preview_claims", *WEEKEND,
                   "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["nodes"] is None and "unreachable" in doc["nodes_error"]
    polls = [o for o in doc["occurrences"] if o["job"] == "poll-partner"]
    assert polls[0]["anchor"].startswith("cluster anchor: newest claim unknown")


def test_strict_fails_on_an_invalid_entry_and_job_picks_entries() -> None:
    code, out = invoke("preview", *WEEKEND, app=APP)
    assert code == 0 and "INVALID" in out, out
    code, out = invoke("preview", *WEEKEND, "--strict", app=APP)
    assert code == 1 and "broken: its 'schedule' is 'every day'" in out, out
    code, out = invoke("preview", *WEEKEND, "--job", "nightly-report", "--strict", app=APP)
    assert code == 0, out
    rows = lines_of(out, "Z  ")  # the rows: a UTC time, then the job
    assert len(rows) == 2 and {line.split()[5] for line in rows} == {"nightly-report"}, out
    code, out = invoke("preview", *WEEKEND, "--job", "nightly", app=APP)
    assert code == 2 and "no beat_schedule entry named 'nightly'" in out, out
