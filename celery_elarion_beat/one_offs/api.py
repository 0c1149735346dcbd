"""Durable one-offs: run a task once, later, from any process.

``schedule_once(app, "proj.tasks.remind", args=..., eta=...)`` writes one row in the
one-offs table beside the claims table; no beat and no broker are needed to
schedule. Every beat node (:class:`~..beat.scheduler.ClaimingScheduler`) leases the due
rows each tick, one node per row, and publishes the task with task id = the
one-off's id (:mod:`.runner`). A node that dies between the lease and the
publish loses its lease after ``elarion_beat_one_offs_lease`` and another node sends
it, under the same task id: at least once.

* ``eta`` must be timezone-aware; ``countdown`` counts from the database clock
  (one clock for every node); neither: due now.
* ``key``: scheduling twice with the same key writes one row; the second call
  returns the first row, whatever its state.
* ``connection``: a SQLAlchemy ``Connection`` (``Session.connection()``) or a
  psycopg 3 connection in a transaction on the claims database: the row commits
  (or rolls back) with the caller's own writes (the outbox pattern).
* ``cancel(app, id_or_key)`` wins while the one-off is ``scheduled``; once a node
  leased it the cancel loses and returns the row as it is.

The arguments are serialized with ``app.conf.task_serializer`` now, and loaded
(checked against ``accept_content``) by the node that sends them. The API opens one
store per app and settings, closed at exit.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from kombu.serialization import dumps

from ..config.names import KEY_LENGTH
from ..exceptions import ConfigurationError, OneOffNotFound
from ..schedules.clock import as_utc
from ..store.one_off_records import LeasedOneOff, NewOneOff, OneOff, OneOffState
from ..store.registry import app_store, close_app_stores
from ..store.schema import one_offs_table

__all__ = ["LeasedOneOff", "OneOff", "OneOffNotFound", "OneOffState", "apply_at", "cancel",
           "get_one_off", "list_one_offs", "one_offs_table", "schedule_once"]

#: Options the one-off sets itself (or that schedule_once takes as arguments).
_RESERVED_OPTIONS = ("task_id", "eta", "countdown", "args", "kwargs", "producer", "connection")

#: The store of an app (opened once per app and settings, closed at exit).
store_for = app_store
#: Close the stores the APIs opened (at exit; tests may call it).
close_stores = close_app_stores


def schedule_once(app: Any, task: Any, args: Sequence[Any] = (),
                  kwargs: Mapping[str, Any] | None = None, *, eta: datetime | None = None,
                  countdown: float | None = None, options: Mapping[str, Any] | None = None,
                  key: str | None = None, connection: Any = None) -> OneOff:
    """Run *task* (a name or a Celery task) once at *eta* (aware) or *countdown*
    seconds from now on the database clock (neither: now); see the module docstring."""
    name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"schedule_once: task must be a task name or a Celery task, "
                                 f"not {task!r}")
    if eta is not None and countdown is not None:
        raise ConfigurationError("schedule_once: give eta or countdown, not both")
    if eta is not None and (not isinstance(eta, datetime) or eta.utcoffset() is None):
        raise ConfigurationError(
            f"schedule_once: eta must be a timezone-aware datetime, not {eta!r}: a naive "
            "time means a different instant on every machine; pass e.g. "
            "datetime(..., tzinfo=timezone.utc)")
    delay = None
    if eta is None:
        delay = 0.0 if countdown is None else _countdown(countdown)
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= KEY_LENGTH):
        raise ConfigurationError(f"schedule_once: key must be text of 1 to {KEY_LENGTH} "
                                 f"characters, not {key!r}")
    opts = _check_options(options or {})
    content_type, encoding, body = _payload(app, name, args, kwargs or {})
    new = NewOneOff(id=str(uuid.uuid4()), task=name, content_type=content_type,
                    content_encoding=encoding, body=body, options=opts,
                    due=as_utc(eta) if eta is not None else None, delay=delay, key=key)
    return store_for(app).add_one_off(new, connection=connection)


def apply_at(task: Any, eta: datetime | None = None, args: Sequence[Any] = (),
             kwargs: Mapping[str, Any] | None = None, **kw: Any) -> OneOff:
    """The task-side shortcut: ``apply_at(remind, eta, args=(42,), key="remind-42")`` is
    ``schedule_once(remind.app, remind, args=(42,), eta=eta, key="remind-42")``."""
    return schedule_once(task.app, task, args, kwargs, eta=eta, **kw)


def cancel(app: Any, id_or_key: str) -> OneOff:
    """Cancel the one-off of this id or key: ``cancelled`` if it was still scheduled,
    else the row as it is (leased or published: too late). :class:`OneOffNotFound`
    when there is none."""
    found = store_for(app).cancel_one_off(id_or_key)
    if found is None:
        raise OneOffNotFound(f"no one-off has the id or key {id_or_key!r}")
    return found


def get_one_off(app: Any, id_or_key: str) -> OneOff | None:
    """The one-off of this id or key, or None."""
    found = store_for(app).one_offs(id_or_key=id_or_key, limit=1)
    return found[0] if found else None


def list_one_offs(app: Any, *, states: Collection[OneOffState] | None = None,
                  limit: int = 100) -> list[OneOff]:
    """The one-offs in *states* (all when None), latest due first."""
    return store_for(app).one_offs(states=states, limit=limit)


def _countdown(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ConfigurationError(f"schedule_once: countdown must be a number of seconds, "
                                 f"not {value!r}")
    return max(0.0, float(value))


def _check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise ConfigurationError(f"schedule_once: option names are text, not {name!r}")
        if name in _RESERVED_OPTIONS:
            raise ConfigurationError(
                f"schedule_once: the option {name!r} is not allowed: "
                + ("the task id is the one-off's id" if name == "task_id"
                   else "pass it to schedule_once itself" if name in ("eta", "countdown", "args",
                                                                       "kwargs", "connection")
                   else "the sending beat node chooses it"))
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"schedule_once: the option {name!r} = {value!r} cannot be stored: options "
                f"must be JSON values (text, numbers, lists, mappings): {exc}") from None
        out[name] = value
    return out


def _payload(app: Any, task: str, args: Sequence[Any],
             kwargs: Mapping[str, Any]) -> tuple[str, str, bytes]:
    serializer = app.conf.task_serializer
    try:
        content_type, encoding, data = dumps(  # type: ignore[no-untyped-call]
            [list(args), dict(kwargs)], serializer=serializer)
    except Exception as exc:
        raise ConfigurationError(
            f"schedule_once: the arguments of {task} cannot be serialized with "
            f"task_serializer = {serializer!r}: {exc}") from exc
    body = data.encode(encoding) if isinstance(data, str) else bytes(data)
    return content_type, encoding, body
