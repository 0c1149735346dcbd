"""Beat's outcomes go out as ``elarion-batch`` events: one per node per tick, split when
big; the board and the metrics count a batch exactly as the events it carries.

The broker is the only thing faked: a collector stands in for Celery's event
dispatcher (what goes on the wire is what it receives)."""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery.schedules import crontab
from prometheus_client import CollectorRegistry, generate_latest

from celery_elarion_beat import MemoryClaimStore, Outcome, SkipReason
from celery_elarion_beat.config.placement import Placement
from celery_elarion_beat.flower.board import Board
from celery_elarion_beat.observe import events as events_module
from celery_elarion_beat.observe.events import (
    BATCH,
    DISPATCHED,
    HEARTBEAT,
    SKIPPED,
    EventSender,
    expand,
)
from celery_elarion_beat.observe.metrics import counters_for
from celery_elarion_beat.observe.outcome import Record
from celery_elarion_beat.schedules.slots import ClaimKind
from tests.helpers.fakes import FakeClock, make_app, make_scheduler

T0 = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)


class Wire:
    """Stands in for Celery's event dispatcher: keeps what would go on the wire."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._stamp = itertools.count(1000)

    def send(self, type_: str, **fields: Any) -> None:
        self.sent.append({"type": type_, **fields, "hostname": "beat@x",
                          "local_received": float(next(self._stamp))})

    def close(self) -> None:
        pass


def sender(batch: int, node: str = "node-a") -> tuple[EventSender, Wire]:
    out = EventSender(make_app({}), node, batch=batch)
    wire = Wire()
    out._dispatcher = wire  # the broker connection is the one thing not under test
    return out, wire


def record(node: str, job: str, minute: int, won: bool) -> Record:
    slot = T0 + timedelta(minutes=minute)
    return Record(job=job, task="proj.work", node=node,
                  outcome=Outcome.DISPATCHED if won else Outcome.SKIPPED,
                  placement=Placement.CLUSTER, at=slot, kind=ClaimKind.SLOT, occurrence=slot,
                  task_id=f"{job}-{minute}" if won else None,
                  reason=None if won else SkipReason.CLAIMED_ELSEWHERE,
                  winner="node-a", lateness=0.01 if won else None)


def rounds(nodes: list[str], jobs: int, minutes: int) -> list[list[Record]]:
    """Per tick (one minute), every node's outcomes: node-a wins, the others skip."""
    return [[record(node, f"job-{j}", m, node == "node-a") for node in nodes
             for j in range(jobs)] for m in range(minutes)]


def delivered(wire: Wire, out: EventSender) -> list[dict[str, Any]]:
    """What went on the wire but the heartbeats (tests/unit/test_heartbeat_events.py)."""
    out.flush()
    return [e for e in wire.sent if e["type"] != HEARTBEAT]


def test_one_tick_is_one_event_per_node_and_a_big_one_is_split() -> None:
    out, wire = sender(batch=100)
    for r in [record("node-a", f"job-{j}", 0, won=j % 2 == 0) for j in range(250)]:
        out.on_record(r)
    assert [e["count"] for e in delivered(wire, out)] == [100, 100]  # full: went at once
    out.end_tick()
    events = delivered(wire, out)
    assert [(e["type"], e["count"], len(e["items"])) for e in events] == [
        (BATCH, 100, 100), (BATCH, 100, 100), (BATCH, 50, 50)]
    assert out.sent == 250 and out.dropped == 0  # counted as outcomes
    items = [item for e in events for item in e["items"]]
    assert [item["job"] for item in items] == [f"job-{j}" for j in range(250)]
    assert {item["type"] for item in items[::2]} == {DISPATCHED}
    assert {item["type"] for item in items[1::2]} == {SKIPPED}
    assert all("args" not in item and "kwargs" not in item for item in items)


def test_skips_alone_wait_for_a_dispatch_or_a_few_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out, wire = sender(batch=500)
    out.on_record(record("node-b", "job-1", 0, won=False))
    out.end_tick()
    assert delivered(wire, out) == []  # a lost small tick: held
    out.on_record(record("node-b", "job-2", 1, won=False))
    out.on_record(record("node-b", "job-3", 1, won=True))
    out.end_tick()  # this tick won something: everything goes, in one event
    (event,) = delivered(wire, out)
    assert [i["job"] for i in event["items"]] == ["job-1", "job-2", "job-3"]
    out.on_record(record("node-b", "job-4", 2, won=False))
    monkeypatch.setattr(events_module, "SKIP_HOLD", 0.0)
    out.end_tick()  # held long enough
    assert [i["job"] for i in delivered(wire, out)[-1]["items"]] == ["job-4"]
    out.on_record(record("node-b", "job-5", 3, won=False))
    out.close()  # nothing is lost at shutdown
    assert [i["job"] for i in wire.sent[-1]["items"]] == ["job-5"]


def test_batch_zero_sends_one_event_per_outcome_as_before() -> None:
    out, wire = sender(batch=0)
    for r in (record("node-a", "a", 0, True), record("node-a", "b", 0, False)):
        out.on_record(r)
    out.end_tick()
    assert [e["type"] for e in delivered(wire, out)] == [DISPATCHED, SKIPPED]


