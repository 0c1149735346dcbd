"""A beat whose broker (and so its event channel) is unreachable keeps claiming, and
drops its events instead of buffering them.

A real beat talks to Redis through a TCP proxy; the test cuts the proxy. Beat writes
its EventSender counters, the dispatcher's outbound buffer and its RSS to a stats file
(tests/flower/app.py), which the test reads.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.flower.app import JOBS
from tests.flower.support import delete_broker_keys, drop_tables, read_claims
from tests.helpers.processes import ProcessManager, wait_until
from tests.helpers.tcpproxy import TcpProxy

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]

OUTAGE = 12.0
RSS_GROWTH_LIMIT_KB = 16 * 1024


def _stats(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return {}


@pytest.mark.fault
def test_beat_keeps_claiming_and_drops_events_while_the_broker_is_down(
        tmp_path: Path, pg_dsn: str, redis_url: str) -> None:
    run = uuid.uuid4().hex[:10]
    table = f"fl_{run}_claims"
    stats_file = tmp_path / "beat-stats.json"
    target = urlparse(redis_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    broker = f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}"
    env = {"ELARION_FL_BROKER": broker, "ELARION_FL_RUN": run, "ELARION_FL_DSN": pg_dsn,
           "ELARION_FL_TABLE": table, "ELARION_FL_STATS": str(stats_file),
           "ELARION_BEAT_LOG_FORMAT": "json"}
    try:
        with ProcessManager(tmp_path / "procs", "tests.flower.app", env) as pm:
            beat = pm.beat("beat-down", env={"ELARION_FL_NODE": "down-1"})
            beat.wait_for_record({"action": "started"}, 90)
            wait_until(lambda: (_stats(stats_file).get("sent") or 0) >= 2, 30,
                       message=lambda: f"events to go out before the cut\n{beat.tail()}")

            proxy.cut()
            wait_until(lambda: (_stats(stats_file).get("dropped") or 0) >= 1, 30,
                       message=lambda: f"the first dropped event\n{beat.tail()}")
            before, claims_before = _stats(stats_file), len(read_claims(pg_dsn, table, JOBS))
            time.sleep(OUTAGE)
            after, claims_after = _stats(stats_file), len(read_claims(pg_dsn, table, JOBS))

            assert beat.alive(), beat.tail()
            assert after["ts"] > time.time() - 5, "beat's stats thread stopped"
            # it keeps ticking: 2 jobs due every 2 s, each claimed in PostgreSQL
            assert claims_after - claims_before >= 5, (claims_before, claims_after, beat.tail())
            # ... and drops every event instead of keeping it
            assert after["dropped"] - before["dropped"] >= 5, (before, after)
            assert after["sent"] == before["sent"], (before, after)
            assert after["outbound_buffer"] == 0, after
            assert after["rss_kb"] - before["rss_kb"] < RSS_GROWTH_LIMIT_KB, (before, after)
            assert beat.records(action="events-dropped"), beat.tail()
            # the won claims could not be published either (at-most-once): publish-error
            assert beat.records(action="publish-error"), beat.tail()
            proxy.restore()
    finally:
        proxy.stop()
        drop_tables(pg_dsn, table, f"fl_{run}_nodes")
        delete_broker_keys(redis_url, run)
