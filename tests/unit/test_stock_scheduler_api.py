"""ClaimingScheduler through stock beat's Scheduler API, as Celery's own tests use it.

The behaviours come from Celery's ``t/unit/app/test_beat.py`` (class ``test_Scheduler``),
restated here in our words against ClaimingScheduler built the way those tests build
their scheduler: an app on the ``memory://`` broker, the scheduler made with
``app=``, entries added with ``add`` or ``update_from_dict``, then ``tick``,
``apply_async``, ``close``. Left out are the tests that pin stock beat's protocol of one
entry per tick (``tick() == 0`` after a send) and its 10 ms early wake-up
(``1 - 0.010``): ClaimingScheduler sends every due entry in one tick and wakes on
time (:meth:`~celery_elarion_beat.ClaimingScheduler.adjust`); the wake-up is checked
here in its own words instead.

Two more differences are deliberate: an entry without a ``task`` is left out with an
ERROR (entries are checked when the schedule is set up), and a scheduler ticked within
its first seconds wakes for its read of the claims ledger (:data:`IN_FLIGHT` after start),
so the tests of the sleep a tick returns tick a scheduler past that read (:func:`settled`).

Every test also checks that the scheduler leaves no ``elarion`` thread behind once
it is dropped (the fixture ``no_thread_left``).
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest.mock import Mock, patch
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry, event_t
from celery.schedules import schedule

from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore
from celery_elarion_beat.beat.recovery import IN_FLIGHT
from tests.helpers.fakes import FakeClock
from tests.helpers.threads import no_new_threads


class fixed_schedule(schedule):  # noqa: N801 - a schedule, named like Celery's own
    """An interval schedule whose answer is fixed: due or not, and the next run in
    *next_run* seconds (Celery's tests call theirs ``mocked_schedule``)."""

    def __init__(self, due: bool, next_run: float | None,
                 nowfun: Any = None) -> None:
        super().__init__(timedelta(seconds=1), nowfun=nowfun)
        self._answer = (due, next_run)

    def is_due(self, last_run_at: datetime) -> tuple[bool, float | None]:  # type: ignore[override]
        return self._answer  # type: ignore[return-value]

    def default_now(self) -> datetime:  # what _when asks of an entry
        return self.now()


def settled(app: Celery) -> ClaimingScheduler:
    """A scheduler past its start: its read of the ledger (IN_FLIGHT after start) done."""
    clock = FakeClock(datetime.now(timezone.utc))
    scheduler = ClaimingScheduler(app=app, clock=clock)
    clock.advance(IN_FLIGHT.total_seconds() + 1)
    scheduler.tick()
    return scheduler


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"stock-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


@pytest.fixture
def app(namespace: str) -> Celery:
    app = Celery(f"stock{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.conf.update(elarion_beat_dsn=f"memory://{namespace}", beat_schedule={},
                    result_expires=None, task_default_queue=f"q-{uuid.uuid4().hex[:8]}")
    return app


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """The schedulers a test made and dropped (closed or not) leave no thread behind."""
    with no_new_threads("elarion"):
        yield


def test_a_custom_schedule_dict_is_kept_until_set_up(app: Celery) -> None:
    custom = {"foo": "bar"}
    scheduler = ClaimingScheduler(app=app, schedule=custom, lazy=True)
    assert scheduler.data is custom


def test_apply_async_uses_the_registered_task(app: Celery) -> None:
    @app.task(shared=False)
    def foo() -> None:
        pass

    foo.apply_async = Mock(name="foo.apply_async")  # type: ignore[method-assign]
    scheduler = ClaimingScheduler(app=app)
    scheduler.apply_async(scheduler.Entry(task=foo.name, app=app))
    scheduler.apply_async(scheduler.Entry(task=foo.name, app=app, args=None, kwargs=None))
    assert foo.apply_async.call_count == 2


def test_apply_async_syncs_every_n_tasks(app: Celery) -> None:
    app.conf.beat_sync_every = 2

    @app.task(shared=False)
    def not_sync() -> None:
        pass

    not_sync.apply_async = Mock()  # type: ignore[method-assign]
    scheduler = ClaimingScheduler(app=app)
    assert scheduler.sync_every_tasks == 2
    scheduler._do_sync = Mock()  # type: ignore[method-assign]
    scheduler.apply_async(scheduler.Entry(task=not_sync.name, app=app))
    assert scheduler._tasks_since_sync == 1
    scheduler.apply_async(scheduler.Entry(task=not_sync.name, app=app))
    scheduler._do_sync.assert_called_with()


def test_info_and_maybe_entry(app: Celery) -> None:
    scheduler = ClaimingScheduler(app=app)
    assert isinstance(scheduler.info, str)
    entry = scheduler.Entry(name="add every", task="tasks.add", app=app)
    assert scheduler._maybe_entry(entry.name, entry) is entry
    assert scheduler._maybe_entry("add every", {"task": "tasks.add"})


def test_set_schedule_keeps_the_mapping(app: Celery) -> None:
    scheduler = ClaimingScheduler(app=app)
    scheduler.schedule = {"foo": "bar"}
    assert scheduler.data == {"foo": "bar"}


def test_the_backend_cleanup_entry_comes_with_expiring_results(app: Celery) -> None:
    scheduler = ClaimingScheduler(app=app)
    scheduler.install_default_entries({})
    assert "celery.backend_cleanup" not in scheduler.data
    app.conf.result_expires = 30
    app.backend.supports_autoexpire = False
    scheduler = ClaimingScheduler(app=app)
    scheduler.install_default_entries({})
    assert "celery.backend_cleanup" in scheduler.data


def test_a_due_entry_is_sent_by_tick(app: Celery) -> None:
    @app.task(shared=False)
    def add(x: int, y: int, foo: str = "") -> None:
        pass

    add.apply_async = Mock()  # type: ignore[method-assign]
    scheduler = ClaimingScheduler(app=app)
    scheduler.add(name="due", task=add.name, schedule=fixed_schedule(True, 30),
                  args=(1, 2), kwargs={"foo": "bar"})
    scheduler.tick()
    args, kwargs = add.apply_async.call_args[0][:2]
    assert (list(args), kwargs) == ([1, 2], {"foo": "bar"})


def test_a_pending_entry_wakes_beat_when_it_is_due_not_earlier(app: Celery) -> None:
    scheduler = settled(app)
    scheduler.add(name="pending", schedule=fixed_schedule(False, 1))
    assert scheduler.tick() == pytest.approx(1.0, abs=0.005)  # stock: 1 - 0.010


def test_the_soonest_entry_sets_the_sleep(app: Celery) -> None:
    scheduler = settled(app)
    nums = [20, 10, 25, 8, 12, 6]  # within max_interval (here the heartbeat interval, 30 s)
    scheduler.update_from_dict({f"ticks{i}": {"schedule": fixed_schedule(False, n)}
                                for i, n in enumerate(nums)})
    assert scheduler.tick() == pytest.approx(min(nums), abs=0.005)


def test_max_interval_is_honoured(app: Celery) -> None:
    scheduler = settled(app)
    maxi = scheduler.max_interval
    scheduler.add(name="far", schedule=fixed_schedule(False, maxi * 4))
    assert scheduler.tick() == pytest.approx(maxi, abs=0.01)
    scheduler.add(name="no-remain", schedule=fixed_schedule(False, None))
    assert scheduler.tick() == pytest.approx(maxi, abs=0.01)


def test_a_tick_keeps_the_microseconds(app: Celery) -> None:
    now_ts = 1514797200.2
    now = datetime.fromtimestamp(now_ts, timezone.utc)
    scheduler = ClaimingScheduler(app=app)
    scheduler.add(name="half", schedule=schedule(timedelta(seconds=0.5), nowfun=lambda: now))
    scheduler.tick()
    assert scheduler._heap[0].time == pytest.approx(now_ts + 0.5)  # stock: - 0.010


def test_a_changed_schedule_is_on_the_heap_at_the_next_tick(app: Celery) -> None:
    scheduler = ClaimingScheduler(app=app)
    assert scheduler._heap is None
    five = schedule(5)
    scheduler.add(name="changing", schedule=five)
    scheduler.tick()
    assert scheduler._heap[0].entry.schedule == five
    scheduler.add(name="changing", schedule=schedule(10))
    scheduler.tick()
    assert scheduler._heap[0].entry.schedule == schedule(10)


def test_the_interface_sync_setup_close(app: Celery) -> None:
    scheduler = ClaimingScheduler(app=app)
    scheduler.sync()
    scheduler.setup_schedule()
    scheduler.close()


def test_merge_inplace(app: Celery) -> None:
    a = ClaimingScheduler(app=app)
    b = ClaimingScheduler(app=app)
    a.update_from_dict({"foo": {"task": "t.foo", "schedule": fixed_schedule(True, 10)},
                        "bar": {"task": "t.bar", "schedule": fixed_schedule(True, 20)}})
    b.update_from_dict({"bar": {"task": "t.bar", "schedule": fixed_schedule(True, 40)},
                        "baz": {"task": "t.baz", "schedule": fixed_schedule(True, 10)}})
    a.merge_inplace(b.schedule)
    assert "foo" not in a.schedule
    assert "baz" in a.schedule
    assert a.schedule["bar"].schedule._answer == (True, 40)


def test_when_is_the_same_instant_in_any_zone(app: Celery) -> None:
    utc = datetime(2000, 10, 10, 10, 10, 10, 10, tzinfo=timezone.utc)
    casey = utc.astimezone(ZoneInfo("Antarctica/Casey"))
    scheduler = ClaimingScheduler(app=app)
    assert scheduler._when(fixed_schedule(True, 10, lambda: utc), 10) \
        == scheduler._when(fixed_schedule(True, 10, lambda: casey), 10)


def test_populate_heap_gives_every_event_stock_beats_priority(app: Celery) -> None:
    """Stock beat's events are ``event_t(time, 5, entry)``; so are ours (issue #35)."""
    scheduler = ClaimingScheduler(app=app)
    scheduler.update_from_dict({"foo": {"schedule": fixed_schedule(True, 10)}})
    with patch.object(ClaimingScheduler, "_when", return_value=1):
        scheduler.populate_heap()
    assert scheduler._heap == [event_t(1, 5, scheduler.schedule["foo"])]


def test_every_event_pushed_keeps_priority_5_and_ties_go_by_name(app: Celery) -> None:
    """Events due at the same time come off the heap by entry name (the order the claim
    pipeline sorts a batch in), whatever their order in the schedule, and without
    comparing the entries; the events pushed by a tick have priority 5 too."""
    clock_now = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
    scheduler = ClaimingScheduler(app=app)
    names = ["m", "b", "z", "a", "k"]
    scheduler.update_from_dict({n: {"schedule": fixed_schedule(False, 60, lambda: clock_now)}
                                for n in names})
    scheduler.populate_heap()
    heap = list(scheduler._heap)
    popped = []
    while heap:
        popped.append(heapq.heappop(heap).entry.name)
    assert popped == sorted(names)
    scheduler.tick()
    assert {event.priority for event in scheduler._heap} == {5}


def test_entries_that_tie_are_never_compared(app: Celery) -> None:
    """Two events at one time never fall back on comparing their entries (stock beat's
    equal priorities would: by id in Celery 5, a different order on every run)."""

    class Uncomparable(ScheduleEntry):
        def __lt__(self, other: object) -> bool:
            raise AssertionError("entries compared")

        __gt__ = __lt__

    scheduler = ClaimingScheduler(app=app)
    scheduler.Entry = Uncomparable  # type: ignore[misc]
    scheduler.update_from_dict({f"e{i}": {"schedule": fixed_schedule(False, 60)}
                                for i in range(50)})
    with patch.object(ClaimingScheduler, "_when", return_value=1):
        scheduler.populate_heap()
    assert len(scheduler._heap) == 50
