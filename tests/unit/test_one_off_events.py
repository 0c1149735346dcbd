"""Durable one-offs reach the monitors: each batch a beat node leases sends one
``elarion-one-off`` event of counts per task (and at most FAILED_IDS failed ids, never an
error text, an argument or a published id); the metrics turn it into
``elarion_beat_one_offs_total{task,outcome}`` and hear the node; the Flower board takes it
as news of the node and nothing else.

Real ClaimingSchedulers in-process over the memory store and kombu's memory broker; the
one thing faked is the wire of their event dispatchers (a collector, as in
tests/unit/test_heartbeat_events.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore, schedule_once
from celery_elarion_beat.flower.board import Board
from celery_elarion_beat.observe.events import EVENT_TYPES, HEARTBEAT, ONE_OFF, EventSender
from celery_elarion_beat.observe.metrics import OccurrenceCounters
from celery_elarion_beat.one_offs.api import close_stores
from celery_elarion_beat.one_offs.runner import FAILED_IDS
from tests.helpers.fakes import FakeClock, Wire, make_app, make_scheduler, published

START = datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc)
COUNTER = "elarion_beat_one_offs_total"
SEEN = "elarion_beat_node_last_seen_timestamp_seconds"
REMIND, BILL, GONE = "proj.tasks.remind", "proj.tasks.bill", "proj.tasks.gone"


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"unit-{uuid.uuid4().hex}"
    yield name
    close_stores()
    MemoryClaimStore.reset(name)


def one_off_app(namespace: str) -> Celery:
    app = make_app({})
    app.conf.elarion_beat_dsn = f"memory://{namespace}"

    def work(*args: Any, **kwargs: Any) -> None:
        return None

    for name in (REMIND, BILL):
        app.task(name=name, shared=False)(work)
    return app


def wired(beat: ClaimingScheduler) -> tuple[EventSender, Wire]:
    """The beat's event sender, its start-up events sent, now writing to a Wire."""
    sender = beat.events
    assert sender is not None
    assert sender.flush()
    wire = Wire()
    sender._dispatcher = wire
    return sender, wire


def one_off_events(sender: EventSender, wire: Wire) -> list[dict[str, Any]]:
    assert sender.flush()
    return [e for e in wire.sent if e["type"] == ONE_OFF]


def schedule(app: Celery, task: str, count: int, ago: float = 1.0) -> list[str]:
    return [schedule_once(app, task, args=(f"secret-{i}",), eta=START - timedelta(seconds=ago))
            .id for i in range(count)]


def received(events: list[dict[str, Any]], at: float) -> list[dict[str, Any]]:
    """The events as a monitor's receiver hands them on (it stamps local_received)."""
    return [{**e, "hostname": f"beat@{e['node']}", "local_received": at} for e in events]


def test_a_batch_is_one_small_event_of_counts_per_task_and_the_first_failed_ids(
        namespace: str) -> None:
    app = one_off_app(namespace)
    clock = FakeClock(START)
    beat = make_scheduler(app, clock, namespace, "node-a")
    try:
        sender, wire = wired(beat)
        reminders = schedule(app, REMIND, 30)
        bills = schedule(app, BILL, 5)
        gone = schedule(app, GONE, FAILED_IDS + 5)  # not registered: each fails
        weight = sender.sent
        beat.tick()
        (event,) = one_off_events(sender, wire)
        assert len(published(app)) == 35
        assert [e["type"] for e in wire.sent] == [ONE_OFF]  # nothing else went meanwhile
        assert sender.sent - weight == 60  # counted as its one-offs, as a batch its items
        failed_ids = event.pop("failed_ids")
        assert event == {"type": ONE_OFF, "node": "node-a", "count": 60, "cluster": "default",
                         "published": {REMIND: 30, BILL: 5}, "failed": {GONE: FAILED_IDS + 5}}
        assert len(failed_ids) == FAILED_IDS and set(failed_ids) <= set(gone)
        text = repr(event) + repr(failed_ids)
        assert not [i for i in reminders + bills if i in text]  # no published id
        assert "secret" not in text and "not registered" not in text  # no argument, no error

        beat.tick()  # nothing leased: no event
        assert len(one_off_events(sender, wire)) == 1
    finally:
        beat.close()


