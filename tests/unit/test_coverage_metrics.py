"""``elarion_beat_every_node_missing{job,node}`` (#35): every-node accountability read
from the claims store (memory store, injected clocks), served from the last reading so a
scrape never waits for the database; unknown (no series) until read and while the store
fails; Flower registers it and binds it to the app of the events it receives."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_elarion_beat.exceptions import StoreUnavailable
from celery_elarion_beat.operate.coverage_metrics import METRIC, EveryNodeGauge
from celery_elarion_beat.store import MemoryClaimStore
from celery_elarion_beat.store.records import NodeState, RunReport


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster() -> Iterator[tuple[Celery, MemoryClaimStore]]:
    """An app with an every-node entry every 10 s; beats a, b, c live for a minute; a's
    worker ran it 5 s ago, b's 40 s ago; c's never recorded a run."""
    name = f"gauge-{uuid.uuid4().hex}"
    app = Celery("gauge", broker="memory://", set_as_current=False)
    app.conf.update(elarion_beat_dsn=f"memory://{name}", beat_schedule={
        "cache": {"task": "t.cache", "schedule": timedelta(seconds=10),
                  "options": {"placement": "every_node"}}})
    store = MemoryClaimStore(name)
    now = store.clock()
    earlier = MemoryClaimStore(name, clock=lambda: now - timedelta(minutes=1))
    for node in "abc":
        earlier.heartbeat(NodeState(node, "boot", "0", "fp"))
        store.heartbeat(NodeState(node, "boot", "0", "fp"))
    store.record_runs([RunReport("cache", now - timedelta(seconds=s), uuid.uuid4().hex,
                                 "started", f"celery@{node}", node=node, every_node=True)
                       for node, s in (("a", 5), ("b", 40))])
    yield app, store
    MemoryClaimStore.reset(name)
    app.close()


def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(s.labels["job"], s.labels["node"]): s.value
            for family in registry.collect() for s in family.samples if s.name == METRIC}


def test_missing_nodes_are_1_nodes_that_ran_0_and_the_untracked_absent(cluster) -> None:
    app, _ = cluster
    registry = CollectorRegistry()
    gauge = EveryNodeGauge(app, refresh=3600)
    registry.register(gauge)
    assert gauge.refresh()
    assert samples(registry) == {("cache", "b"): 1.0, ("cache", "a"): 0.0}
    gauge.close()


def test_a_scrape_serves_the_last_reading_and_refreshes_in_the_background(cluster) -> None:
    app, store = cluster
    ticks = Ticks()
    registry = CollectorRegistry()
    gauge = EveryNodeGauge(app, refresh=15, clock=ticks)
    registry.register(gauge)  # describe(): registering reads nothing
    assert gauge._store is None
    assert samples(registry) == {}  # unknown until read: never 0; the scrape starts a read
    _wait(lambda: samples(registry) == {("cache", "b"): 1.0, ("cache", "a"): 0.0})
    # b's worker is back: the next reading (after 15 s) says so
    store.record_runs([RunReport("cache", store.clock(), "t-b", "started", "celery@b",
                                 node="b", every_node=True)])
    ticks.now += 10
    assert samples(registry)[("cache", "b")] == 1.0  # not stale yet: no read
    ticks.now += 10
    samples(registry)
    _wait(lambda: samples(registry) == {("cache", "b"): 0.0, ("cache", "a"): 0.0})
    gauge.close()


def test_a_store_that_fails_makes_it_unknown_and_warns_once(
        cluster, caplog: pytest.LogCaptureFixture) -> None:
    app, store = cluster

    class Down(MemoryClaimStore):
        failing = True

        def nodes(self) -> Any:
            if Down.failing:
                raise StoreUnavailable("the claims database is down")
            return super().nodes()

    gauge = EveryNodeGauge(app, refresh=0, store=lambda: Down(store.name))
    registry = CollectorRegistry()
    registry.register(gauge)
    with caplog.at_level(logging.INFO, logger="celery_elarion_beat.operate.coverage_metrics"):
        assert not gauge.refresh() and not gauge.refresh()
        assert samples(registry) == {}  # the scrape starts a read, which fails too
        _wait(lambda: not gauge._reading)
        assert samples(registry) == {}
        Down.failing = False
        assert gauge.refresh()
    actions = [r.__dict__.get("action") for r in caplog.records]
    assert actions.count("coverage-unread") == 1 and actions.count("coverage-read") == 1
    assert "claims database is down" in caplog.text
    gauge.close()


def test_flower_registers_the_gauge_and_binds_it_to_its_events_app() -> None:
    from flower.events import Events
    from prometheus_client import REGISTRY

    import celery_elarion_beat.flower as ext

    assert ext._COVERAGE is not None
    assert METRIC in REGISTRY._names_to_collectors  # type: ignore[attr-defined]
    bound = ext._COVERAGE.app

    class Receiver:  # what the wrapper reads of Flower's event receiver
        capp = object()

        class state:  # noqa: N801
            @staticmethod
            def event(event: Any) -> None:
                return None

        class io_loop:  # noqa: N801
            @staticmethod
            def add_callback(callback: Any) -> None:
                return None

    try:
        Events.on_event(Receiver(), {  # type: ignore[arg-type]
            "type": "elarion-heartbeat", "node": "n1", "hostname": "beat@n1",
            "timestamp": 1.0, "cluster": f"gauge-{uuid.uuid4().hex}"})
        assert ext._COVERAGE.app is (bound if bound is not None else Receiver.capp)
    finally:
        ext._COVERAGE.app = bound


def _wait(condition: Any, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_a_close_during_a_background_open_leaves_no_store_open(cluster) -> None:
    """The scrape's refresh runs on its own thread: a close() while it is opening the
    store must not leave that store open (nobody would close it: its connections were
    left to the garbage collector)."""
    import threading

    app, store = cluster
    opening, opened = threading.Event(), threading.Event()
    made: list[Closing] = []

    class Closing(MemoryClaimStore):
        closed = False

        def close(self) -> None:
            self.closed = True

    def slow_open() -> MemoryClaimStore:
        opening.set()
        assert opened.wait(10)
        made.append(Closing(store.name))
        return made[-1]

    gauge = EveryNodeGauge(app, refresh=3600, store=slow_open)
    reader = threading.Thread(target=gauge.refresh)
    reader.start()
    assert opening.wait(10)
    closer = threading.Thread(target=gauge.close)
    closer.start()
    opened.set()
    reader.join(10)
    closer.join(10)
    assert len(made) == 1 and made[0].closed
    assert gauge.refresh() is False and len(made) == 1  # closed: it opens nothing again
