"""The threads ClaimingScheduler starts end with it: at close, or when it is dropped.

Beat's event thread (``elarion-events``) starts at the first event a scheduler sends
(its first heartbeat, at start). A scheduler is closed by beat at exit; one nobody
closes (an embedded beat, Celery's own tests of their Scheduler run against ours) must
not keep its thread alive either: the thread holds its sender weakly, and ends once the
scheduler is collected. The schedulers here are built the way Celery's
``t/unit/app/test_beat.py`` builds its Scheduler: ``app=`` an app on the ``memory://``
broker, claims in ``memory://`` (or SQLite), entries added with ``add``.
"""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from unittest.mock import Mock

import pytest
from celery import Celery
from celery.schedules import schedule

from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore
from tests.helpers.fakes import published
from tests.helpers.threads import lingering

PREFIX = "elarion"


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"threads-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


def stock_app(dsn: str, **conf: object) -> Celery:
    app = Celery(f"thr{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.conf.update(elarion_beat_dsn=dsn, beat_schedule={}, result_expires=None,
                    task_default_queue=f"q-{uuid.uuid4().hex[:8]}", **conf)
    return app


def ours(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in set(threading.enumerate()) - before
                  if t.name.startswith(PREFIX) and t.is_alive())


def exercise(scheduler: ClaimingScheduler, app: Celery) -> None:
    """What Celery's tests do with a Scheduler: add entries, tick, apply_async."""

    @app.task(shared=False)
    def add(x: int = 0, y: int = 0) -> None:
        pass

    scheduler.add(name="due", task=add.name, schedule=schedule(60), args=(1, 2),
                  last_run_at=datetime.now(timezone.utc) - timedelta(minutes=5))
    scheduler.add(name="later", task=add.name, schedule=schedule(3600))
    scheduler.tick()
    scheduler.apply_async(scheduler.Entry(task=add.name, app=app))
    add.apply_async = Mock()  # type: ignore[method-assign]
    scheduler.apply_async(scheduler.Entry(task=add.name, app=app))


def test_close_stops_every_thread_the_scheduler_started(namespace: str) -> None:
    before = set(threading.enumerate())
    app = stock_app(f"memory://{namespace}")
    scheduler = ClaimingScheduler(app=app)
    exercise(scheduler, app)
    assert ours(before) == ["elarion-events"]  # the first heartbeat's event started it
    scheduler.close()
    assert ours(before) == []  # joined by close: no wait needed
    # the tick's claimed send, then stock beat's apply_async (no claim) once unmocked
    assert [m["headers"].get("elarion_job") for m in published(app)] == ["due", None]


@pytest.mark.parametrize("claims", ["memory", "sqlite"])
def test_a_scheduler_dropped_without_close_leaves_no_thread(
        claims: str, namespace: str, tmp_path: Path) -> None:
    before = set(threading.enumerate())
    dsn = f"memory://{namespace}" if claims == "memory" \
        else f"sqlite:///{tmp_path / 'claims.db'}"
    app = stock_app(dsn)
    scheduler = ClaimingScheduler(app=app)
    exercise(scheduler, app)
    assert ours(before) == ["elarion-events"]
    events = scheduler.events
    assert events is not None
    events.flush()
    del scheduler, events
    assert [t.name for t in lingering(before, PREFIX)] == []


def test_many_dropped_schedulers_leave_no_thread(namespace: str) -> None:
    """Celery's test_Scheduler makes dozens of schedulers and closes three of them."""
    before = set(threading.enumerate())
    for _ in range(20):
        app = stock_app(f"memory://{namespace}")
        ClaimingScheduler(app=app).tick()
    gc.collect()
    assert [t.name for t in lingering(before, PREFIX)] == []


def test_a_lazy_scheduler_and_one_without_events_start_no_thread(namespace: str) -> None:
    before = set(threading.enumerate())
    app = stock_app(f"memory://{namespace}")
    banner = ClaimingScheduler(app=app, lazy=True)  # what beat's banner builds
    assert banner.info
    quiet = ClaimingScheduler(app=stock_app(f"memory://{namespace}", elarion_beat_events=False))
    exercise(quiet, app)
    try:
        assert ours(before) == []
    finally:
        quiet.close()
