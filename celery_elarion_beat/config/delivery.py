"""Delivery: what happens to an occurrence whose winner never published it.

``at_most_once`` (the default): the orphaned claim is reported (a WARNING, an
``elarion-orphaned`` event, ``status``), never sent again. ``at_least_once``: a
live node takes the orphan over and publishes it with the original task id, so a
task that checks its id (or is idempotent) dedupes the rare double.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from ..exceptions import ConfigurationError
from .options import DELIVERY

__all__ = ["Delivery", "entry_delivery"]


class Delivery(str, enum.Enum):
    """What a node does with another node's orphaned claim of an entry."""

    AT_MOST_ONCE = "at_most_once"
    AT_LEAST_ONCE = "at_least_once"

    def __str__(self) -> str:
        return self.value


def entry_delivery(name: str, options: Mapping[str, Any] | None, default: Delivery) -> Delivery:
    """The delivery of the entry *name*, or :class:`ConfigurationError` naming it."""
    raw = (options or {}).get(DELIVERY)
    if raw is None:
        return default
    try:
        return Delivery(raw)
    except ValueError:
        allowed = ", ".join(repr(d.value) for d in Delivery)
        raise ConfigurationError(
            f"beat_schedule entry {name!r} has options[{DELIVERY!r}] = {raw!r}; use one of "
            f"{allowed} (or celery_elarion_beat.Delivery)") from None
