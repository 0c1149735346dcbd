"""Placement: whether an entry is claimed cluster-wide or sent by every node."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from ..exceptions import ConfigurationError
from .options import PLACEMENT

__all__ = ["PLACEMENT_OPTION", "Placement", "entry_placement"]

#: Options an every-node entry may not set: its node queue decides its routing.
ROUTING_OPTIONS = ("queue", "routing_key", "exchange")

#: The key in an entry's ``options`` that selects its placement.
PLACEMENT_OPTION = PLACEMENT


class Placement(str, enum.Enum):
    """Where an entry's occurrences run.

    ``cluster`` (the default): each occurrence is claimed and sent by exactly one node.
    ``every_node``: never claimed; every node sends every occurrence. Use it for jobs
    whose output lives in process memory (a per-node cache, a local lookup table).
    """

    CLUSTER = "cluster"
    EVERY_NODE = "every_node"

    def __str__(self) -> str:
        return self.value


def entry_placement(name: str, options: Mapping[str, Any] | None) -> Placement:
    """Return the placement of the entry *name*, or raise :class:`ConfigurationError`."""
    raw = (options or {}).get(PLACEMENT_OPTION, Placement.CLUSTER)
    try:
        placement = Placement(raw)
    except ValueError:
        allowed = ", ".join(repr(p.value) for p in Placement)
        raise ConfigurationError(
            f"beat_schedule entry {name!r} has options['placement'] = {raw!r}; "
            f"use one of {allowed} (or celery_elarion_beat.Placement)"
        ) from None
    if placement is Placement.EVERY_NODE:
        clashing = [key for key in ROUTING_OPTIONS if (options or {}).get(key) is not None]
        if clashing:
            raise ConfigurationError(
                f"beat_schedule entry {name!r} is placement 'every_node' and also sets "
                f"options {', '.join(repr(k) for k in clashing)}; every-node entries go to "
                "the node's own queue (elarion_beat_node_queue): remove the routing options, "
                "or make the entry placement 'cluster'"
            )
    return placement

