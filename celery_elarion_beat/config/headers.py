"""The message headers beat adds to every occurrence it sends: the names the workers,
the tests and operators read. (Celery's own ``celery_beat_task`` is set too.)

A message with ``celery_beat_task`` and without ``elarion_job`` was sent by a beat
that claims nothing, a *foreign beat* (:func:`from_foreign_beat`): Celery's stock
scheduler stamps ``celery_beat_task`` on everything it sends since Celery 5.7 (5.6.3
and earlier stamp nothing, so their beats cannot be told from ``.delay()`` calls).
``origin`` is Celery's own header (message protocol 2): the sending process,
``gen<pid>@<host>`` for a beat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CELERY_BEAT_HEADER", "HEADERS", "HEADER_CATCH_UP", "HEADER_CLAIM", "HEADER_JOB",
           "HEADER_MANUAL", "HEADER_NODE", "HEADER_OCCURRENCE", "HEADER_ORIGIN",
           "HEADER_PLACEMENT", "HEADER_TAKEOVER", "from_foreign_beat", "origin_host"]

#: Celery's header on every message its beat sends (Celery 5.7 and later).
CELERY_BEAT_HEADER = "celery_beat_task"

#: Celery's header naming the process that sent a message (``gen<pid>@<host>``).
HEADER_ORIGIN = "origin"


#: Message headers that tell the task which occurrence it is.
HEADER_JOB = "elarion_job"


HEADER_OCCURRENCE = "elarion_occurrence"


HEADER_NODE = "elarion_node"


HEADER_PLACEMENT = "elarion_placement"


HEADER_CLAIM = "elarion_claim"


#: 1 on a run that replays a slot the cluster missed, else 0.
HEADER_CATCH_UP = "elarion_catch_up"


#: How many times the occurrence's orphaned claim was taken over (0 normally).
HEADER_TAKEOVER = "elarion_takeover"


#: 1 on a run an operator triggered (``elarion-beat trigger``), else 0.
HEADER_MANUAL = "elarion_manual"


#: Every header beat adds, in the order the docs list them.
HEADERS = (HEADER_JOB, HEADER_OCCURRENCE, HEADER_NODE, HEADER_PLACEMENT, HEADER_CLAIM,
           HEADER_CATCH_UP, HEADER_TAKEOVER, HEADER_MANUAL)


def from_foreign_beat(headers: Mapping[str, Any]) -> bool:
    """Whether a message with these *headers* was sent by a beat that claims nothing:
    Celery's beat header set, ours (``elarion_job``) missing."""
    return bool(headers.get(CELERY_BEAT_HEADER)) and not headers.get(HEADER_JOB)


def origin_host(origin: str) -> str:
    """The host part of an ``origin`` header (``gen4242@web-3`` -> ``web-3``)."""
    return origin.rpartition("@")[2] or origin