def test_the_board_and_the_metrics_count_a_batch_as_the_events_it_carries() -> None:
    nodes = ["node-a", "node-b", "node-c"]
    ticks = rounds(nodes, jobs=7, minutes=4)
    one_by_one: list[dict[str, Any]] = []
    batched: list[dict[str, Any]] = []
    for node in nodes:
        single, single_wire = sender(batch=0, node=node)
        many, many_wire = sender(batch=5, node=node)
        for tick in ticks:
            for r in tick:
                if r.node == node:
                    single.on_record(r)
                    many.on_record(r)
            many.end_tick(force=True)
        one_by_one += delivered(single_wire, single)
        batched += delivered(many_wire, many)
    outcomes = sum(len(t) for t in ticks)
    assert len(one_by_one) == outcomes
    assert len(batched) == 3 * 4 * 2  # per node and tick: 7 outcomes, batches of 5 and 2
    assert all(e["type"] == BATCH for e in batched)

    def shown(events: list[dict[str, Any]]) -> tuple[Any, str]:
        board, registry = Board(), CollectorRegistry()
        counters = counters_for(registry)
        for event in events:
            board.observe(event)
            counters.observe(event)
        state = board.snapshot()
        # when the monitor heard of each (the wire's stamps) is the only difference
        for node in state["nodes"]:
            node.pop("last_seen"), node.pop("last_seen_ts")
        for job in state["jobs"]:
            job.pop("updated")
        for key in ("now", "now_ts"):
            state.pop(key)
        state["nodes"].sort(key=lambda n: n["node"])
        state["jobs"].sort(key=lambda j: j["job"])
        metrics = "\n".join(line for line in generate_latest(registry).decode().splitlines()
                            if not line.startswith("#") and "_created" not in line
                            and "last_seen" not in line)  # the wire's stamps, like the board's
        return state, metrics

    board_each, metrics_each = shown(one_by_one)
    board_batched, metrics_batched = shown(batched)
    assert metrics_batched == metrics_each
    assert 'elarion_beat_occurrences_total{job="job-3",outcome="skipped",' \
           'reason="claimed-elsewhere"} 8.0' in metrics_batched  # 2 nodes x 4 minutes
    assert board_batched == board_each
    assert sum(n["skipped"] for n in board_batched["nodes"]) == 2 * 7 * 4


def test_expand_keeps_the_senders_fields_and_leaves_out_malformed_items() -> None:
    event = {"type": BATCH, "node": "node-a", "hostname": "beat@node-a", "timestamp": 5.0,
             "local_received": 6.0, "items": [
                 {"type": DISPATCHED, "job": "a"}, {"type": "task-failed", "job": "x"},
                 "junk", {"type": SKIPPED, "job": "b", "node": "other"}]}
    assert expand(event) == [
        {"hostname": "beat@node-a", "timestamp": 5.0, "local_received": 6.0, "node": "node-a",
         "type": DISPATCHED, "job": "a"},
        {"hostname": "beat@node-a", "timestamp": 5.0, "local_received": 6.0, "node": "other",
         "type": SKIPPED, "job": "b"}]
    assert expand({"type": BATCH, "items": None}) == []
    plain = {"type": DISPATCHED, "job": "a"}
    assert expand(plain) == [plain]


def test_a_tick_of_the_scheduler_sends_one_batch_per_node() -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    namespace = f"unit-{uuid.uuid4().hex}"
    app = make_app({f"job-{j}": {"task": "tasks.work", "schedule": crontab(nowfun=clock)}
                    for j in range(30)}, elarion_beat_event_batch=500)
    nodes = [make_scheduler(app, clock, namespace, f"node-{i}") for i in range(3)]
    wires = []
    try:
        for node in nodes:
            node.setup_schedule()
            assert node.events is not None
            node.events.flush()  # the start's heartbeat event went (not on the wire)
            wire = Wire()
            node.events._dispatcher = wire
            wires.append(wire)
        clock.advance(30.2)
        for node in nodes:
            node.tick()
        clock.advance(60)
        for node in nodes:
            node.tick()
    finally:
        for node in nodes:
            node.close()  # sends what a node held
        MemoryClaimStore.reset(namespace)
    sent = [[e for e in wire.sent if e["type"] != HEARTBEAT] for wire in wires]
    outcomes = [i for events in sent for e in events for i in expand(e)]
    assert len([o for o in outcomes if o["type"] == DISPATCHED]) == 60  # 30 jobs x 2 minutes
    assert len([o for o in outcomes if o["type"] == SKIPPED]) == 120
    # the winner of a tick sends at once; a node that only lost holds its skips
    assert sum(len(events) for events in sent) <= 2 * 3
    assert all(e["type"] == BATCH for events in sent for e in events)


def test_a_node_that_only_lost_wakes_to_send_its_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    """An hourly job: the losers' skips must not wait an hour for the next tick."""
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    namespace = f"unit-{uuid.uuid4().hex}"
    app = make_app({"hourly": {"task": "tasks.work", "schedule": crontab(minute=0, nowfun=clock)}})
    winner, loser = (make_scheduler(app, clock, namespace, name) for name in ("node-a", "node-b"))
    try:
        wire = Wire()
        for node in (winner, loser):
            node.setup_schedule()
            assert node.events is not None
            node.events.flush()  # the start's heartbeat event went (not on the wire)
        loser.events._dispatcher = wire  # type: ignore[union-attr]
        clock.advance(30.2)  # 03:00:00.2
        winner.tick()
        slept = loser.tick()  # lost the slot: its skip is held, and beat wakes to send it
        assert [o["type"] for o in expand_all(delivered(wire, loser.events))] == []
        assert 0 < slept <= events_module.SKIP_HOLD
        monkeypatch.setattr(events_module, "SKIP_HOLD", 0.0)  # the hold is over
        clock.advance(slept)
        loser.tick()  # nothing due until 04:00
        (skip,) = expand_all(delivered(wire, loser.events))
        assert (skip["type"], skip["job"], skip["reason"], skip["winner"]) == \
            (SKIPPED, "hourly", "claimed-elsewhere", "node-a")
    finally:
        for node in (winner, loser):
            node.close()
        MemoryClaimStore.reset(namespace)


def expand_all(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(item) for event in events for item in expand(event)]
