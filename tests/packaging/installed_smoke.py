"""Run by tests/packaging/test_build.py with the python of a fresh venv that has only the
built wheel (and its dependencies) installed; prints JSON.

The scheduler comes through the ``celery.beat_schedulers`` entry point ``elarion``,
claims over ``memory://`` and ticks once: its due entry is published to kombu's
in-memory broker and read back. Imports nothing from the source tree.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from importlib.metadata import entry_points
from typing import Any


def main() -> None:
    from celery import Celery

    import celery_elarion_beat

    (point,) = entry_points(group="celery.beat_schedulers", name="elarion")
    scheduler_class = point.load()
    app = Celery("smoke", broker="memory://smoke", set_as_current=False)
    app.conf.update(
        elarion_beat_dsn="memory://", elarion_beat_node="smoke-node",
        elarion_beat_events=False, task_default_queue="smoke",
        beat_schedule={"tick": {"task": "smoke.tick", "schedule": timedelta(seconds=10)}})
    scheduler = scheduler_class(app, lazy=False)
    for entry in scheduler.schedule.values():
        entry.last_run_at = datetime.now(timezone.utc) - timedelta(days=1)
    try:
        scheduler.tick()
        outcomes = [(r.job, r.outcome.value) for r in scheduler.recorder.recent]
    finally:
        scheduler.close()
    headers: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("smoke")
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            message.ack()
            headers.append({k: str(v) for k, v in message.headers.items()
                            if k == "task" or k.startswith("elarion_")})
        queue.close()
    json.dump({"version": celery_elarion_beat.__version__,
               "module": celery_elarion_beat.__file__,
               "scheduler": f"{scheduler_class.__module__}.{scheduler_class.__qualname__}",
               "outcomes": outcomes, "published": headers}, sys.stdout)


if __name__ == "__main__":
    main()
