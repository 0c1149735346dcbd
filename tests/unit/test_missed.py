"""Missed slots, anchored intervals, publish reports and orphans, in process: an injected
clock, the memory store, kombu's memory broker."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery.schedules import crontab, schedule

from celery_elarion_beat import (
    ClaimingScheduler,
    ClaimRequest,
    MemoryClaimStore,
    StoreUnavailable,
    slot_task_id,
)
from tests.helpers.fakes import FakeClock, make_app, make_scheduler, published

UTC = timezone.utc
T0 = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0 - timedelta(seconds=30))


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"missed-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


def run(beat: ClaimingScheduler, clock: FakeClock, until: datetime) -> None:
    """Tick *beat* the way beat does, until the clock reaches *until*."""
    while clock() < until:
        wait = beat.tick()
        clock.advance(min(max(wait, 0.05), (until - clock()).total_seconds() + 0.01))


def occurrences(messages: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(m["headers"]["elarion_job"], m["headers"]["elarion_occurrence"],
             m["headers"]["elarion_catch_up"]) for m in messages]


def down_across_five_slots(clock: FakeClock, namespace: str,
                           options: dict[str, Any]) -> tuple[Any, ClaimingScheduler]:
    """One node runs an every-minute entry over 03:00, stops; the cluster is down until
    03:05:20; a node starts again."""
    entries = {"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock),
                          "options": options}}
    first = make_scheduler(make_app(entries), clock, namespace, "node-a")
    run(first, clock, T0 + timedelta(seconds=10))
    first.close()
    clock.now = T0 + timedelta(minutes=5, seconds=20)
    app = make_app(entries)
    return app, make_scheduler(app, clock, namespace, "node-b")


@pytest.mark.parametrize(("options", "replayed"), [
    ({}, []),
    ({"catch_up": "latest"}, [5]),
    ({"catch_up": "all"}, [1, 2, 3, 4, 5]),
    ({"catch_up": "all", "catch_up_max": 2}, [4, 5]),
    ({"catch_up": "all", "catch_up_window": 150}, [3, 4, 5]),
])
def test_a_node_that_comes_back_replays_what_its_policy_says(
        clock: FakeClock, namespace: str, options: dict[str, Any], replayed: list[int]) -> None:
    app, beat = down_across_five_slots(clock, namespace, options)
    try:
        run(beat, clock, T0 + timedelta(minutes=5, seconds=40))
        expected = [("report", f"2026-11-29T03:0{k}:00Z", 1) for k in replayed]
        assert occurrences(published(app)) == expected
        rows = {r.occurrence: r for r in beat.store.find_claims(job="report", limit=100)}
        for k in replayed:
            row = rows[T0 + k * MINUTE]
            assert (row.node, row.state, row.task_id) == (
                "node-b", "published", slot_task_id("report", T0 + k * MINUTE))
    finally:
        beat.close()


def test_replays_are_rate_limited_per_tick(clock: FakeClock, namespace: str) -> None:
    app, beat = down_across_five_slots(clock, namespace, {"catch_up": "all"})
    beat.close()
    app.conf.elarion_beat_catch_up_per_tick = 2
    beat = make_scheduler(app, clock, namespace, "node-c")
    try:
        clock.advance(2.0)  # beat reads the ledger 2 s after it starts
        counts, sleeps = [], []
        for _ in range(5):
            sleeps.append(beat.tick())
            counts.append(len(published(app)))
        # the first tick reads the ledger; then oldest first, two per tick
        assert counts == [0, 2, 2, 1, 0]
        assert all(wait <= 1.0 for wait in sleeps[:3])  # more wait: tick again soon
    finally:
        beat.close()


def test_an_entry_never_claimed_catches_nothing_up(clock: FakeClock, namespace: str) -> None:
    clock.now = T0 + timedelta(minutes=5, seconds=20)
    app = make_app({"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock),
                               "options": {"catch_up": "all"}}})
    beat = make_scheduler(app, clock, namespace, "node-a")
    try:
        run(beat, clock, T0 + timedelta(minutes=5, seconds=40))
        assert published(app) == []
    finally:
        beat.close()


# -- intervals -----------------------------------------------------------------


def interval_cluster_restart(clock: FakeClock, namespace: str,
                             **conf: Any) -> tuple[Any, ClaimingScheduler, datetime]:
    """node-a runs a 60 s interval once, every node restarts 30 s later: return node-b
    and when the interval last ran."""
    entries = {"sync": {"task": "tasks.sync", "schedule": schedule(timedelta(seconds=60),
                                                                    nowfun=clock)}}
    first = make_scheduler(make_app(entries, **conf), clock, namespace, "node-a")
    run(first, clock, clock() + timedelta(seconds=61))
    (last,) = [r.occurrence for r in first.store.find_claims(job="sync")]
    first.close()
    clock.advance(30)
    app = make_app(entries, **conf)
    return app, make_scheduler(app, clock, namespace, "node-b"), last


def test_an_interval_keeps_its_rhythm_across_a_restart_of_every_node(
        clock: FakeClock, namespace: str) -> None:
    app, beat, last = interval_cluster_restart(clock, namespace)
    try:
        run(beat, clock, last + timedelta(seconds=59))
        assert published(app) == []
        run(beat, clock, last + timedelta(seconds=61))
        assert len(published(app)) == 1  # one interval after the last run, not after start
        runs = sorted(r.occurrence for r in beat.store.find_claims(job="sync"))
        assert timedelta(seconds=59) <= runs[1] - runs[0] <= timedelta(seconds=61)
    finally:
        beat.close()


def test_the_node_anchor_keeps_the_old_behaviour(clock: FakeClock, namespace: str) -> None:
    app, beat, last = interval_cluster_restart(clock, namespace,
                                               elarion_beat_interval_anchor="node")
    try:
        run(beat, clock, last + timedelta(seconds=85))
        assert published(app) == []  # one interval after this node started (+91 s)
        run(beat, clock, last + timedelta(seconds=95))
        assert len(published(app)) == 1
    finally:
        beat.close()


def test_a_node_that_loses_a_window_follows_the_winner(clock: FakeClock,
                                                       namespace: str) -> None:
    entries = {"sync": {"task": "tasks.sync", "schedule": schedule(timedelta(seconds=60),
                                                                    nowfun=clock)}}
    app = make_app(entries)
    a = make_scheduler(app, clock, namespace, "node-a")
    clock.advance(30)
    b = make_scheduler(make_app(entries), clock, namespace, "node-b")
    try:
        start = clock()
        for _ in range(200):  # a wins at +30 s; b loses at +60 s and re-anchors on a
            if clock() >= start + timedelta(seconds=70):
                break
            waits = [a.tick(), b.tick()]
            clock.advance(max(min(waits), 0.05))
        a.close()  # node-a dies after its run at start + 30 s
        won_by_a = [r.occurrence for r in b.store.find_claims(job="sync")]
        run(b, clock, start + timedelta(seconds=91))
        # b runs one interval after a's run (+90 s), not one after its own lost try (+120 s)
        runs = sorted(r.occurrence for r in b.store.find_claims(job="sync"))
        assert len(runs) == len(won_by_a) + 1
        assert runs[-1] - runs[-2] <= timedelta(seconds=61)
    finally:
        b.close()


# -- publish reports and orphans ------------------------------------------------------


def orphan_of(store: MemoryClaimStore, job: str, slot: datetime) -> None:
    """A claim made by a node that died before publishing it."""
    (result,) = store.claim("node-dead", [ClaimRequest.for_slot(job, slot,
                                                                slot_task_id(job, slot))])
    assert result.won


def beat_with_orphan(clock: FakeClock, namespace: str,
                     delivery: str) -> tuple[Any, ClaimingScheduler, datetime]:
    clock.now = T0 + timedelta(seconds=40)
    store = MemoryClaimStore(namespace, clock=clock)
    orphan_of(store, "report", T0)
    app = make_app({"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock),
                               "options": {"delivery": delivery}}},
                   elarion_beat_publish_timeout=5, elarion_beat_heartbeat_interval=0.05,
                   elarion_beat_node_timeout=1)
    return app, make_scheduler(app, clock, namespace, "node-b", store=store), T0


def tick_through(beat: ClaimingScheduler, clock: FakeClock, seconds: float) -> None:
    """Ticks over *seconds* of the fake clock, with heartbeats due (real time) between."""
    end = clock() + timedelta(seconds=seconds)
    while clock() < end:
        time.sleep(0.06)
        beat.tick()
        clock.advance(1.0)


def test_an_at_least_once_orphan_is_taken_over_with_its_task_id(
        clock: FakeClock, namespace: str) -> None:
    app, beat, slot = beat_with_orphan(clock, namespace, "at_least_once")
    try:
        tick_through(beat, clock, 3)
        assert published(app) == []  # within the publish timeout: the winner may yet send
        tick_through(beat, clock, 4)
        (message,) = published(app)
        assert message["headers"]["id"] == slot_task_id("report", slot)
        assert message["headers"]["elarion_takeover"] == 1
        assert message["headers"]["elarion_occurrence"] == "2026-11-29T03:00:00Z"
        (row,) = [r for r in beat.store.find_claims(job="report") if r.occurrence == slot]
        assert (row.node, row.state, row.takeovers) == ("node-b", "published", 1)
        tick_through(beat, clock, 8)
        assert published(app) == []  # published once: never taken over again
    finally:
        beat.close()


def test_an_at_most_once_orphan_is_reported_once_and_never_sent(
        clock: FakeClock, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    app, beat, slot = beat_with_orphan(clock, namespace, "at_most_once")
    sent: list[dict[str, Any]] = []
    assert beat.events is not None
    beat.events.send = lambda type_, **fields: sent.append({"type": type_, **fields}) or True
    try:
        with caplog.at_level(logging.WARNING, logger="celery_elarion_beat"):
            tick_through(beat, clock, 12)
        assert published(app) == []
        lines = [r.getMessage() for r in caplog.records if "orphaned claim" in r.getMessage()]
        assert len(lines) == 1 and "report at 2026-11-29T03:00:00Z" in lines[0]
        assert "node-dead" in lines[0] and "at_most_once" in lines[0]
        (event,) = [e for e in sent if e["type"] == "elarion-orphaned"]
        assert (event["job"], event["holder"], event["action"]) == (
            "report", "node-dead", "reported")
        (row,) = [r for r in beat.store.find_claims(job="report") if r.occurrence == slot]
        assert (row.node, row.state, row.takeovers) == ("node-dead", "pending", 0)
    finally:
        beat.close()



# -- regressions found by the real-process tests ---------------------------------------


class FlakyStore(MemoryClaimStore):
    """The memory store, with a switch that makes claims and ledger reads fail like a
    dead database."""

    down = False

    def claim(self, node: str, requests: Any) -> Any:
        self._check()
        return super().claim(node, requests)

    def latest_claims(self, jobs: Any = None, before: Any = None) -> Any:
        self._check()
        return super().latest_claims(jobs, before)

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("the claims database is unreachable (test)")


def test_the_slots_skipped_in_an_outage_are_caught_up(clock: FakeClock, namespace: str) -> None:
    store = FlakyStore(namespace, clock=clock)
    app = make_app({"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock),
                               "options": {"catch_up": "all"}}})
    beat = make_scheduler(app, clock, namespace, "node-a", store=store)
    try:
        run(beat, clock, T0 + timedelta(seconds=10))  # 03:00 runs
        store.down = True
        run(beat, clock, T0 + timedelta(minutes=2, seconds=10))  # 03:01, 03:02: claim-error
        store.down = False
        run(beat, clock, T0 + timedelta(minutes=3, seconds=10))  # 03:03 runs, then catch-up
        assert occurrences(published(app)) == [
            ("report", "2026-11-29T03:00:00Z", 0), ("report", "2026-11-29T03:03:00Z", 0),
            ("report", "2026-11-29T03:01:00Z", 1), ("report", "2026-11-29T03:02:00Z", 1)]
    finally:
        beat.close()


def test_a_slot_due_while_the_ledger_is_read_is_sent_once(clock: FakeClock,
                                                          namespace: str) -> None:
    """Beat starts while the database is down and reads the ledger only after a slot
    passed: that slot is a normal run, not also a missed one (claiming both in one
    statement sent it twice), and the slots missed before the start are replayed."""
    clock.now = T0 + timedelta(minutes=2, seconds=59.5)
    store = FlakyStore(namespace, clock=clock)
    orphan_of(store, "report", T0)  # the newest claim: 03:00 (03:01, 03:02 missed)
    store.down = True
    app = make_app({"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock),
                               "options": {"catch_up": "all"}}})
    beat = make_scheduler(app, clock, namespace, "node-b", store=store)
    try:
        clock.now = T0 + timedelta(minutes=3, seconds=0.3)
        store.down = False
        run(beat, clock, T0 + timedelta(minutes=3, seconds=5))
        assert occurrences(published(app)) == [("report", "2026-11-29T03:03:00Z", 0),
                                               ("report", "2026-11-29T03:01:00Z", 1),
                                               ("report", "2026-11-29T03:02:00Z", 1)]
    finally:
        beat.close()


def test_a_node_of_any_rank_replays_oldest_first(clock: FakeClock, namespace: str) -> None:
    app, beat = down_across_five_slots(clock, namespace, {"catch_up": "all"})
    beat.close()
    app.conf.elarion_beat_claim_chunk = 2
    beat = make_scheduler(app, clock, namespace, "node-c")
    try:
        assert beat.maintenance is not None
        beat.maintenance.live_nodes = ["node-a", "node-b", "node-c"]  # rank 2 of 3
        clock.advance(2.0)  # beat reads the ledger 2 s after it starts
        beat.tick()
        beat.tick()
        assert [o for _, o, _ in occurrences(published(app))] == [
            f"2026-11-29T03:0{k}:00Z" for k in (1, 2, 3, 4, 5)]
    finally:
        beat.close()


def test_a_publish_error_is_stored_whatever_its_text() -> None:
    """The error rides along with every claim until written: a NUL or a lone surrogate
    in an exception's text must not make the database refuse the claims."""
    from celery_elarion_beat.store.records import storable

    assert storable("OperationalError: bad\x00byte \udcff end") == \
        "OperationalError: badbyte \\udcff end"
    assert len(storable("x" * 5000)) == 2000
