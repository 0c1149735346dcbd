"""Shared fakes of the in-process tests: one clock, an isolated app, its published messages."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from celery import Celery

from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore

__all__ = ["FakeClock", "Wire", "make_app", "make_scheduler", "published"]


class FakeClock:
    """One clock shared by the scheduler and the schedules (nowfun)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def make_app(schedule_: dict[str, Any], **conf: Any) -> Celery:
    app = Celery(f"unit{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.conf.update(beat_schedule=schedule_, elarion_beat_dsn="memory://", result_expires=None,
                    task_default_queue=f"q-{uuid.uuid4().hex[:8]}", **conf)
    return app


def make_scheduler(app: Celery, clock: FakeClock, namespace: str, node: str,
                   store: Any = None) -> ClaimingScheduler:
    app.conf.elarion_beat_node = node
    return ClaimingScheduler(app, clock=clock,
                             store=store or MemoryClaimStore(namespace, clock=clock))


def published(app: Celery, queue_name: str | None = None) -> list[dict[str, Any]]:
    """Drain the app's default queue (or *queue_name*) on the in-memory broker."""
    out = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(queue_name or app.conf.task_default_queue)
        while True:
            try:
                message = queue.get_nowait()
            except Exception:
                break
            out.append({"headers": message.headers, "properties": message.properties})
            message.ack()
        queue.close()
    return out


class Wire:
    """Stands in for Celery's event dispatcher: keeps what would go on the wire."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, type_: str, **fields: Any) -> None:
        self.sent.append({"type": type_, **fields})

    def close(self) -> None:
        pass
