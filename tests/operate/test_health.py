"""``celery -A proj elarion-beat health``: the probe, run as real ``celery`` processes
against the real PostgreSQL.

Exit 0 for a node whose heartbeat is recent (on the database clock), 1 for an old
heartbeat, a node never seen, and an unreachable database (within seconds: the probe
never hangs); ``--unreachable-ok`` turns only the last into 0 (a liveness probe).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import NodeState
from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager
from tests.helpers.ports import free_port
from tests.operate.support import settings_for

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]

APP = "tests.operate.proj_startup"
TIMEOUT = 120.0


@pytest.fixture
def pm(tmp_path: Path, redis_url: str) -> Iterator[ProcessManager]:
    manager = ProcessManager(tmp_path / "procs", APP, {"ELARION_STARTUP_BROKER": redis_url})
    try:
        yield manager
    finally:
        manager.stop_all()



def probe(pm: ProcessManager, name: str, dsn: str, table: str, *args: str,
          node: str | None = None) -> ChildProcess:
    env = {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": table}
    if node:
        env["ELARION_BEAT_NODE"] = node  # the default of --node
    return pm.celery(name, ["elarion-beat", "health", *args], env=env)


def finished(process: ChildProcess) -> tuple[int | None, list[str]]:
    code = process.wait(TIMEOUT)
    return code, [line for line in process.log().splitlines() if line.strip()]


def test_health_exits_0_for_a_recent_heartbeat_and_1_for_an_old_or_missing_one(
        pm: ProcessManager, pg_dsn: str, table_name: str) -> None:
    settings = settings_for(pg_dsn, table_name)
    store = PostgresClaimStore(settings)
    try:
        store.ensure_schema()
        for node in ("fresh", "stale"):
            store.heartbeat(NodeState(node=node, boot_id="b", version="1", fingerprint="f"))
    finally:
        store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # ten minutes ago, database clock
        conn.execute(f"UPDATE {settings.qualified_nodes_table} "
                     "SET last_seen = now() - interval '10 minutes' WHERE node = 'stale'")
    runs = {
        "fresh": probe(pm, "fresh", pg_dsn, table_name, node="fresh"),
        "fresh-json": probe(pm, "fresh-json", pg_dsn, table_name, "--node", "fresh", "--json"),
        "stale": probe(pm, "stale", pg_dsn, table_name, "--node", "stale"),
        "stale-long": probe(pm, "stale-long", pg_dsn, table_name, "--node", "stale",
                            "--max-age", "15m"),
        "never": probe(pm, "never", pg_dsn, table_name, "--node", "never-seen"),
    }
    code, lines = finished(runs["fresh"])
    assert code == 0 and len(lines) == 1, lines
    assert lines[0].startswith("healthy: node fresh's last heartbeat is "), lines
    assert "within 2m (on the database clock)" in lines[0]

    code, lines = finished(runs["fresh-json"])
    report = json.loads(lines[0])
    assert code == 0 and report["healthy"] is True and report["node"] == "fresh"
    assert 0 <= report["age"] < 60 and report["max_age"] == 120.0

    code, lines = finished(runs["stale"])
    assert code == 1 and len(lines) == 1, lines
    assert re.match(r"unhealthy: node stale's last heartbeat is 10m(\d+s)? old", lines[0]), lines
    assert "older than 2m" in lines[0]

    code, lines = finished(runs["stale-long"])
    assert code == 0, lines  # ten minutes is within --max-age 15m

    code, lines = finished(runs["never"])
    assert code == 1 and lines == [f"unhealthy: node never-seen has sent no heartbeat (nodes "
                                   f"table {settings.qualified_nodes_table})"], lines


def test_health_of_an_unreachable_database_exits_1_within_seconds(
        pm: ProcessManager, pg_dsn: str, table_name: str) -> None:
    """Nothing listens on the port: exit 1 with one line, quickly; ``--unreachable-ok``
    exits 0. A database that refuses the node (no such database) is no outage: 1 even
    with ``--unreachable-ok``."""
    down = make_url(pg_dsn).set(port=free_port()).render_as_string(hide_password=False)
    missing = make_url(pg_dsn).set(database="elarion_no_such_db").render_as_string(
        hide_password=False)
    started = time.monotonic()
    runs = {
        "down": probe(pm, "down", down, table_name, "--node", "n"),
        "down-ok": probe(pm, "down-ok", down, table_name, "--node", "n", "--unreachable-ok"),
        "refused-ok": probe(pm, "refused-ok", missing, table_name, "--node", "n",
                            "--unreachable-ok"),
    }
    code, lines = finished(runs["down"])
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("unhealthy: cannot read the heartbeat of node n: the claims "
                               "database postgresql+psycopg://"), lines
    assert "Connection refused" in lines[0]
    code, lines = finished(runs["down-ok"])
    assert code == 0 and lines[0].startswith("ok: cannot read the heartbeat"), lines
    code, lines = finished(runs["refused-ok"])
    assert code == 1 and 'database "elarion_no_such_db" does not exist' in lines[0], lines
    # bounded by the connect timeout, not by a TCP retry: generous for a loaded machine
    assert time.monotonic() - started < TIMEOUT
