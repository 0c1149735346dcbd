"""A user's own schedule (tests/plugin/user_proj.py) through ``simulate``, as a user
writes the test: the DST weekends of Europe/Berlin pinned with slot lists worked out
by hand, each occurrence sent once (every-node ones once per node), and the user's
app left as it was."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

from celery_elarion_beat.testing import SimulatedOccurrence, simulate
from tests.plugin import user_proj

UTC = timezone.utc
NODES = {"node-0", "node-1", "node-2"}


def utc(day: int, hour: int, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def of(sent: list[SimulatedOccurrence], job: str) -> list[SimulatedOccurrence]:
    return [o for o in sent if o.job == job]


def test_spring_forward_weekend() -> None:
    # Berlin, 2026-03-29: at 02:00 CET (01:00 UTC) the clocks jump to 03:00 CEST.
    # The span is local 2026-03-28 00:00 CET (03-27 23:00 UTC) to 03-30 00:00 CEST
    # (03-29 22:00 UTC): 47 hours.
    sent = simulate(user_proj.app, "2026-03-28", "2026-03-30")

    report = of(sent, "nightly-report")
    # 02:30 CET on the 28th; on the 29th 02:30 does not exist: the slot is the instant
    # the clocks jump (01:00 UTC), and Celery's crontab fires it at 03:30 CEST
    assert [o.slot for o in report] == [utc(28, 1, 30), utc(29, 1)]
    assert [o.sent_at for o in report] == [utc(28, 1, 30), utc(29, 1, 30)]

    # every hour: every UTC hour of the span, local 00:00..23:00 then 00:00..23:00
    # without the 02:00 that does not exist (24 + 23 slots)
    hourly = of(sent, "hourly-sync")
    assert [o.slot for o in hourly] == [utc(27, 23) + timedelta(hours=k) for k in range(47)]

    # every node at local 00, 06, 12 and 18 h: CET (UTC+1) on the 28th, CEST (UTC+2)
    # from 06:00 on the 29th; once per node
    cache = of(sent, "refresh-cache")
    expected = [utc(27, 23), utc(28, 5), utc(28, 11), utc(28, 17),
                utc(28, 23), utc(29, 4), utc(29, 10), utc(29, 16)]
    assert sorted(Counter(o.slot for o in cache).items()) == [(slot, 3) for slot in expected]
    for slot in expected:
        assert {o.node for o in cache if o.slot == slot} == NODES

    # an interval counts from the start, in real time (DST does not move it)
    polls = of(sent, "poll-partner")
    assert [o.slot for o in polls] == [utc(27, 23) + timedelta(hours=4 * k) for k in range(1, 12)]

    _sent_once_by_one_node(sent)


def test_fall_back_weekend() -> None:
    # Berlin, 2026-10-25: at 03:00 CEST (01:00 UTC) the clocks go back to 02:00 CET.
    # The span is local 10-24 00:00 CEST (10-23 22:00 UTC) to 10-26 00:00 CET
    # (10-25 23:00 UTC): 49 hours.
    sent = simulate(user_proj.app, "2026-10-24", "2026-10-26")

    def oct_(day: int, hour: int, minute: int = 0) -> datetime:
        return utc(day, hour, minute, month=10)

    # 02:30 happens twice on the 25th (00:30 and 01:30 UTC): it runs once, at the first
    report = of(sent, "nightly-report")
    assert [o.slot for o in report] == [oct_(24, 0, 30), oct_(25, 0, 30)]

    # an every-hour job runs in both 02:00 hours: 24 + 25 slots, every UTC hour
    hourly = of(sent, "hourly-sync")
    assert [o.slot for o in hourly] == [oct_(23, 22) + timedelta(hours=k) for k in range(49)]

    cache = of(sent, "refresh-cache")
    expected = [oct_(23, 22), oct_(24, 4), oct_(24, 10), oct_(24, 16),
                oct_(24, 22), oct_(25, 5), oct_(25, 11), oct_(25, 17)]
    assert sorted(Counter(o.slot for o in cache).items()) == [(slot, 3) for slot in expected]

    polls = of(sent, "poll-partner")
    assert [o.slot for o in polls] == [oct_(23, 22) + timedelta(hours=4 * k)
                                       for k in range(1, 13)]

    _sent_once_by_one_node(sent)


def _sent_once_by_one_node(sent: list[SimulatedOccurrence]) -> None:
    cluster = [o for o in sent if o.placement.value == "cluster"]
    keys = Counter((o.job, o.slot) for o in cluster)
    assert [key for key, count in keys.items() if count > 1] == []
    assert {o.node for o in cluster} <= NODES
    assert len({o.node for o in cluster}) > 1  # the winners vary: none is promised
    for o in sent:
        assert o.headers["elarion_job"] == o.job and o.headers["elarion_node"] == o.node
        assert o.headers["task"] == o.task
        assert o.kind.value == ("window" if o.job == "poll-partner" else "slot")
    for o in cluster:
        assert o.headers["elarion_occurrence"] == o.slot.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_users_app_is_left_as_it_was() -> None:
    app = user_proj.app
    schedules = {name: entry["schedule"] for name, entry in app.conf.beat_schedule.items()}
    before = {name: (vars(s).copy() if hasattr(s, "__dict__") else s)
              for name, s in schedules.items()}
    simulate(app, "2026-03-28T00:00", "2026-03-28T06:00", nodes=2)
    after = {name: entry["schedule"] for name, entry in app.conf.beat_schedule.items()}
    assert after == schedules and all(after[n] is schedules[n] for n in schedules)
    for name, s in schedules.items():
        if hasattr(s, "__dict__"):
            assert vars(s) == before[name], name  # no app bound, no nowfun set
    assert "now" not in vars(app)  # the app still reads the real clock
    assert app._pool is None  # no connection to the user's broker was ever made
    assert app.conf.elarion_beat_dsn == "postgresql://beat:secret@db.invalid:5432/app"
