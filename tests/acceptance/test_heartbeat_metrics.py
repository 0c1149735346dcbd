"""Acceptance: a real ``celery beat`` keeps its node's liveness and skew gauges fresh
through the exporter's event listener, a clean stop (SIGTERM) removes them at once, and
a ``kill -9`` leaves them standing still, which is what ``ElarionBeatNodeSilent``
(examples/prometheus/alerts.yml) fires on.

The gauges are read from a prometheus_client registry of the test's own, fed by the
exporter's :class:`~celery_elarion_beat.exporter.EventListener` on the run's event
exchange (Redis), as ``celery elarion-beat exporter`` feeds its ``/metrics``.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from celery_elarion_beat.observe.exporter import EventListener
from celery_elarion_beat.observe.metrics import OccurrenceCounters
from celery_elarion_beat.testing._harness import ProcessManager, wait_until
from tests.acceptance import proj_heartbeat
from tests.flower.support import delete_broker_keys

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# real beats and an exporter; skew measured within 1 s
pytestmark += [pytest.mark.heavy]

APP = "tests.acceptance.proj_heartbeat"
START_TIMEOUT = 90.0
SEEN = "elarion_beat_node_last_seen_timestamp_seconds"
SKEW = "elarion_beat_clock_skew_seconds"


def gauge(registry: CollectorRegistry, name: str) -> dict[str, float]:
    return {s.labels["node"]: s.value for m in registry.collect() for s in m.samples
            if s.name == name}


def test_heartbeats_keep_the_gauges_fresh_and_a_clean_stop_removes_them(
        tmp_path: Path, pg_dsn: str, redis_url: str, table_name: str) -> None:
    run = uuid.uuid4().hex[:10]
    stopped, killed = f"hb-term-{run}", f"hb-kill-{run}"
    env = {"ELARION_ACC_BROKER": redis_url, "ELARION_ACC_RUN": run,
           "ELARION_ACC_CLAIMS_DSN": pg_dsn, "ELARION_ACC_CLAIMS_TABLE": table_name}
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry)
    app = proj_heartbeat.make_app(env)
    listener = EventListener(app, counters.observe)
    thread = threading.Thread(target=listener.run, daemon=True, name="hb-listener")
    thread.start()
    pm = ProcessManager(tmp_path / "procs", APP, env)
    try:
        assert listener.ready.wait(30), "the event listener did not start"
        term = pm.beat("beat-term", env={"ELARION_ACC_NODE": stopped})
        kill = pm.beat("beat-kill", env={"ELARION_ACC_NODE": killed})

        def both_seen() -> dict[str, float] | None:
            seen = gauge(registry, SEEN)
            return seen if {stopped, killed} <= set(seen) else None

        first = wait_until(both_seen, START_TIMEOUT, interval=0.5,
                           message=lambda: f"no heartbeat of both nodes\n{pm.tails()}")
        # heartbeats move the gauge on, one per second; the skew was measured (same host)
        def moved_on() -> dict[str, float] | None:
            seen = both_seen()
            return seen if seen and seen[stopped] > first[stopped] + 1.5 else None

        later = wait_until(moved_on, 30, interval=0.5, message=lambda: pm.tails())
        assert later[killed] > first[killed], (first, later)
        skews = gauge(registry, SKEW)
        assert {stopped, killed} <= set(skews) and abs(skews[stopped]) < 2.0, skews

        # a clean stop: its last heartbeat says so, and its gauges go
        assert term.terminate() == 0, term.tail()
        wait_until(lambda: stopped not in gauge(registry, SEEN), 20, interval=0.2,
                   message=lambda: f"{gauge(registry, SEEN)}\n{term.tail()}")
        assert stopped not in gauge(registry, SKEW)
        # kill -9: no last word; the gauge stays where the last event left it
        kill.kill9()
        assert kill.wait(10) is not None
        frozen = gauge(registry, SEEN)[killed]
        time.sleep(3 * proj_heartbeat.HEARTBEAT)
        assert gauge(registry, SEEN)[killed] == frozen
        assert time.time() - frozen >= 3 * proj_heartbeat.HEARTBEAT
        # the counters of both nodes stay (their series expire after a day of silence)
        outcomes = {s.labels["node"] for m in registry.collect() for s in m.samples
                    if s.name == "elarion_beat_node_occurrences_total"}
        assert {stopped, killed} <= outcomes, outcomes
    finally:
        pm.stop_all()
        listener.stop()
        thread.join(10)
        app.close()
        delete_broker_keys(redis_url, run)
