"""The one-offs' part of tests/docs/test_database_role.py: each documented role does its
one-off work as that role (docs/howto/database-role.md, docs/howto/one-offs.md).

* the workers' role (the processes that schedule): ``schedule_once`` with a key, twice
  (one row), without a key, in its own transaction (``connection=``: the outbox, rolled
  back and committed), ``cancel`` and ``get_one_off``;
* the beat role: LISTEN hears the workers' NOTIFY (PostgreSQL), reads the next due
  time, leases (two nodes: disjoint), publishes, fails, releases, takes an expired
  lease over, and purges the finished rows;
* the operators' role: lists (``one-offs list``, Flower), shows and cancels.

What the roles may not do is checked by the callers with raw SQL, beside the other
tables' refusals; here, that a role the runner cannot lease with gets
:class:`StoreRefused` (the runner's one WARNING, tests/unit/test_one_offs_refused.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from celery_elarion_beat import (
    OneOffState,
    Settings,
    StoreRefused,
    cancel,
    get_one_off,
    open_store,
    schedule_once,
)
from celery_elarion_beat.config.dsn import normalize_dsn
from celery_elarion_beat.one_offs.api import close_stores
from celery_elarion_beat.testing._harness import wait_until

TASK = "proj.tasks.remind"
LEASE = timedelta(seconds=60)


def scheduling_app(settings: dict[str, Any]) -> Celery:
    """An application process (a worker, the web app) that schedules one-offs."""
    app = Celery("one-off-roles", set_as_current=False)
    for key, value in {**settings, "elarion_beat_create_table": False}.items():
        app.conf[key] = value
    return app


def exercise_one_offs(beat: dict[str, Any], worker: dict[str, Any],
                      operator: dict[str, Any]) -> None:
    """Every role's one-off work, as that role (the settings of each: DSN, schema)."""
    app = scheduling_app(worker)
    beat_store = open_store(Settings.from_mapping({**beat, "elarion_beat_create_table": False}))
    ops = open_store(Settings.from_mapping({**operator, "elarion_beat_create_table": False}))
    listener = beat_store.one_off_wakeups()  # PostgreSQL: LISTEN, as the beat role
    try:
        if listener is not None:
            assert listener.poll() is True  # connected and listening
            assert listener.poll() is False
        # the workers' role schedules: a key twice is one row
        first = schedule_once(app, TASK, args=[1], key="remind-1")
        again = schedule_once(app, TASK, args=[1], key="remind-1")
        assert again.id == first.id and again.state is OneOffState.SCHEDULED
        if listener is not None:  # the NOTIFY needed no grant either
            wait_until(listener.poll, 10.0, message="the beat role's LISTEN heard nothing")
        failing = schedule_once(app, TASK, args=[2])
        handed_back = schedule_once(app, TASK, args=[3])
        later = schedule_once(app, TASK, countdown=3600, key="remind-later")
        for_ops = schedule_once(app, TASK, countdown=3600)
        # the outbox: in the role's own transaction, gone with a rollback
        engine = create_engine(normalize_dsn(worker["elarion_beat_dsn"]), poolclass=NullPool)
        try:
            with pytest.raises(ZeroDivisionError), engine.begin() as conn:
                schedule_once(app, TASK, key="outbox-rolled-back", connection=conn)
                raise ZeroDivisionError
            with engine.begin() as conn:
                outbox = schedule_once(app, TASK, args=[4], key="outbox", connection=conn)
                # the key taken in the same transaction: that row, and the transaction goes on
                twice = schedule_once(app, TASK, args=[4], key="outbox", connection=conn)
                assert twice.id == outbox.id
        finally:
            engine.dispose()
        assert get_one_off(app, "outbox-rolled-back") is None
        assert cancel(app, "remind-later").state is OneOffState.CANCELLED
        assert cancel(app, "remind-later").state is OneOffState.CANCELLED  # no change
        # the operators' role lists, shows and cancels
        listed = {o.id: o.state for o in ops.one_offs(limit=100)}
        assert listed == {first.id: OneOffState.SCHEDULED, failing.id: OneOffState.SCHEDULED,
                          handed_back.id: OneOffState.SCHEDULED,
                          later.id: OneOffState.CANCELLED, for_ops.id: OneOffState.SCHEDULED,
                          outbox.id: OneOffState.SCHEDULED}
        shown = ops.cancel_one_off(for_ops.id)
        assert shown is not None and shown.state is OneOffState.CANCELLED
        # the beat role leases the four due ones; a second node finds none left
        assert beat_store.next_one_off_due() is not None
        leased = beat_store.lease_one_offs("node-1", limit=10, lease=LEASE)
        assert {o.id for o in leased} == {first.id, failing.id, handed_back.id, outbox.id}
        assert beat_store.lease_one_offs("node-2", limit=10, lease=LEASE) == []
        too_late = ops.cancel_one_off(first.id)  # the operators: leased, too late
        assert too_late is not None and too_late.state is OneOffState.LEASED
        beat_store.finish_one_offs("node-1", [first.id, outbox.id],
                                   {failing.id: "task 'x' is not registered"},
                                   released=[handed_back.id])
        # an expired lease is taken over by another node
        (again_leased,) = beat_store.lease_one_offs("node-1", limit=10, lease=timedelta(0))
        assert again_leased.id == handed_back.id
        (taken,) = beat_store.lease_one_offs("node-2", limit=10, lease=LEASE)
        assert taken.id == handed_back.id and taken.one_off.attempts == 3
        beat_store.finish_one_offs("node-2", [handed_back.id], {})
        states = {o.id: (o.state, o.node) for o in ops.one_offs(limit=100)}
        assert states[first.id] == (OneOffState.PUBLISHED, "node-1")
        assert states[failing.id][0] is OneOffState.FAILED
        assert states[handed_back.id] == (OneOffState.PUBLISHED, "node-2")
        assert beat_store.next_one_off_due() is None
        # the purge (beat's pass, `elarion-beat purge`), as the beat role
        assert beat_store.purge_one_offs(timedelta(0)) == 6
        assert ops.one_offs(limit=100) == []
        # a role without beat's grants cannot lease: refused, which the runner reports
        store = open_store(Settings.from_mapping({**worker, "elarion_beat_create_table": False}))
        try:
            schedule_once(app, TASK)
            with pytest.raises(StoreRefused, match="database-role"):
                store.lease_one_offs("node-3", limit=10, lease=LEASE)
        finally:
            store.close()
    finally:
        if listener is not None:
            listener.close()
        close_stores()
        ops.close()
        beat_store.close()
