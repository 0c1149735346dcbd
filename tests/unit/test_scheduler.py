"""ClaimingScheduler in-process: injected clock, memory store, kombu's memory broker."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_elarion_beat import (
    ClaimingScheduler,
    ConfigurationError,
    MemoryClaimStore,
    Outcome,
    SkipReason,
    StoreUnavailable,
    cron,
    slot_task_id,
)
from celery_elarion_beat.store import ClaimRequest, ClaimResult
from tests.helpers.fakes import FakeClock, make_app, make_scheduler, published


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"unit-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


def cluster(n: int, entries: Callable[[FakeClock], dict[str, Any]], clock: FakeClock,
            namespace: str) -> tuple[Celery, list[ClaimingScheduler]]:
    app = make_app(entries(clock))
    return app, [make_scheduler(app, clock, namespace, f"node-{i}") for i in range(n)]


def test_one_occurrence_on_three_nodes_is_sent_once(clock: FakeClock, namespace: str) -> None:
    app, nodes = cluster(3, lambda c: {
        "report": {"task": "tasks.report", "schedule": crontab(nowfun=c)}}, clock, namespace)
    clock.advance(30.2)  # 03:00:00.2
    for node in nodes:
        node.tick()
    messages = published(app)
    assert len(messages) == 1
    slot = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
    headers = messages[0]["headers"]
    assert headers["id"] == slot_task_id("report", slot)
    assert headers["elarion_job"] == "report"
    assert headers["elarion_occurrence"] == "2026-11-29T03:00:00Z"
    assert headers["elarion_node"] == "node-0"
    assert headers["elarion_claim"] == "slot"
    skips = [r for n in nodes for r in n.recorder.recent if r.outcome is Outcome.SKIPPED]
    assert [(r.node, r.reason, r.winner) for r in skips] == [
        ("node-1", SkipReason.CLAIMED_ELSEWHERE, "node-0"),
        ("node-2", SkipReason.CLAIMED_ELSEWHERE, "node-0"),
    ]


def test_losers_move_their_schedule_on(clock: FakeClock, namespace: str) -> None:
    app, (a, b) = cluster(2, lambda c: {
        "report": {"task": "tasks.report", "schedule": crontab(nowfun=c)}}, clock, namespace)
    clock.advance(30.2)
    a.tick()
    b.tick()
    # b lost 03:00; its entry is no longer due, and the next minute is claimable again
    assert b.schedule["report"].is_due()[0] is False
    clock.advance(60)
    b.tick()
    a.tick()
    senders = [m["headers"]["elarion_node"] for m in published(app)]
    assert senders == ["node-0", "node-1"]


def test_interval_entries_claim_a_window(clock: FakeClock, namespace: str) -> None:
    app = make_app({"poll": {"task": "tasks.poll",
                             "schedule": schedule(timedelta(seconds=10), nowfun=clock)}})
    a = make_scheduler(app, clock, namespace, "node-a")
    clock.advance(3)  # b's interval grid is anchored 3 s later than a's
    b = make_scheduler(app, clock, namespace, "node-b")
    sent: list[tuple[datetime, str]] = []
    for _ in range(240):  # two minutes in half-second steps
        clock.advance(0.5)
        for node in (b, a):
            node.tick()
        sent += [(clock.now, m["headers"]["elarion_node"]) for m in published(app)]
    times = [t for t, _ in sent]
    gaps = [(later - earlier).total_seconds() for earlier, later in zip(times, times[1:])]
    # once per 10 s for the whole cluster (12 in two minutes), not once per node (24)
    assert 11 <= len(sent) <= 12, sent
    assert all(gap >= 9.0 for gap in gaps), gaps
    skips = b.recorder.total(Outcome.SKIPPED) + a.recorder.total(Outcome.SKIPPED)
    assert skips >= 11


def test_every_node_entries_are_never_claimed(clock: FakeClock, namespace: str) -> None:
    app, nodes = cluster(3, lambda c: {
        "refresh": {"task": "tasks.refresh", "schedule": crontab(nowfun=c),
                    "options": {"placement": "every_node", "priority": 3}}}, clock, namespace)
    clock.advance(30.2)
    for node in nodes:
        node.tick()
    assert published(app) == []  # nothing on the shared queue
    for i in range(3):
        (message,) = published(app, f"elarion.node.node-{i}")
        assert message["headers"]["elarion_node"] == f"node-{i}"
        assert message["headers"]["elarion_placement"] == "every_node"
        # expires after at most one period (60 s): the worker drops a stale refresh
        assert 0 < int(message["properties"]["expiration"]) <= 60_000
    dispatched = [r for n in nodes for r in n.recorder.recent]
    assert [(r.outcome, r.placement.value) for r in dispatched] == \
        [(Outcome.DISPATCHED, "every_node")] * 3
    store = MemoryClaimStore(namespace)
    probe = ClaimRequest.for_slot("refresh", datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc),
                                  "probe")
    assert store.claim("probe", [probe])[0].won  # nobody claimed it


def test_every_node_expiry_is_never_longer_than_the_period(clock: FakeClock,
                                                           namespace: str) -> None:
    app, (node,) = cluster(1, lambda c: {
        "warm": {"task": "tasks.warm", "schedule": schedule(timedelta(seconds=5), nowfun=c),
                 "options": {"placement": "every_node", "expires": 3600}}}, clock, namespace)
    clock.advance(5.5)
    node.tick()
    (message,) = published(app, "elarion.node.node-0")
    assert int(message["properties"]["expiration"]) <= 5_000


@pytest.mark.parametrize("option", ["queue", "routing_key", "exchange"])
def test_every_node_entries_may_not_choose_their_own_route(clock: FakeClock, namespace: str,
                                                           option: str) -> None:
    app = make_app({"warm-cache": {"task": "tasks.warm", "schedule": crontab(),
                                   "options": {"placement": "every_node", option: "elsewhere"}}})
    with pytest.raises(ConfigurationError, match=f"warm-cache.*'{option}'"):
        make_scheduler(app, clock, namespace, "node-0")


def test_placement_never_reaches_the_message(clock: FakeClock, namespace: str) -> None:
    app, (node,) = cluster(1, lambda c: {
        "report": {"task": "tasks.report", "schedule": crontab(nowfun=c),
                   "options": {"placement": "cluster", "priority": 7}}}, clock, namespace)
    clock.advance(30.2)
    node.tick()
    (message,) = published(app)
    flat = repr(message)
    assert "placement'" not in flat.replace("elarion_placement'", "")
    assert message["properties"]["priority"] == 7


def test_an_unknown_placement_is_a_startup_error_naming_the_entry(clock: FakeClock,
                                                                  namespace: str) -> None:
    app = make_app({"nightly-report": {"task": "tasks.report", "schedule": crontab(),
                                       "options": {"placement": "everywhere"}}})
    with pytest.raises(ConfigurationError, match="nightly-report") as info:
        make_scheduler(app, clock, namespace, "node-0")
    assert "every_node" in str(info.value) and isinstance(info.value, ValueError)


def test_no_dsn_refuses_to_start_and_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ELARION_BEAT_DSN", raising=False)
    app = Celery("nodsn", broker="memory://", set_as_current=False)
    with pytest.raises(ConfigurationError, match="elarion_beat_dsn"):
        ClaimingScheduler(app)


def test_lazy_scheduler_opens_nothing_and_masks_the_password() -> None:
    app = Celery("lazy", broker="memory://", set_as_current=False)
    app.conf.update(elarion_beat_dsn="postgresql://beat:hunter2@db.invalid:5432/prod",
                    elarion_beat_node="node-7", elarion_beat_table="claims")
    scheduler = ClaimingScheduler(app, lazy=True)
    assert scheduler._store is None
    assert "hunter2" not in scheduler.info
    assert "postgresql+psycopg://beat:***@db.invalid:5432/prod" in scheduler.info
    assert "node-7" in scheduler.info and "claims" in scheduler.info


def test_a_broken_schedule_skips_itself_not_the_tick(clock: FakeClock, namespace: str) -> None:
    class Broken(crontab):
        def elarion_slot(self, now: datetime) -> datetime:
            raise RuntimeError("cannot name this")

    app, (node,) = cluster(1, lambda c: {
        "broken": {"task": "tasks.broken", "schedule": Broken(nowfun=c)},
        "report": {"task": "tasks.report", "schedule": crontab(nowfun=c)}}, clock, namespace)
    clock.advance(30.2)
    node.tick()
    assert [m["headers"]["elarion_job"] for m in published(app)] == ["report"]
    (skip,) = [r for r in node.recorder.recent if r.outcome is Outcome.SKIPPED]
    assert skip.job == "broken" and skip.reason is SkipReason.INVALID_ENTRY


def test_custom_schedules_fall_back_to_a_window(clock: FakeClock, namespace: str) -> None:
    class EveryTwentySeconds(schedule):
        """Looks like nothing we know: no run_every interval type, no elarion_slot."""

    class Opaque:
        def __init__(self, clock: FakeClock) -> None:
            self.inner = EveryTwentySeconds(timedelta(seconds=20), nowfun=clock)

        def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
            return self.inner.is_due(last_run_at)

        def remaining_estimate(self, last_run_at: datetime) -> timedelta:
            return self.inner.remaining_estimate(last_run_at)

        def now(self) -> datetime:
            return clock()

    app, (a, b) = cluster(2, lambda c: {
        "odd": {"task": "tasks.odd", "schedule": Opaque(c)}}, clock, namespace)
    for _ in range(30):
        clock.advance(1)
        a.tick()
        b.tick()
    assert 1 <= len(published(app)) <= 2


class FlakyStore(MemoryClaimStore):
    """A memory store that can be switched off, like a database going away."""

    down = False

    def claim(self, node: str, requests: Any) -> list[ClaimResult]:
        if self.down:
            raise StoreUnavailable("the claims database is unreachable: connection refused")
        return super().claim(node, requests)


def test_fail_closed_logs_once_per_outage_and_recovers(clock: FakeClock, namespace: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(namespace, clock=clock)
    app = make_app({"tick": {"task": "tasks.tick",
                             "schedule": cron("* * * * * *", nowfun=clock)}})
    scheduler = make_scheduler(app, clock, namespace, "node-0", store=store)
    caplog.set_level(logging.INFO, logger="celery_elarion_beat")
    store.down = True
    for _ in range(5):
        clock.advance(1)
        scheduler.tick()
    assert published(app) == []
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "claims database unavailable" in errors[0].getMessage()
    assert scheduler.recorder.total(Outcome.SKIPPED, SkipReason.CLAIM_ERROR) == 5
    store.down = False
    clock.advance(1)
    scheduler.tick()
    assert len(published(app)) == 1
    recovered = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(recovered) == 1 and "5 occurrences" in recovered[0].getMessage()


def test_all_due_entries_are_claimed_in_one_store_call(clock: FakeClock, namespace: str) -> None:
    calls: list[int] = []

    class CountingStore(MemoryClaimStore):
        def claim(self, node: str, requests: Any) -> list[ClaimResult]:
            calls.append(len(requests))
            return super().claim(node, requests)

    app = make_app({f"job-{i}": {"task": "tasks.job", "schedule": crontab(nowfun=clock)}
                    for i in range(200)})
    scheduler = make_scheduler(app, clock, namespace, "node-0",
                               store=CountingStore(namespace, clock=clock))
    calls.clear()  # the start-up purge election is one claim of its own
    clock.advance(30.2)
    scheduler.tick()
    assert calls == [200]
    assert len(published(app)) == 200


def _lazy_now() -> str:
    return "now"


def test_fingerprints_ignore_memory_addresses_of_lazy_arguments() -> None:
    from celery.beat import BeatLazyFunc

    from celery_elarion_beat.config.entries import schedule_entries
    from celery_elarion_beat.observe.fingerprint import entry_digests

    def app_with_lazy() -> Celery:
        return make_app({"lazy": {"task": "t", "schedule": crontab(),
                                  "args": [BeatLazyFunc(_lazy_now)], "kwargs": {"x": object()}}})

    first, second = (entry_digests(schedule_entries(app_with_lazy())) for _ in range(2))
    assert first == second
    other = make_app({"lazy": {"task": "t", "schedule": crontab(), "args": ["now"]}})
    assert entry_digests(schedule_entries(other)) != first


def test_big_batches_are_claimed_in_chunks_starting_at_each_nodes_rank(
        clock: FakeClock, namespace: str) -> None:
    """Two nodes released together each win the chunk their rank starts them at."""
    import threading

    barrier = threading.Barrier(2, timeout=10)
    calls: dict[str, list[list[str]]] = {"node-a": [], "node-b": []}
    armed = threading.Event()

    class TogetherStore(MemoryClaimStore):
        def claim(self, node: str, requests: Any) -> list[ClaimResult]:
            if not armed.is_set():  # the start-up purge election
                return super().claim(node, requests)
            calls[node].append([r.job for r in requests])
            answer = super().claim(node, requests)
            if len(calls[node]) == 1:
                # neither node goes on before both first chunks are claimed: a node that
                # ran ahead through its next chunks could otherwise take the other's first
                barrier.wait()
            return answer

    entries = {f"job-{i:02}": {"task": "t", "schedule": crontab(nowfun=clock)}
               for i in range(40)}
    app = make_app(entries, elarion_beat_claim_chunk=10)
    nodes = [make_scheduler(app, clock, namespace, name,
                            store=TogetherStore(namespace, clock=clock))
             for name in ("node-a", "node-b")]
    for node in nodes:
        assert node.maintenance is not None
        node.maintenance.live_nodes = ["node-a", "node-b"]
    armed.set()
    clock.advance(30.2)
    threads = [threading.Thread(target=node.tick) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 4 chunks of 10 in job order; node-a (rank 0) starts at chunk 0, node-b (rank 1) at 2
    assert calls["node-a"][0] == [f"job-{i:02}" for i in range(0, 10)]
    assert calls["node-b"][0] == [f"job-{i:02}" for i in range(20, 30)]
    assert all(len(chunk) == 10 for chunk in calls["node-a"] + calls["node-b"])
    won = {n.settings.node: {r.job for r in n.recorder.recent if r.outcome is Outcome.DISPATCHED}
           for n in nodes}
    assert won["node-a"] >= {f"job-{i:02}" for i in range(0, 10)}
    assert won["node-b"] >= {f"job-{i:02}" for i in range(20, 30)}
    assert not won["node-a"] & won["node-b"]
    assert len(won["node-a"] | won["node-b"]) == 40


def test_a_pauses_read_that_fails_at_once_does_not_skip_the_claims(
        clock: FakeClock, namespace: str) -> None:
    """A killed pooled connection fails the tick's first database call at once. When that
    call is the pauses read (the tick has every-node entries), the claims still go
    ahead: they retry on a fresh connection. Only a read that took the claim timeout (a
    stalled database) makes the tick's claims fail closed without waiting again."""

    class KilledOnce(MemoryClaimStore):
        failures = 1

        def pauses(self, jobs: Any = None) -> Any:
            if self.failures:
                self.failures -= 1
                raise StoreUnavailable("server closed the connection unexpectedly")
            return super().pauses(jobs)

    entries = {"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock)},
               "refresh": {"task": "tasks.refresh", "schedule": crontab(nowfun=clock),
                           "options": {"placement": "every_node"}}}
    app = make_app(entries)
    node = make_scheduler(app, clock, namespace, "node-0",
                          store=KilledOnce(namespace, clock=clock))
    clock.advance(30.2)
    node.tick()
    outcomes = {(r.job, r.outcome, r.reason) for r in node.recorder.recent}
    assert ("report", Outcome.DISPATCHED, None) in outcomes, outcomes
    assert ("refresh", Outcome.DISPATCHED, None) in outcomes, outcomes
    assert node.outage.since is None


def test_an_empty_schedule_sleeps_and_keeps_its_heartbeat(clock: FakeClock,
                                                           namespace: str) -> None:
    """A beat with no periodic entry (only one-offs, or a schedule still to come) must
    not spin at 20 wake-ups a second, and its node must still heartbeat."""
    app = make_app({}, elarion_beat_heartbeat_interval=30.0)
    node = make_scheduler(app, clock, namespace, "node-empty")
    assert node.maintenance is not None
    start = time.monotonic()
    elapsed = [start]
    node.maintenance.monotonic = lambda: elapsed[0]  # the heartbeat timer follows the test
    beats = node.maintenance.heartbeats
    sleeps = []
    while elapsed[0] - start < 95:
        sleeps.append(node.tick())
        clock.advance(sleeps[-1])
        elapsed[0] += sleeps[-1]
    assert min(sleeps[1:]) >= 0.5, sleeps
    assert node.maintenance.heartbeats - beats >= 3  # at 30, 60 and 90 s
