"""The keys of an entry's ``options`` that beat reads and never publishes.

Each is validated when beat starts (by the module of its concept) and stripped
from the options a task is sent with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["BEAT_OPTIONS", "CATCH_UP", "CATCH_UP_MAX", "CATCH_UP_WINDOW", "DELIVERY",
           "JITTER", "OVERLAP", "OVERLAP_TIMEOUT", "PLACEMENT", "publish_options"]

#: ``cluster`` or ``every_node`` (:mod:`.placement`).
PLACEMENT = "placement"
#: ``skip``, ``latest`` or ``all`` (:mod:`.catch_up`).
CATCH_UP = "catch_up"
#: How far back missed slots are replayed: a timedelta or seconds (:mod:`.catch_up`).
CATCH_UP_WINDOW = "catch_up_window"
#: How many missed slots ``all`` replays at most (:mod:`.catch_up`).
CATCH_UP_MAX = "catch_up_max"
#: ``at_most_once`` or ``at_least_once`` (:mod:`.delivery`).
DELIVERY = "delivery"
#: ``allow`` or ``skip`` while the job's previous run is unfinished (:mod:`.overlap`).
OVERLAP = "overlap"
#: When an unfinished run counts as dead: a timedelta or seconds (:mod:`.overlap`).
OVERLAP_TIMEOUT = "overlap_timeout"

#: The most a slot's publish is delayed, a deterministic share of it per slot: a
#: timedelta or seconds (:mod:`.jitter`).
JITTER = "jitter"

#: Every option beat reads; none of them reaches the broker.
BEAT_OPTIONS = frozenset({PLACEMENT, CATCH_UP, CATCH_UP_WINDOW, CATCH_UP_MAX, DELIVERY,
                          OVERLAP, OVERLAP_TIMEOUT, JITTER})


def publish_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of an entry's options without the keys beat reads."""
    return {k: v for k, v in (options or {}).items() if k not in BEAT_OPTIONS}