def test_the_events_of_two_nodes_move_the_counter_by_task_and_outcome(
        namespace: str) -> None:
    app = one_off_app(namespace)
    clock = FakeClock(START)
    beats = [make_scheduler(app, clock, namespace, node) for node in ("node-a", "node-b")]
    try:
        wires = [wired(beat) for beat in beats]
        schedule(app, REMIND, 3)
        schedule(app, GONE, 2)
        beats[0].tick()  # node-a leases all five
        beats[1].tick()
        clock.advance(2)
        schedule(app, REMIND, 4, ago=0.5)
        schedule(app, BILL, 1, ago=0.5)
        beats[1].tick()  # node-b first this time
        beats[0].tick()
        sent = [one_off_events(*w) for w in wires]
        assert [len(events) for events in sent] == [1, 1]
    finally:
        for beat in beats:
            beat.close()

    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry)
    board = Board()
    for event in received(sent[0], 100.0) + received(sent[1], 160.0):
        counters.observe(event)
        board.observe(event)

    def value(task: str, outcome: str) -> float | None:
        return registry.get_sample_value(COUNTER, {"task": task, "outcome": outcome})

    assert (value(REMIND, "published"), value(BILL, "published"), value(GONE, "failed")) == \
        (7.0, 1.0, 2.0)
    assert value(REMIND, "failed") is None and value(GONE, "published") is None
    assert registry.get_sample_value(SEEN, {"node": "node-a"}) == 100.0
    assert registry.get_sample_value(SEEN, {"node": "node-b"}) == 160.0
    occurrences = [s for m in registry.collect() for s in m.samples
                   if s.name.startswith(("elarion_beat_occurrences", "elarion_beat_node_occ"))]
    assert occurrences == []  # one-offs are no occurrences of a job

    state = board.snapshot()
    assert state["jobs"] == [] and state["events"] == 2
    nodes = {n["node"]: n for n in state["nodes"]}
    assert sorted(nodes) == ["node-a", "node-b"]
    assert nodes["node-b"]["last_seen_ts"] == 160.0
    assert (nodes["node-a"]["dispatched"], nodes["node-a"]["skipped"]) == (0, 0)


def one_off(node: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"type": ONE_OFF, "hostname": f"beat@{node}", "node": node, "local_received": at,
            **fields}


def test_malformed_one_off_events_move_nothing_and_never_raise() -> None:
    assert ONE_OFF in EVENT_TYPES and HEARTBEAT in EVENT_TYPES
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry)
    board = Board()
    for event in (one_off("a", 10.0, published=["id-1", "id-2"], failed={"id-3": "boom"}),
                  one_off("a", 11.0, published={REMIND: True, BILL: -2, GONE: "3"},
                          failed={REMIND: 1.5}),
                  one_off("a", 12.0, published=None, failed="x"),
                  one_off("a", 13.0, published={REMIND: 2})):
        counters.observe(event)
        board.observe(event)
    assert [(s.labels, s.value) for m in registry.collect() for s in m.samples
            if s.name == COUNTER] == [({"task": REMIND, "outcome": "published"}, 2.0)]
    assert registry.get_sample_value(SEEN, {"node": "a"}) == 13.0
    assert board.snapshot()["jobs"] == [] and board.snapshot()["events"] == 4


def test_one_off_series_grow_with_tasks_never_with_nodes() -> None:
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry)
    tasks = [f"proj.tasks.t{i}" for i in range(10)]
    nodes = [f"pod-{i}" for i in range(50)]
    for n, node in enumerate(nodes):
        counters.observe(one_off(node, 100.0 + n, count=20,
                                 published={task: 1 for task in tasks},
                                 failed={task: 1 for task in tasks}))
    series = [s for m in registry.collect() for s in m.samples if s.name == COUNTER]
    assert len(series) == len(tasks) * 2
    assert {s.value for s in series} == {len(nodes)}
    assert {tuple(s.labels) for s in series} == {("task", "outcome")}
