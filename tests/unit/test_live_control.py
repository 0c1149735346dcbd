"""Beat under live control, in-process (memory store, kombu's memory broker, one fake
clock): a paused job is skipped by every node with reason ``paused`` (cluster and
every-node entries alike) while other jobs go on; a trigger publishes the entry once
with ``elarion_manual=1``; jitter delays each slot by the same offset on every node."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import crontab, schedule

from celery_elarion_beat import (
    ClaimRequest,
    ClaimStore,
    ConfigurationError,
    MemoryClaimStore,
    Outcome,
    SkipReason,
    StoreUnavailable,
    cron,
)
from celery_elarion_beat.config.jitter import entry_jitter, jitter_offset
from celery_elarion_beat.operate.control import parse_until, pause_job, resume_job, trigger_job
from celery_elarion_beat.store.control_records import ALL_JOBS
from tests.helpers.fakes import FakeClock, make_app, make_scheduler, published

START = datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc)
SLOT = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"live-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


def _schedule(clock: FakeClock) -> dict:
    return {
        "report": {"task": "tasks.report", "schedule": crontab(nowfun=clock)},
        "other": {"task": "tasks.other", "schedule": crontab(nowfun=clock)},
        "refresh": {"task": "tasks.refresh", "schedule": crontab(nowfun=clock),
                    "options": {"placement": "every_node"}},
    }


def _names(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"live-{tag}-{i}" for i in range(n)]


def _skips(nodes, reason: SkipReason) -> list:
    return [r for n in nodes for r in n.recorder.recent
            if r.outcome is Outcome.SKIPPED and r.reason is reason]


def test_a_paused_job_is_skipped_by_every_node_and_the_others_go_on(
        clock: FakeClock, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    paused_cluster(clock, lambda: MemoryClaimStore(namespace, clock=clock), caplog)


def paused_cluster(clock: FakeClock, make_store: Callable[[], ClaimStore],
                   caplog: pytest.LogCaptureFixture) -> None:
    """Three nodes, one paused cluster job and one paused every-node job (shared with
    the PostgreSQL test)."""
    app = make_app(_schedule(clock))
    names = _names(3)  # kombu's memory broker shares queues across tests: names of our own
    nodes = [make_scheduler(app, clock, "", name, store=make_store()) for name in names]
    store = make_store()
    pause_job(app, store, "report", actor="alice@h1 (cli)", reason="bad input")
    pause_job(app, store, "refresh", actor="alice@h1 (cli)")
    clock.advance(30.2)
    with caplog.at_level(logging.INFO):
        for node in nodes:
            node.tick()
    sent = [m["headers"]["elarion_job"] for m in published(app)]
    assert sent == ["other"]
    for i in range(3):
        assert published(app, f"elarion.node.{names[i]}") == []  # every-node paused too
    paused = _skips(nodes, SkipReason.PAUSED)
    assert sorted((r.job, r.node) for r in paused) == sorted(
        [("report", name) for name in names] + [("refresh", name) for name in names])
    lines = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()
             and r.getMessage().startswith("beat: Skipping report")]
    assert len(lines) == 3 and all("paused by alice@h1 (cli): bad input" in line
                                   for line in lines)
    (row,) = store.find_claims(job="report")
    assert (row.state, row.publish_error) == ("skipped", "paused")
    # resumed: the next slot runs, once
    resume_job(app, store, "report", actor="bob (cli)")
    resume_job(app, store, "refresh", actor="bob (cli)")
    clock.advance(60)
    for node in nodes:
        node.tick()
    assert sorted(m["headers"]["elarion_job"] for m in published(app)) == ["other", "report"]
    assert sum(len(published(app, f"elarion.node.{name}")) for name in names) == 3
    for node in nodes:
        node.close()
    store.close()


def test_pause_all_pauses_every_entry(clock: FakeClock, namespace: str) -> None:
    app = make_app(_schedule(clock))
    (name,) = _names(1)
    node = make_scheduler(app, clock, namespace, name)
    pause_job(app, MemoryClaimStore(namespace, clock=clock), ALL_JOBS, actor="ops (cli)")
    clock.advance(30.2)
    node.tick()
    assert published(app) == [] and published(app, f"elarion.node.{name}") == []
    assert sorted(r.job for r in _skips([node], SkipReason.PAUSED)) == \
        ["other", "refresh", "report"]
    node.close()


def test_a_paused_interval_entry_moves_on_by_its_window(clock: FakeClock,
                                                        namespace: str) -> None:
    app = make_app({"poll": {"task": "tasks.poll", "schedule": schedule(timedelta(seconds=10),
                                                                        nowfun=clock)}})
    a, b = (make_scheduler(app, clock, namespace, name) for name in ("a", "b"))
    pause_job(app, MemoryClaimStore(namespace, clock=clock), "poll", actor="ops (cli)")
    for _ in range(12):
        clock.advance(5)
        a.tick()
        b.tick()
    assert published(app) == []
    skipped = MemoryClaimStore(namespace).find_claims(job="poll")
    # one decision per window for the cluster, not one per node and tick
    assert 5 <= len(skipped) <= 7 and {r.publish_error for r in skipped} == {"paused"}


def test_an_expired_pause_lets_the_job_run(clock: FakeClock, namespace: str) -> None:
    app = make_app(_schedule(clock))
    (name,) = _names(1)
    node = make_scheduler(app, clock, namespace, name)
    store = MemoryClaimStore(namespace, clock=clock)
    pause_job(app, store, "report", actor="ops (cli)",
              until=parse_until("45s", store.clock()))
    clock.advance(30.2)
    node.tick()
    assert "report" not in [m["headers"]["elarion_job"] for m in published(app)]
    clock.advance(60)
    node.tick()
    assert "report" in [m["headers"]["elarion_job"] for m in published(app)]
    assert len(published(app, f"elarion.node.{name}")) == 2  # never paused: both minutes
    node.close()


def test_a_trigger_publishes_the_entry_once_with_the_manual_header(
        clock: FakeClock, namespace: str) -> None:
    sched = _schedule(clock)
    sched["report"]["options"] = {"priority": 7, "headers": {"team": "bi"}}
    sched["report"]["kwargs"] = {"day": "today"}
    app = make_app(sched)
    store = MemoryClaimStore(namespace, clock=clock)
    done = trigger_job(app, store, "report", actor="alice@h1 (cli)", kwargs={"day": "monday"})
    again = trigger_job(app, store, "report", actor="bob@h2 (cli)")
    assert done.sent and again.duplicate is not None and not again.sent
    (message,) = published(app)
    headers = message["headers"]
    assert headers["elarion_manual"] == 1 and headers["elarion_claim"] == "manual"
    assert headers["id"] == done.task_id and headers["team"] == "bi"
    assert headers["kwargsrepr"] == repr({"day": "monday"})
    assert message["properties"]["priority"] == 7
    (row,) = store.find_claims(job="report")
    assert (row.kind, row.state, row.task_id) == ("manual", "published", done.task_id)
    forced = trigger_job(app, store, "report", actor="bob@h2 (cli)", force=True)
    assert forced.sent and len(published(app)) == 1


@pytest.mark.parametrize(("job", "kwargs", "words"), [
    ("nosuch", {}, ["'nosuch' is not an entry", "'other', 'refresh', 'report'"]),
    ("refresh", {}, ["every-node entry"]),
    ("report", {"args": {"a": 1}}, ["--args-json must be a JSON array"]),
    ("report", {"kwargs": [1]}, ["--kwargs-json must be a JSON object"]),
])
def test_a_bad_trigger_is_refused_and_writes_nothing(clock: FakeClock, namespace: str,
                                                     job: str, kwargs: dict,
                                                     words: list[str]) -> None:
    app = make_app(_schedule(clock))
    store = MemoryClaimStore(namespace, clock=clock)
    with pytest.raises(ConfigurationError) as info:
        trigger_job(app, store, job, actor="a (cli)", **kwargs)
    for word in words:
        assert word in str(info.value)
    assert store.find_claims() == [] and store.audit() == [] and published(app) == []


@pytest.mark.parametrize(("text", "words"), [
    ("soon", ["--until 'soon'", "ISO time", "duration"]),
    ("2020-01-01T00:00:00Z", ["is not after now"]),
    ("0s", ["is not after now"]),
])
def test_a_bad_until_names_the_option(text: str, words: list[str]) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_until(text, SLOT)
    for word in words:
        assert word in str(info.value)


def test_until_reads_iso_times_and_durations() -> None:
    assert parse_until("2026-11-29T06:00Z", SLOT) == SLOT + timedelta(hours=3)
    assert parse_until("2026-11-29T06:00", SLOT) == SLOT + timedelta(hours=3)  # naive: UTC
    assert parse_until("90m", SLOT) == SLOT + timedelta(minutes=90)


def test_pausing_an_unknown_job_changes_nothing(clock: FakeClock, namespace: str) -> None:
    app = make_app(_schedule(clock))
    store = MemoryClaimStore(namespace, clock=clock)
    with pytest.raises(ConfigurationError, match="'reprot' is not an entry"):
        pause_job(app, store, "reprot", actor="a (cli)")
    assert store.pauses()[1] == [] and store.audit() == []


# -- jitter -------------------------------------------------------------------------------


def test_jitter_options_are_checked_naming_the_entry() -> None:
    assert entry_jitter("r", {"jitter": timedelta(seconds=30)}, slotted=True,
                        every_node=False) == timedelta(seconds=30)
    assert entry_jitter("r", {"jitter": 0}, slotted=True, every_node=False) is None
    with pytest.raises(ConfigurationError, match=r"'r' options\['jitter'\] = -5"):
        entry_jitter("r", {"jitter": -5}, slotted=True, every_node=False)
    with pytest.raises(ConfigurationError, match="timedelta or a number"):
        entry_jitter("r", {"jitter": "lots"}, slotted=True, every_node=False)
    with pytest.raises(ConfigurationError, match="an interval entry has none"):
        entry_jitter("r", {"jitter": 5}, slotted=False, every_node=False)
    with pytest.raises(ConfigurationError, match="every-node"):
        entry_jitter("r", {"jitter": 5}, slotted=True, every_node=True)


def test_beat_refuses_a_negative_jitter_at_start(clock: FakeClock, namespace: str) -> None:
    app = make_app({"report": {"task": "t", "schedule": crontab(nowfun=clock),
                               "options": {"jitter": timedelta(seconds=-1)}}})
    with pytest.raises(ConfigurationError, match="'report'.*'jitter'"):
        make_scheduler(app, clock, namespace, "node-0")


def test_offsets_are_deterministic_and_spread_over_the_window() -> None:
    jitter = timedelta(seconds=60)
    offsets = [jitter_offset(f"report-{i}", SLOT, jitter) for i in range(1000)]
    assert offsets == [jitter_offset(f"report-{i}", SLOT, jitter) for i in range(1000)]
    assert all(timedelta(0) <= o < jitter for o in offsets)
    per_ten_seconds = [0] * 6
    for offset in offsets:
        per_ten_seconds[int(offset.total_seconds() // 10)] += 1
    # uniform: about 167 per bucket; a fixed offset or a skew fails this
    assert all(120 <= n <= 215 for n in per_ten_seconds), per_ten_seconds
    # a job's offset changes from slot to slot
    own = {jitter_offset("report-1", SLOT + timedelta(hours=h), jitter) for h in range(24)}
    assert len(own) > 20


def test_a_jittered_slot_is_published_at_its_offset_once_by_one_node(
        clock: FakeClock, namespace: str) -> None:
    jittered_cluster(clock, lambda: MemoryClaimStore(namespace, clock=clock))


def jittered_cluster(clock: FakeClock, make_store: Callable[[], ClaimStore]) -> None:
    """Three nodes, twenty jobs on one jittered hourly slot (shared with the
    PostgreSQL test)."""
    jitter = timedelta(seconds=30)
    entries = {f"job{i}": {"task": "tasks.report", "schedule": cron("0 * * * *", nowfun=clock),
                           "options": {"jitter": jitter}} for i in range(20)}
    app = make_app(entries)
    names = _names(3)  # kombu's memory broker shares queues across tests: names of our own
    nodes = [make_scheduler(app, clock, "", name, store=make_store()) for name in names]
    store = make_store()
    clock.now = SLOT - timedelta(seconds=1)
    for node in nodes:
        node.tick()
    sent_at: dict[str, datetime] = {}
    while clock.now < SLOT + jitter + timedelta(seconds=2):
        clock.advance(0.25)
        for node in nodes:
            node.tick()
        for message in published(app):
            job = message["headers"]["elarion_job"]
            assert job not in sent_at, f"{job} sent twice"
            assert message["headers"]["elarion_occurrence"] == "2026-11-29T03:00:00Z"
            sent_at[job] = clock.now
    assert sorted(sent_at) == sorted(entries)
    for job, at in sent_at.items():
        due = SLOT + jitter_offset(job, SLOT, jitter)
        assert due <= at <= due + timedelta(seconds=0.5), (job, at, due)
    # each slot is claimed once, under the slot's own name
    rows = [r for r in store.find_claims() if r.job in entries]
    assert sorted(r.job for r in rows) == sorted(entries)
    assert {r.occurrence for r in rows} == {SLOT}
    dispatched = [r for n in nodes for r in n.recorder.recent if r.outcome is Outcome.DISPATCHED]
    assert all(r.jitter is not None and 0 <= r.jitter < 30 for r in dispatched)
    for node in nodes:
        node.close()
    store.close()


def test_beat_sleeps_no_longer_than_the_next_jittered_slot(clock: FakeClock,
                                                           namespace: str) -> None:
    app = make_app({"report": {"task": "tasks.report", "schedule": cron("0 * * * *", nowfun=clock),
                               "options": {"jitter": timedelta(minutes=10)}}})
    node = make_scheduler(app, clock, namespace, "node-0")
    clock.now = SLOT + timedelta(seconds=0.1)
    node.tick()
    offset = jitter_offset("report", SLOT, timedelta(minutes=10))
    assert offset > timedelta(minutes=4)  # this slot's offset: 4 min 56.679 s
    assert published(app) == []
    clock.advance(0.2)
    wait = node.tick()
    assert wait <= (SLOT + offset - clock.now).total_seconds() + 1e-6
    node.close()


def test_a_node_started_within_the_jitter_waits_for_it_instead_of_replaying(
        clock: FakeClock, namespace: str) -> None:
    """Node b starts 5 s after the slot, while node a holds the slot's jobs for their
    offsets: the ledger has no claim of them yet, but they are not missed (catch_up
    'latest' would replay them all at once, the herd jitter is there to spread)."""
    jitter = timedelta(seconds=60)
    entries = {f"job{i}": {"task": "tasks.report", "schedule": cron("0 * * * *", nowfun=clock),
                           "options": {"jitter": jitter, "catch_up": "latest"}}
               for i in range(30)}
    app = make_app(entries)
    store = MemoryClaimStore(namespace, clock=clock)
    earlier = SLOT - timedelta(hours=1)
    for job in entries:  # the cluster ran the previous slot
        (won,) = store.claim("node-a", [ClaimRequest.for_slot(job, earlier, f"{job}-prev")])
        assert won.won
    clock.now = SLOT - timedelta(seconds=1)
    a = make_scheduler(app, clock, namespace, _names(1)[0])
    a.tick()
    while clock.now < SLOT + timedelta(seconds=5):
        clock.advance(0.25)
        a.tick()
    b = make_scheduler(app, clock, namespace, _names(1)[0])
    sent: dict[str, datetime] = {}
    while clock.now < SLOT + jitter + timedelta(seconds=2):
        clock.advance(0.25)
        for node in (a, b):
            node.tick()
        for message in published(app):
            job = message["headers"]["elarion_job"]
            assert job not in sent, f"{job} sent twice"
            assert message["headers"]["elarion_catch_up"] == 0, f"{job} replayed"
            sent[job] = clock.now
    assert sorted(sent) == sorted(entries)
    for job, at in sent.items():
        assert at >= SLOT + jitter_offset(job, SLOT, jitter), (job, at)
    for node in (a, b):
        node.close()


def test_a_whole_cluster_restarted_within_the_jitter_still_sends_the_slot(
        clock: FakeClock, namespace: str) -> None:
    """No node was up to hold the slot: the restarted node holds it itself."""
    jitter = timedelta(seconds=60)
    app = make_app({"report": {"task": "tasks.report",
                               "schedule": cron("0 * * * *", nowfun=clock),
                               "options": {"jitter": jitter, "catch_up": "latest"}}})
    store = MemoryClaimStore(namespace, clock=clock)
    store.claim("node-a", [ClaimRequest.for_slot("report", SLOT - timedelta(hours=1), "prev")])
    offset = jitter_offset("report", SLOT, jitter)
    clock.now = SLOT + offset / 2
    node = make_scheduler(app, clock, namespace, _names(1)[0])
    sent = []
    while clock.now < SLOT + jitter + timedelta(seconds=2):
        clock.advance(0.25)
        node.tick()
        sent += [(clock.now, m["headers"]["elarion_catch_up"]) for m in published(app)]
    assert len(sent) == 1 and sent[0][1] == 0
    assert SLOT + offset <= sent[0][0] <= SLOT + offset + timedelta(seconds=0.5)
    node.close()


class _PausesDown(MemoryClaimStore):
    """A memory store whose pauses cannot be read while ``down``: a database outage, or
    a bug of the store (any other exception)."""

    down = False
    error: Exception = StoreUnavailable("the claims database is unreachable (test)")

    def pauses(self, jobs=None):  # type: ignore[no-untyped-def]
        if self.down:
            raise self.error
        return super().pauses(jobs)


@pytest.mark.parametrize("error", [StoreUnavailable("unreachable (test)"),
                                   RuntimeError("a store bug (test)")])
def test_every_node_pauses_hold_through_an_outage_and_follow_the_ledger_after(
        clock: FakeClock, namespace: str, caplog: pytest.LogCaptureFixture,
        error: Exception) -> None:
    app = make_app({"refresh": {"task": "tasks.refresh", "schedule": crontab(nowfun=clock),
                                "options": {"placement": "every_node"}}})
    store = _PausesDown(namespace, clock=clock)
    store.error = error
    (name,) = _names(1)
    node = make_scheduler(app, clock, namespace, name, store=store)
    queue = f"elarion.node.{name}"
    pause_job(app, store, "refresh", actor="ops (cli)")
    clock.advance(30.2)
    node.tick()  # 03:00: paused, as read
    store.down = True
    resume_job(app, MemoryClaimStore(namespace, clock=clock), "refresh", actor="ops (cli)")
    caplog.set_level(logging.INFO, logger="celery_elarion_beat")
    for _ in range(2):  # 03:01, 03:02: unreadable: the pause last read holds
        clock.advance(60)
        node.tick()
    assert published(app, queue) == []
    assert len(_skips([node], SkipReason.PAUSED)) == 3
    warnings = [r for r in caplog.records if "could not read the pauses" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING  # once per outage
    store.down = False
    clock.advance(60)
    node.tick()  # 03:03: read again: resumed
    assert len(published(app, queue)) == 1
    assert any("can be read again" in r.getMessage() for r in caplog.records)
    node.close()


def test_an_every_node_entry_never_paused_runs_through_an_outage(
        clock: FakeClock, namespace: str) -> None:
    app = make_app({"refresh": {"task": "tasks.refresh", "schedule": crontab(nowfun=clock),
                                "options": {"placement": "every_node"}}})
    store = _PausesDown(namespace, clock=clock)
    store.down = True
    (name,) = _names(1)
    node = make_scheduler(app, clock, namespace, name, store=store)
    clock.advance(30.2)
    node.tick()
    assert len(published(app, f"elarion.node.{name}")) == 1
    node.close()


def test_a_trigger_with_arguments_the_task_cannot_take_writes_nothing(
        clock: FakeClock, namespace: str) -> None:
    app = make_app({"report": {"task": "tasks.typed", "schedule": crontab(nowfun=clock)}})

    @app.task(name="tasks.typed")
    def typed(day: str = "today") -> str:
        return day

    store = MemoryClaimStore(namespace, clock=clock)
    with pytest.raises(ConfigurationError, match="cannot take these arguments.*--kwargs-json"):
        trigger_job(app, store, "report", actor="a (cli)", kwargs={"full": True})
    assert store.find_claims() == [] and store.audit() == [] and published(app) == []
    done = trigger_job(app, store, "report", actor="a (cli)", kwargs={"day": "monday"})
    assert done.sent and len(published(app)) == 1
