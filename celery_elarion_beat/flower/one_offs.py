"""Flower: the One-offs card of the ``/elarion`` page (durable one-offs, :mod:`..one_offs.api`).

``GET /elarion/api/one-offs`` answers JSON ``{upcoming, recent, now}``: the next
:data:`ONE_OFF_ROWS` one-offs still to be sent (``scheduled`` or ``leased``), soonest
due first, and the last :data:`ONE_OFF_ROWS` finished ones (``published``, ``failed``,
``cancelled``, with their error), each as :meth:`OneOff.as_dict` (no arguments). It
reads the claims database of the Flower process's app through the store the Controls
card opened (:func:`.controls.panel`), on the same thread pool, with two bounded
queries per request; the page reads it on load and every
:data:`~.CONTROLS_POLL_MS`. Errors answer like the Controls: ``{error}`` with
503 when the database fails or is not configured.
"""

from __future__ import annotations

from typing import Any

import tornado.web

from ..store.interface import ClaimStore
from ..store.one_off_records import FINISHED_STATES, OneOffState
from .controls import ControlHandler, panel

__all__ = ["ONE_OFF_ROWS", "OneOffsState", "one_offs_view"]

#: How many upcoming and how many finished one-offs the card shows.
ONE_OFF_ROWS = 50
_PENDING = (OneOffState.SCHEDULED, OneOffState.LEASED)


def one_offs_view(store: ClaimStore, rows: int = ONE_OFF_ROWS) -> dict[str, Any]:
    """The card's data: the next *rows* pending one-offs and the last *rows* finished."""
    now = store.clock()
    upcoming = store.one_offs(states=_PENDING, limit=rows, order="due")
    recent = store.one_offs(states=FINISHED_STATES, limit=rows, order="-finished")
    return {"now": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "upcoming": [one.as_dict() for one in upcoming],
            "recent": [one.as_dict() for one in recent]}


class OneOffsState(ControlHandler):
    """``GET /elarion/api/one-offs``: upcoming and recent one-offs (JSON)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        board = panel(self.application)
        found = await self.blocking(lambda: one_offs_view(board.store))
        self.set_header("Cache-Control", "no-store")
        self.write(found)
