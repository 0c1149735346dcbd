"""Run one real beat tick of examples/proj on two nodes, in this process; print JSON.

``python tests/examples/proj_tick.py DSN TABLE``. Used by test_proj.py in a fresh
interpreter, because importing a Celery project registers its tasks with every
app created afterwards (Celery's shared tasks), which would leak into other tests.

Every entry is made due (last run two days ago); node-1 ticks, then node-2 ticks.
The broker is kombu's in-memory transport, read back at the end.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

PROJ_DIR = Path(__file__).resolve().parents[2] / "examples" / "proj"


def tick(app: Any, node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from celery_elarion_beat import ClaimingScheduler

    app.conf.elarion_beat_node = node
    scheduler = ClaimingScheduler(app, lazy=False)
    long_ago = datetime.now(timezone.utc) - timedelta(days=2)
    for entry in scheduler.schedule.values():
        entry.last_run_at = long_ago
    try:
        scheduler.tick()
        records = [{"job": r.job, "outcome": r.outcome.value, "kind": r.kind and r.kind.value,
                    "reason": r.reason and r.reason.value, "winner": r.winner}
                   for r in scheduler.recorder.recent]
        claims = [{"job": c.job, "node": c.node, "kind": c.kind,
                   "occurrence": c.occurrence.isoformat()} for c in scheduler.store.find_claims()]
    finally:
        scheduler.close()
    return records, claims


def drain(app: Any, queue: str) -> list[dict[str, Any]]:
    out = []
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        try:
            while True:
                try:
                    message = simple.get(block=False)
                except simple.Empty:
                    return out
                message.ack()
                out.append({k: v for k, v in message.headers.items()
                            if k == "task" or k.startswith("elarion_")})
        finally:
            simple.close()


def main(dsn: str, table: str) -> None:
    sys.path.insert(0, str(PROJ_DIR))
    import proj

    app = proj.celery_app
    app.loader.import_default_modules()  # what a worker or beat does: proj.tasks
    app.conf.update(broker_url="memory://", elarion_beat_dsn=dsn, elarion_beat_table=table,
                    elarion_beat_events=False)
    schedule = app.conf.beat_schedule
    result: dict[str, Any] = {
        "schedule": {name: {"type": type(spec["schedule"]).__name__,
                            "task": spec["task"], "options": spec.get("options", {})}
                     for name, spec in schedule.items()},
        "tasks": sorted(t for t in app.tasks if t.startswith("proj.")),
        "timezone": str(app.conf.timezone),
    }
    result["node-1"], result["claims"] = tick(app, "node-1")
    result["node-2"], _ = tick(app, "node-2")
    result["shared_queue"] = drain(app, app.conf.task_default_queue)
    result["node_queues"] = {node: drain(app, f"elarion.node.{node}")
                             for node in ("node-1", "node-2")}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
