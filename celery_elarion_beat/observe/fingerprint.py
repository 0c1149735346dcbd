"""Schedule fingerprints: do all live nodes run the same schedule?

Each entry is normalized (task, schedule, placement, the options that change
where or how it runs, and a digest of its arguments) and hashed; the node's
fingerprint hashes all entry digests. Only digests leave the process: arguments
may hold secrets.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from celery.beat import BeatLazyFunc
from celery.schedules import crontab, schedule, solar

from ..config.parsers import format_duration
from ..config.placement import entry_placement
from ..schedules.cron import ADDRESS, cron, zone_name
from ..store.records import NodeState

__all__ = ["describe_schedule", "diff_entries", "drift_from", "entry_digests", "fingerprint",
           "schedule_text"]

#: Options that change where or how an entry runs (others are ignored).
_RELEVANT_OPTIONS = ("queue", "routing_key", "exchange", "priority", "expires",
                     "soft_time_limit", "time_limit")


def describe_schedule(sched: Any) -> str:
    """A stable text for *sched*, equal on every node for equal schedules (it goes into
    the fingerprint: it never changes between releases; people read
    :func:`schedule_text`)."""
    if isinstance(sched, crontab):
        return (f"crontab({sched._orig_minute} {sched._orig_hour} {sched._orig_day_of_month} "
                f"{sched._orig_month_of_year} {sched._orig_day_of_week}; tz={sched.tz})")
    if isinstance(sched, solar):
        return f"solar({sched.event}, {sched.lat}, {sched.lon})"
    if isinstance(sched, schedule):
        return f"every {sched.run_every.total_seconds():g}s"
    if isinstance(sched, cron):  # its own zone, or the app's (the same on every node)
        return f"cron({sched.expr}; tz={'app' if sched._zone is None else zone_name(sched._zone)})"
    return f"{type(sched).__module__}.{type(sched).__qualname__}"


def schedule_text(sched: Any) -> str:
    """*sched* for people (``status``, Flower): an interval as people write it
    (``every 1h30m``), any other schedule as :func:`describe_schedule` writes it."""
    if isinstance(sched, schedule) and not isinstance(sched, (crontab, solar)):
        return f"every {format_duration(sched.run_every)}"
    return describe_schedule(sched)


def _stable(value: Any) -> str:
    """A text for values JSON cannot hold, without per-process memory addresses."""
    if isinstance(value, BeatLazyFunc):
        func = value._func
        name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
        return f"lazy {name}{_stable(value._func_params)}"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=_stable)
    return ADDRESS.sub("", repr(value))


#: json.dumps(value, sort_keys=True, default=_stable), without building an encoder per call
_ENCODER = json.JSONEncoder(sort_keys=True, default=_stable)


def _digest(value: Any) -> str:
    text = _ENCODER.encode(value)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: The arguments digest of an entry without arguments (most entries): worked out once.
_NO_ARGUMENTS = _digest([[], {}])


def entry_digests(entries: Mapping[str, Any]) -> dict[str, str]:
    """Entry name -> digest of its normalized definition (ScheduleEntry objects)."""
    out = {}
    for name, entry in entries.items():
        options = entry.options or {}
        out[name] = _digest({
            "task": entry.task,
            "schedule": describe_schedule(entry.schedule),
            "placement": entry_placement(name, options).value,
            "options": {k: options[k] for k in _RELEVANT_OPTIONS if k in options},
            "arguments": _digest([list(entry.args), dict(entry.kwargs or {})])
            if entry.args or entry.kwargs else _NO_ARGUMENTS,
        })
    return out


def fingerprint(digests: Mapping[str, str]) -> str:
    """The schedule fingerprint of a node from its entry digests."""
    return _digest(sorted(digests.items()))


def drift_from(reference: NodeState, nodes: Iterable[NodeState]) -> dict[str, list[str]]:
    """Per node whose schedule differs from *reference*'s, the entries that differ.

    The one drift rule: a beat node compares the live nodes with itself, ``status``
    compares them with the schedule most live nodes run."""
    return {node.node: diff_entries(reference.entries, node.entries) for node in nodes
            if node.node != reference.node and node.fingerprint != reference.fingerprint}


def diff_entries(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """Entry names that differ, e.g. ``['report (changed)', 'cleanup (missing here)']``."""
    out = []
    for name in sorted(set(mine) | set(theirs)):
        if name not in theirs:
            out.append(f"{name} (only here)")
        elif name not in mine:
            out.append(f"{name} (missing here)")
        elif mine[name] != theirs[name]:
            out.append(f"{name} (changed)")
    return out
