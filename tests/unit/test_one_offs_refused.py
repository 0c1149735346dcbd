"""A beat whose database role has no grants on the one-offs table (a least-privilege
role of a version before one-offs, docs/howto/database-role.md): the runner says so
once, asks again once per heartbeat interval, and sends the one-offs once granted,
without a restart. tests/docs/test_database_role.py shows that a real server's
refusal reaches the runner as :class:`StoreRefused`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from celery import Celery

from celery_elarion_beat import MemoryClaimStore, OneOffState, StoreRefused, schedule_once
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.one_offs.api import close_stores, get_one_off
from celery_elarion_beat.one_offs.runner import OneOffRunner
from tests.helpers.fakes import FakeClock, make_app, published

START = datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc)
REFUSAL = ("the claims database memory://x refused this node (grant the role the rights "
           "beat needs (docs/howto/database-role.md)): permission denied for table "
           "elarion_scheduler_oneoffs")


class Refusing(MemoryClaimStore):
    """A shared store that refuses the one-offs while :attr:`refuse` is set."""

    shared = True  # as a database: beat polls
    refuse = True
    asked = 0

    def _refused(self) -> None:
        Refusing.asked += 1
        if Refusing.refuse:
            raise StoreRefused(REFUSAL)

    def next_one_off_due(self) -> Any:
        self._refused()
        return super().next_one_off_due()

    def lease_one_offs(self, *args: Any, **kwargs: Any) -> Any:
        self._refused()
        return super().lease_one_offs(*args, **kwargs)


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"unit-{uuid.uuid4().hex}"
    Refusing.refuse, Refusing.asked = True, 0
    yield name
    close_stores()
    MemoryClaimStore.reset(name)


def remind_app(namespace: str) -> Celery:
    app = make_app({}, elarion_beat_heartbeat_interval=30.0)
    app.conf.elarion_beat_dsn = f"memory://{namespace}"

    @app.task(name="proj.tasks.remind", shared=False)
    def remind(*args: Any, **kwargs: Any) -> None:
        return None

    return app


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "one-offs-refused"]


def test_a_refused_role_gets_one_warning_and_its_one_offs_once_granted(
        namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    app = remind_app(namespace)
    clock = FakeClock(START)
    store = Refusing(namespace, clock=clock)
    row = schedule_once(app, "proj.tasks.remind", args=(1,), eta=START)
    now = [1000.0]
    runner = OneOffRunner(app, Settings.from_app(app), lambda: store, clock,
                          monotonic=lambda: now[0])
    waits = []
    with caplog.at_level(logging.DEBUG, logger="celery_elarion_beat.one_offs.runner"):
        for _ in range(60):  # one minute of one-second wakes
            waits.append(runner.run())
            now[0] += 1.0
        assert Refusing.asked == 2  # at 0 s and at 30 s: once per heartbeat interval
        assert max(waits) <= 1.0  # beat still wakes each second for its entries
        (warning,) = refusals(caplog)
        assert warning.levelno == logging.WARNING
        message = warning.getMessage()
        assert message.startswith("beat: no one-offs are sent, the database refuses them")
        assert "database-role.md" in message
        assert published(app) == []
        # the grants are added: sent at the next look, no restart
        Refusing.refuse = False
        now[0] += 30.0
        runner.run()
        assert [m["headers"]["id"] for m in published(app)] == [row.id]
        done = get_one_off(app, row.id)
        assert done is not None and done.state is OneOffState.PUBLISHED
        # revoked again: said again, once
        Refusing.refuse = True
        for _ in range(70):
            now[0] += 1.0
            runner.run()
    assert len(refusals(caplog)) == 2
