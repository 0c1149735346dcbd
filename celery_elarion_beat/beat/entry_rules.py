"""An entry's rules, worked out once: its overlap rule and its jitter.

Each tick's entry is a copy (an empty ``options`` is a new dict), so the rules are
kept per entry name and worked out again only when the entry's options change.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery.beat import ScheduleEntry

from ..config.jitter import entry_jitter
from ..config.overlap import OverlapRule, entry_overlap
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..schedules.slots import is_slotted
from .sender import LOGGER

__all__ = ["EntryRules"]

logger = logging.getLogger(LOGGER)


class EntryRules:
    """The overlap rule and the jitter of each entry of one node's schedule."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._overlaps: dict[str, tuple[Any, OverlapRule | None]] = {}
        self._jitters: dict[str, tuple[Any, timedelta | None]] = {}

    def overlap(self, entry: ScheduleEntry) -> OverlapRule | None:
        """The entry's overlap rule (:mod:`..config.overlap`), worked out again only when
        its options change (each tick's entry is a copy: an empty ``options`` is a new
        dict)."""
        held = self._overlaps.get(entry.name)
        if held is not None and (held[0] is entry.options or held[0] == entry.options):
            return held[1]
        task = self.app.tasks.get(entry.task)
        limit = getattr(task, "time_limit", None) or self.app.conf.task_time_limit
        rule = entry_overlap(entry.name, entry.options, self.settings.overlap_timeout,
                             self.settings.publish_timeout,
                             time_limit=float(limit) if limit else None,
                             every_node=entry_placement(entry.name, entry.options)
                             is Placement.EVERY_NODE)
        self._overlaps[entry.name] = (entry.options, rule)
        return rule

    def jitter(self, entry: ScheduleEntry) -> timedelta | None:
        """The entry's jitter (:mod:`..config.jitter`), worked out again only when its
        options change; an entry whose jitter became invalid since start has none."""
        held = self._jitters.get(entry.name)
        if held is not None and (held[0] is entry.options or held[0] == entry.options):
            return held[1]
        try:
            jitter = entry_jitter(entry.name, entry.options, slotted=is_slotted(entry.schedule),
                                  every_node=entry_placement(entry.name, entry.options)
                                  is Placement.EVERY_NODE)
        except ConfigurationError as exc:
            logger.error("beat: %s; it runs without jitter", exc,
                         extra={"action": "invalid-entry", "job": entry.name,
                                "node": self.settings.node})
            jitter = None
        self._jitters[entry.name] = (entry.options, jitter)
        return jitter
