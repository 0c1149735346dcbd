"""Each heartbeat sends ``elarion-heartbeat`` (the node is alive, and its clock skew); the
metrics turn it into ``elarion_beat_clock_skew_seconds{node}`` and
``elarion_beat_node_last_seen_timestamp_seconds{node}``, which a clean stop removes.

The broker is the one thing faked: a collector stands in for Celery's event dispatcher.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery.schedules import crontab
from prometheus_client import CollectorRegistry

from celery_elarion_beat import MemoryClaimStore, Settings, StoreError
from celery_elarion_beat.beat.maintenance import Maintenance
from celery_elarion_beat.observe.events import BATCH, HEARTBEAT, EventSender
from celery_elarion_beat.observe.metrics import OccurrenceCounters
from celery_elarion_beat.observe.outcome import Recorder
from tests.helpers.fakes import FakeClock, Wire, make_app, make_scheduler

T0 = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
SKEW = "elarion_beat_clock_skew_seconds"
SEEN = "elarion_beat_node_last_seen_timestamp_seconds"


class FailingStore(MemoryClaimStore):
    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("the database is away")


def wired(node: str) -> tuple[EventSender, Wire]:
    out = EventSender(make_app({}), node)
    wire = Wire()
    out._dispatcher = wire
    return out, wire


def heartbeats(out: EventSender, wire: Wire) -> list[dict[str, Any]]:
    assert out.flush()
    return [e for e in wire.sent if e["type"] == HEARTBEAT]


def test_each_heartbeat_sends_the_skew_it_measured_and_a_failed_one_still_says_alive() -> None:
    out, wire = wired("node-a")
    node_clock = FakeClock(T0 + timedelta(seconds=3.5))  # 3.5 s ahead of the database
    store = MemoryClaimStore(uuid.uuid4().hex, clock=FakeClock(T0))
    ticks = [0.0]
    settings = Settings.from_mapping({"elarion_beat_node": "node-a"})
    m = Maintenance(settings, store, Recorder(), node_clock, lambda: {}, events=out,
                    monotonic=lambda: ticks[0])
    m.run()
    (first,) = heartbeats(out, wire)
    assert first["node"] == "node-a" and first["skew"] == pytest.approx(3.5, abs=0.01)
    m.run()  # not due yet: no second event
    assert len(heartbeats(out, wire)) == 1
    failing = Maintenance(settings, FailingStore(uuid.uuid4().hex, clock=FakeClock(T0)),
                          Recorder(), node_clock, lambda: {}, events=out,
                          monotonic=lambda: ticks[0])
    failing.run()  # the database failed: alive all the same, no skew measured
    assert heartbeats(out, wire)[-1] == {"type": HEARTBEAT, "node": "node-a", "skew": None}
    m.stopping()
    assert heartbeats(out, wire)[-1] == {"type": HEARTBEAT, "node": "node-a", "skew": None,
                                         "stopping": True}


def heartbeat(node: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"type": HEARTBEAT, "hostname": f"beat@{node}", "node": node, "local_received": at,
            **fields}


def gauges(registry: CollectorRegistry, name: str) -> dict[str, float]:
    return {s.labels["node"]: s.value for metric in registry.collect() for s in metric.samples
            if s.name == name}


def test_heartbeats_become_a_skew_and_a_last_seen_gauge_per_node() -> None:
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry, stale_after=3600)
    counters.observe(heartbeat("a", 100.0, skew=-2.75))
    counters.observe(heartbeat("b", 130.0, skew=0.004))
    counters.observe(heartbeat("a", 160.0, skew=None))  # a failed heartbeat: skew kept
    for bad in ("3", True, float("nan"), float("inf")):
        counters.observe(heartbeat("b", 170.0, skew=bad))
    assert gauges(registry, SKEW) == {"a": -2.75, "b": 0.004}
    assert gauges(registry, SEEN) == {"a": 160.0, "b": 170.0}
    # heartbeats are neither occurrences nor drift
    assert not [s for m in registry.collect() for s in m.samples
                if s.name.startswith(("elarion_beat_occurrences", "elarion_beat_node_occ",
                                      "elarion_beat_drift"))]


def test_a_clean_stop_removes_the_nodes_gauges_and_a_restart_brings_them_back() -> None:
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry)
    counters.observe(heartbeat("a", 100.0, skew=1.0))
    counters.observe(heartbeat("b", 100.0, skew=0.5))
    counters.observe(heartbeat("a", 110.0, skew=None, stopping=True))
    assert gauges(registry, SEEN) == {"b": 100.0} and gauges(registry, SKEW) == {"b": 0.5}
    counters.observe(heartbeat("a", 200.0, skew=0.25))  # the same node name started again
    assert gauges(registry, SEEN) == {"a": 200.0, "b": 100.0}
    assert gauges(registry, SKEW) == {"a": 0.25, "b": 0.5}


def test_any_event_of_a_node_is_news_of_it_and_silent_nodes_expire() -> None:
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry, stale_after=3600)
    counters.observe(heartbeat("old", 0.0, skew=9.0))
    counters.observe({"type": BATCH, "node": "busy", "local_received": 50.0, "items": [
        {"type": "elarion-skipped", "job": "j", "reason": "claimed-elsewhere"}]})
    assert gauges(registry, SEEN) == {"old": 0.0, "busy": 50.0}
    counters.observe({"type": "elarion-run", "node": "old", "job": "j", "state": "succeeded",
                      "runtime": 1.0, "local_received": 3000.0})  # a worker's: not news
    assert gauges(registry, SEEN)["old"] == 0.0
    counters.observe(heartbeat("busy", 3700.0, skew=0.0))  # "old" silent for over an hour
    assert gauges(registry, SEEN) == {"busy": 3700.0}
    assert gauges(registry, SKEW) == {"busy": 0.0}


def test_a_scheduler_that_stops_sends_its_held_outcomes_then_its_last_heartbeat() -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    namespace = f"unit-{uuid.uuid4().hex}"
    app = make_app({"hourly": {"task": "tasks.work", "schedule": crontab(minute=0, nowfun=clock)}})
    winner, loser = (make_scheduler(app, clock, namespace, name) for name in ("node-a", "node-b"))
    wire = Wire()
    try:
        for node in (winner, loser):
            node.setup_schedule()
            assert node.events is not None
            node.events.flush()  # the start's heartbeat went (not on the wire)
        loser.events._dispatcher = wire  # type: ignore[union-attr]
        clock.advance(30.2)  # 03:00:00.2
        winner.tick()
        loser.tick()  # lost the slot: its skip is held for a few seconds
    finally:
        for node in (winner, loser):
            node.close()
        MemoryClaimStore.reset(namespace)
    kinds = [(e["type"], e.get("stopping")) for e in wire.sent]
    assert kinds[-2:] == [(BATCH, None), (HEARTBEAT, True)], kinds
    assert wire.sent[-2]["items"][0]["reason"] == "claimed-elsewhere"
