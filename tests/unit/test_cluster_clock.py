"""The cluster's clock (#35): a node decides and sends on the database clock, whatever
its own clock says; a node whose clock is too far off fences itself.

In process: the "database" is a memory store on a FakeClock (the true time); the
node's own clock is that FakeClock shifted, the way faketime shifts a process (the
real processes are tests/fault/test_clock_skew.py)."""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import crontab, schedule

from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore, Outcome, SkipReason
from celery_elarion_beat.schedules.clock import ClusterClock
from tests.helpers.fakes import FakeClock, make_app, published

START = datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc)


@pytest.fixture
def true() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"clock-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


def skewed(true: FakeClock, seconds: float) -> ClusterClock:
    """A node's cluster clock over its own clock, *seconds* off the true one."""
    return ClusterClock(lambda: true() + timedelta(seconds=seconds))


def node(true: FakeClock, namespace: str, name: str, off: float, entries: dict,
         **conf: object) -> ClaimingScheduler:
    # entries of its own: a schedule object belongs to one app (beat sets its app)
    app = make_app({k: dict(v, schedule=copy.copy(v["schedule"])) for k, v in entries.items()},
                   elarion_beat_node=name, **conf)
    # the process's own clock, as Celery's schedules read it (faketime shifts this one)
    app.now = lambda: (true() + timedelta(seconds=off)).astimezone(app.timezone)
    return ClaimingScheduler(app, clock=skewed(true, off),
                             store=MemoryClaimStore(namespace, clock=true))


def test_the_filter_keeps_the_measurement_of_the_shortest_round_trip() -> None:
    clock = ClusterClock(lambda: START)
    assert clock.offset is None and clock() == START and clock.fenced(60)
    clock.measured(20.4, 0.8)   # a slow trip: its halving is least sure
    clock.measured(20.01, 0.002)
    clock.measured(19.2, 1.6)
    assert clock.offset == pytest.approx(20.01)
    assert clock() == START - timedelta(seconds=20.01)
    assert not clock.fenced(60) and clock.fenced(10)
    # a step of the node's clock is followed once the old samples are gone
    for _ in range(ClusterClock.SAMPLES):
        clock.measured(-5.0, 0.5)
    assert clock.offset == pytest.approx(-5.0)


@pytest.mark.parametrize("off", [20.0, -20.0])
def test_a_skewed_node_sends_each_slot_at_its_instant_on_the_database_clock(
        true: FakeClock, namespace: str, off: float) -> None:
    """Before, the +20 s node sent 02:59:40 the slot of 03:00 (its clock said it had
    come), and the -20 s node sent 03:00 at 03:00:20."""
    beat = node(true, namespace, "node-a", off, {
        "report": {"task": "t.report", "schedule": crontab()},
        "poll": {"task": "t.poll", "schedule": schedule(timedelta(seconds=30))}})
    assert beat.fence.clock is not None and beat.fence.clock.offset == pytest.approx(off)
    sent: list[tuple[datetime, str]] = []
    while true() < START + timedelta(seconds=75):
        beat.tick()
        sent += [(true(), m["headers"]["elarion_job"]) for m in published(beat.app)]
        true.advance(0.25)
    slots = [at for at, job in sent if job == "report"]
    assert len(slots) == 1, sent
    assert timedelta(0) <= slots[0] - datetime(2026, 11, 29, 3, tzinfo=timezone.utc) \
        <= timedelta(seconds=0.25), sent
    polls = [at - START for at, job in sent if job == "poll"]  # 30 s apart, on true time
    assert len(polls) == 2 and all(
        timedelta(seconds=30 * (i + 1)) <= p <= timedelta(seconds=30 * (i + 1) + 0.25)
        for i, p in enumerate(polls)), sent
    beat.close()


def test_a_node_too_far_off_fences_itself_and_its_every_node_entries_go_on(
        true: FakeClock, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    entries = {"report": {"task": "t.report", "schedule": crontab()},
               "local": {"task": "t.local", "schedule": crontab(),
                         "options": {"placement": "every_node"}}}
    far = node(true, namespace, "node-far", 600.0, entries)
    near = node(true, namespace, "node-near", 0.0, entries)
    caplog.set_level(logging.INFO, logger="celery_elarion_beat")
    true.advance(30.1)  # 03:00:00.1
    for _ in range(3):
        far.tick()
        near.tick()
        true.advance(60)
    far_skips = [r for r in far.recorder.recent if r.outcome is Outcome.SKIPPED]
    assert far_skips and all(r.reason is SkipReason.CLOCK_FENCED for r in far_skips)
    assert {r.job for r in far_skips} == {"report"}
    far_sent = [(r.job, r.placement.value) for r in far.recorder.recent
                if r.outcome is Outcome.DISPATCHED]
    assert far_sent == [("local", "every_node")] * 3  # its own entries go on
    assert published(far.app, far.node_queue.name)  # to its node's queue
    near_sent = [m["headers"]["elarion_job"] for m in published(near.app)]
    assert near_sent == ["report"] * 3  # the cluster lost nothing
    fenced = [r for r in caplog.records if getattr(r, "action", None) == "clock-fenced"]
    assert len(fenced) == 1 and fenced[0].levelno == logging.WARNING
    assert "+10m" in fenced[0].getMessage() and "elarion_beat_max_clock_offset" \
        in fenced[0].getMessage()
    # the node's clock is fixed: the next measurement lifts the fence, once
    far.fence.clock.raw = true  # type: ignore[union-attr]
    for _ in range(ClusterClock.SAMPLES):
        far.fence.measure()
    far.tick()
    true.advance(60)
    far.tick()
    assert [r.reason for r in far.recorder.recent if r.outcome is Outcome.SKIPPED][-1] \
        is SkipReason.CLAIMED_ELSEWHERE or any(
            m["headers"]["elarion_job"] == "report" for m in published(far.app))
    lifted = [r for r in caplog.records if getattr(r, "action", None) == "clock-unfenced"]
    assert len(lifted) == 1 and lifted[0].levelno == logging.INFO
    far.close()
    near.close()


def test_a_quick_restart_finds_its_interval_due_in_the_first_tick(
        true: FakeClock, namespace: str) -> None:
    """The interval ran at 02:59:30 (another node); every node restarts 15 s later and
    is up at 02:59:49.5, 0.5 s before the next run is due: it runs at 02:59:50, not a
    whole interval later (the ledger was read only 2 s after start)."""
    entries = {"poll": {"task": "t.poll", "schedule": schedule(timedelta(seconds=20)),
                        "options": {"catch_up": "skip"}}}
    first = node(true, namespace, "node-a", 0.0, entries)
    true.advance(20.1)
    first.tick()  # 02:59:50.1: the first run
    assert [m["headers"]["elarion_job"] for m in published(first.app)] == ["poll"]
    first.close()
    true.advance(19.4)
    again = node(true, namespace, "node-a", 0.0, entries)  # up 0.5 s before it is due
    sent = []
    while true() < START + timedelta(seconds=62):
        again.tick()
        sent += [true() for _ in published(again.app)]
        true.advance(0.25)
    due = START + timedelta(seconds=40.1)
    assert sent and due <= sent[0] <= due + timedelta(seconds=0.25), sent
    again.close()
