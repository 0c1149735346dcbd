"""A user's app, copied for a simulated beat cluster: same schedule, fake clock, no I/O.

:func:`beat_app` builds a new Celery app from the user's configuration, as it is,
and changes only what must not leave the test: the broker is ``memory://``, the
claims store the in-memory one (``elarion_beat_dsn = "memory://<namespace>"``),
no result backend, no events. Each ``beat_schedule`` entry is copied with its
schedule copied too, so the schedules read the fake clock (``nowfun`` and the
app's ``now()``) and the user's app and schedule objects are never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import schedule as interval_schedule

from ..exceptions import ConfigurationError
from .beat_clock import BeatClock

__all__ = ["beat_app", "copy_schedule"]

#: What a simulated beat never takes from the user's configuration.
_OVERRIDES: dict[str, Any] = {
    "broker_url": "memory://",
    "broker_read_url": None,
    "broker_write_url": None,
    "result_backend": None,
    "task_always_eager": False,
    "elarion_beat_events": False,
    "elarion_beat_log_format": "text",
    "elarion_beat_claims_layout": "plain",
    "elarion_beat_django_database": None,
}


def beat_app(app: Any, clock: BeatClock, namespace: str) -> Any:
    """A copy of *app* for simulated beats: its configuration and ``beat_schedule``,
    time from *clock*, claims in the memory store *namespace*, broker ``memory://``."""
    conf = dict(app.conf.table(with_defaults=False, censored=False))
    prefix = getattr(app, "namespace", None)
    overrides = dict(_OVERRIDES, elarion_beat_dsn=f"memory://{namespace}",
                     beat_schedule=copy_schedule(app.conf.beat_schedule or {}))
    for key, value in overrides.items():
        conf[key] = value
        if prefix:  # app.config_from_object(..., namespace="CELERY"): CELERY_BROKER_URL
            conf[f"{prefix}_{key}".upper()] = value
    sim = Celery(app.main, set_as_current=False)
    sim.config_from_object(conf, namespace=prefix)
    timezone = sim.timezone

    def now() -> Any:
        return clock().astimezone(timezone)

    sim.now = now  # what every schedule without a nowfun reads
    return sim


def copy_schedule(entries: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A copy of a ``beat_schedule``: each entry a new dict, its ``options`` a new dict,
    its schedule a copy that reads the app's clock (no ``nowfun``, no app yet: beat
    binds it to the app it runs in). Plain numbers and timedeltas stay as they are."""
    out: dict[str, dict[str, Any]] = {}
    for name, fields in entries.items():
        if not isinstance(fields, Mapping):
            out[name] = fields  # beat reports it as a broken entry
            continue
        entry = dict(fields)
        if entry.get("options") is not None:
            entry["options"] = dict(entry["options"])
        sched = entry.get("schedule")
        if sched is not None and not isinstance(sched, (int, float, timedelta)):
            entry["schedule"] = _copy(name, sched)
        out[name] = entry
    return out


def _copy(name: str, sched: Any) -> Any:
    try:
        twin = copy.copy(sched)
    except Exception as exc:
        raise ConfigurationError(
            f"beat_schedule entry {name!r}: its schedule {sched!r} cannot be copied for a "
            f"simulation ({exc}); give its class a working __reduce__ or __copy__") from exc
    if isinstance(twin, interval_schedule) or hasattr(twin, "nowfun"):
        twin.nowfun = None
    if hasattr(twin, "_app"):
        twin._app = None
    return twin
