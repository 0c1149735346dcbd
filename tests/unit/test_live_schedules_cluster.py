"""Database entries (live schedules) on a simulated cluster: three real
ClaimingScheduler nodes over the memory store and one fake clock.

An edit neither fires nor loses a run and never runs twice; it takes effect at its
effective time; an interval keeps its phase; a node that has not heard of an edit
yet has its claim refused and decides the same slot again; zoned entries keep their
wall times across both daylight-saving changes; code and database entries share one
name space."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat.config.live_entries import EntryDefinition, LiveEntry
from celery_elarion_beat.live_schedules.rules import code_digest
from celery_elarion_beat.store.entry_records import EntryChange
from celery_elarion_beat.testing import BeatClock, Cluster

UTC = timezone.utc
START = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def app_of(code: dict | None = None, **conf) -> Celery:
    app = Celery(f"live{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(beat_schedule=code or {}, elarion_beat_dsn="memory://",
                    elarion_beat_db_entries=True, elarion_beat_db_entry_tasks="proj.*",
                    timezone="UTC", **conf)
    return app


def cron(expr: str, tz: str | None = None, **kw) -> EntryDefinition:
    schedule = {"cron": expr, **({"tz": tz} if tz else {})}
    return EntryDefinition.of(kw.pop("task", "proj.tasks.job"), schedule, **kw)


def every(seconds: float, **kw) -> EntryDefinition:
    return EntryDefinition.of(kw.pop("task", "proj.tasks.job"), {"every": seconds}, **kw)


class Live:
    """A cluster and the writes of its database entries."""

    def __init__(self, app: Celery, nodes: int = 3, start: datetime = START) -> None:
        self.clock = BeatClock(start)
        self.cluster = Cluster(app, nodes, self.clock, finish_runs=True)
        self.store = self.cluster.nodes[0].store
        self.name = self.store.cluster  # the app's cluster (the run pins it)

    def write(self, action: str, name: str, definition: EntryDefinition | None = None,
              **kw) -> int:
        wrote = self.store.write_entries(self.name, [EntryChange(action, name, definition,
                                                                 **kw)], "test")
        assert wrote.version is not None
        self.cluster.wake()  # as a NOTIFY would
        return wrote.version

    def change(self, change: EntryChange) -> None:
        self.store.write_entries(self.name, [change], "test")
        self.cluster.wake()

    def run(self, seconds: float) -> list:
        self.cluster.advance(seconds)
        return self.cluster.sent()

    def close(self) -> None:
        self.cluster.close()


@pytest.fixture
def live():
    made: list[Live] = []

    def make(app: Celery | None = None, **kw) -> Live:
        made.append(Live(app or app_of(), **kw))
        return made[-1]

    yield make
    for one in made:
        one.close()


def slots(sent, job: str = "job") -> list[datetime]:
    return [o.slot for o in sent if o.job == job]


def once_each(sent) -> None:
    counts = Counter((o.job, o.slot) for o in sent)
    assert all(n == 1 for n in counts.values()), counts


def test_an_added_entry_runs_from_its_effective_time_each_slot_once(live) -> None:
    cl = live()
    cl.run(5)
    cl.write("add", "job", cron("*/2 * * * * *"))  # at 12:00:05
    sent = cl.run(10)
    once_each(sent)
    assert [s.second for s in slots(sent)] == [6, 8, 10, 12, 14]
    assert {o.task for o in sent} == {"proj.tasks.job"}


def test_an_edit_follows_the_new_rhythm_from_its_effective_time_and_fires_nothing(live
                                                                                  ) -> None:
    cl = live()
    cl.write("add", "job", cron("*/2 * * * * *"))
    first = cl.run(7)  # 12:00:07
    cl.write("edit", "job", cron("*/3 * * * * *"), expected=1)
    sent = first + cl.run(10)  # to 12:00:17
    once_each(sent)
    assert [s.second for s in slots(sent)] == [2, 4, 6, 9, 12, 15]  # nothing at the edit
    revisions = {r.occurrence.second: r.revision for r in cl.store.find_claims(job="job")}
    assert revisions == {2: 1, 4: 1, 6: 1, 9: 2, 12: 2, 15: 2}  # the ledger says which


def test_a_future_edit_leaves_the_old_rhythm_until_its_effective_time(live) -> None:
    cl = live()
    cl.write("add", "job", cron("*/2 * * * * *"))
    cl.run(1)
    cl.write("edit", "job", cron("*/5 * * * * *"), effective_at=START + timedelta(seconds=9))
    sent = cl.run(20)  # to 12:00:21
    once_each(sent)
    assert [s.second for s in slots(sent)] == [2, 4, 6, 8, 10, 15, 20]


def test_a_removed_entry_stops_and_a_disabled_one_waits_for_its_enable(live) -> None:
    cl = live()
    cl.write("add", "job", cron("* * * * * *"))
    cl.run(3.5)
    cl.write("disable", "job", cron("* * * * * *", enabled=False))
    assert slots(cl.run(10)) == []  # nothing while disabled (it was sending every second)
    cl.write("enable", "job", cron("* * * * * *"))  # 12:00:13.5: no overdue run
    sent = cl.run(3)
    assert [s.second for s in slots(sent)] == [14, 15, 16]
    cl.write("remove", "job")
    assert cl.run(10) == []


def test_an_interval_keeps_its_phase_when_its_length_changes(live) -> None:
    cl = live()
    cl.write("add", "job", every(10))  # first run at 12:00:10
    cl.run(25)  # runs at :10, :20
    cl.write("edit", "job", every(4))  # 12:00:25: the rhythm 20 + 4k goes on: 28, 32
    sent = cl.run(10)
    assert [o.sent_at.second for o in sent] == [28, 32]
    cl.write("edit", "job", every(4), restart=True)  # 12:00:35: from here, 39, 43
    sent = cl.run(9)
    assert [o.sent_at.second for o in sent] == [39, 43]


def test_a_node_that_did_not_hear_of_an_edit_decides_the_slot_again(live) -> None:
    cl = live(nodes=1)
    node = cl.cluster.nodes[0]
    cl.run(1)
    cl.write("add", "job", cron("*/10 * * * * *", args=[1]))
    cl.run(4)
    node.live._next_poll = datetime.max.replace(tzinfo=UTC)  # deaf: it polls no more
    node.live._wakeups = None  # and hears no NOTIFY
    cl.write("edit", "job", cron("*/10 * * * * *", args=[2]))  # at 12:00:05
    sent = cl.run(6)  # 12:00:10: claimed under revision 1, refused, decided again
    assert [(o.slot.second, o.args) for o in sent] == [(10, (2,))]
    (row,) = [r for r in cl.store.find_claims(job="job") if r.occurrence.second == 10]
    assert row.revision == 2
    assert node.recorder.counts.get(("job", "skipped", "stale-revision"), 0) == 0


def test_a_node_that_did_not_hear_of_a_removal_sends_nothing(live) -> None:
    cl = live(nodes=1)
    node = cl.cluster.nodes[0]
    cl.run(1)
    cl.write("add", "job", cron("*/10 * * * * *"))
    cl.run(4)
    node.live._next_poll = datetime.max.replace(tzinfo=UTC)
    node.live._wakeups = None
    cl.write("remove", "job")
    assert cl.run(10) == []
    assert "job" not in node.schedule


def test_a_delete_and_recreate_within_one_poll_is_seen(live) -> None:
    cl = live()
    cl.write("add", "job", cron("*/2 * * * * *", args=[1]))
    cl.run(3)
    cl.write("remove", "job")
    cl.write("add", "job", cron("*/2 * * * * *", args=[2]))
    sent = cl.run(4)
    once_each(sent)
    assert [(o.slot.second, o.args) for o in sent] == [(4, (2,)), (6, (2,))]


@pytest.mark.parametrize(("definition", "start", "days", "wall"), [
    # Berlin: spring forward 2026-03-29, fall back 2026-10-25
    (cron("0 30 2 * * *", tz="Europe/Berlin"), "2026-03-27T12:00:00Z", 4, (2, 30)),
    (cron("0 30 2 * * *", tz="Europe/Berlin"), "2026-10-23T12:00:00Z", 4, (2, 30)),
    # New York: spring forward 2026-03-08, fall back 2026-11-01 (Celery's crontab fields)
    (EntryDefinition.of("proj.tasks.job", {"crontab": "30 1 * * *", "tz": "America/New_York"}),
     "2026-03-06T12:00:00Z", 4, (1, 30)),
    (EntryDefinition.of("proj.tasks.job", {"crontab": "30 1 * * *", "tz": "America/New_York"}),
     "2026-10-30T12:00:00Z", 4, (1, 30)),
])
def test_zoned_entries_keep_their_wall_time_across_both_dst_changes(live, definition, start,
                                                                    days, wall) -> None:
    cl = live(start=datetime.fromisoformat(start.replace("Z", "+00:00")))
    cl.write("add", "job", definition)
    sent = cl.run(days * 86400)
    once_each(sent)
    zone = ZoneInfo(definition.schedule.tz or "UTC")
    local = [o.slot.astimezone(zone) for o in sent]
    assert len(local) == days  # one a day: the spring gap runs once, the fall hour once
    for moment in local:
        if (moment.hour, moment.minute) != wall:
            # the wall time did not exist (spring forward): it runs when the clocks jump
            assert moment.hour == wall[0] + 1 and moment.minute == 0
        assert moment.second == 0


def test_a_database_entry_never_takes_the_name_of_a_code_entry(live) -> None:
    app = app_of({"job": {"task": "proj.tasks.code", "schedule": crontab()}})
    cl = live(app)
    cl.write("add", "job", cron("* * * * * *"))  # a deploy raced the add: code wins
    sent = cl.run(120)
    assert {o.task for o in sent} == {"proj.tasks.code"}
    assert "job" in cl.cluster.nodes[0].live.problems


def test_an_override_replaces_the_code_entry_and_its_removal_brings_it_back(live) -> None:
    code = {"job": {"task": "proj.tasks.code", "schedule": crontab()}}
    app = app_of(code)
    cl = live(app)
    node = cl.cluster.nodes[0]
    digest = code_digest("job", node.live.code["job"])
    cl.change(EntryChange("override", "job", cron("*/30 * * * * *",
                                                  task="proj.tasks.override"),
                          code_digest=digest))
    sent = cl.run(120)
    assert {o.task for o in sent} == {"proj.tasks.override"}
    assert len(sent) == 4 and not node.live.problems
    cl.write("remove", "job")
    sent = cl.run(125)
    assert [o.task for o in sent] == ["proj.tasks.code", "proj.tasks.code"]


def test_an_override_of_a_changed_code_entry_is_reported_and_the_policy_decides(live) -> None:
    code = {"job": {"task": "proj.tasks.code", "schedule": crontab()}}
    keep = live(app_of(code))
    keep.change(EntryChange("override", "job", cron("*/30 * * * * *",
                                                    task="proj.tasks.override"),
                            code_digest="0" * 16))
    assert {o.task for o in keep.run(60)} == {"proj.tasks.override"}
    assert "changed in code" in keep.cluster.nodes[0].live.problems["job"]
    code_wins = live(app_of(code, elarion_beat_db_override_policy="code"))
    code_wins.change(EntryChange("override", "job", cron("*/30 * * * * *",
                                                         task="proj.tasks.override"),
                                 code_digest="0" * 16))
    assert {o.task for o in code_wins.run(120)} == {"proj.tasks.code"}


def test_an_override_of_a_code_entry_gone_from_the_code_runs_nothing(live) -> None:
    cl = live()
    cl.change(EntryChange("override", "gone", cron("* * * * * *"), code_digest="0" * 16))
    assert cl.run(10) == []
    assert "no longer in the code" in cl.cluster.nodes[0].live.problems["gone"]


def test_a_task_not_allowed_is_left_out_when_loaded(live) -> None:
    cl = live()
    cl.write("add", "job", cron("* * * * * *", task="other.tasks.evil"))  # raw-written
    assert cl.run(5) == []
    assert "elarion_beat_db_entry_tasks" in cl.cluster.nodes[0].live.problems["job"]


def test_an_idle_tick_reads_nothing_between_polls(live) -> None:
    cl = live(nodes=1)
    node = cl.cluster.nodes[0]
    cl.write("add", "job", cron("0 0 * * * *"))
    cl.run(2)
    version_reads = []
    store = node.store
    real = store.entries_version
    store.entries_version = lambda cluster: version_reads.append(1) or real(cluster)
    for _ in range(50):
        node.tick()  # the clock stands still: ticks within one poll interval
    assert version_reads == []
    assert isinstance(node.schedule["job"], LiveEntry)
