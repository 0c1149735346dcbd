"""Flower: the Every-node card of the ``/elarion`` page: which live beat nodes ran each
every-node entry (:mod:`..operate.coverage`, as ``status`` reports it).

``GET /elarion/api/every-node`` answers JSON ``{now, entries}``: per every-node entry
(:meth:`NodeCoverage.as_dict`) the window (its last two periods), ``nodes_ran`` (node
-> runs its workers recorded), ``nodes_missing`` (live nodes whose workers record runs
and recorded none of it), ``nodes_not_tracked`` (live nodes whose workers never recorded
a run: no ``install_worker``) and ``nodes_too_new``. Read from the claims database of
the Flower process's app through the store the Controls card opened
(:func:`.controls.panel`), on its thread pool; the page reads it on load and every
:data:`~.CONTROLS_POLL_MS`. Errors answer like the Controls: ``{error}`` with 503.
"""

from __future__ import annotations

from typing import Any

import tornado.web

from ..operate.coverage import read_coverage
from .controls import ControlHandler, Panel, panel

__all__ = ["EveryNodeState", "every_node_view"]


def every_node_view(board: Panel) -> dict[str, Any]:
    """The card's data: each every-node entry's coverage now (database clock)."""
    now, covered = read_coverage(board.app, board.settings, board.store)
    return {"now": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "entries": [c.as_dict() for _, c in sorted(covered.items())]}


class EveryNodeState(ControlHandler):
    """``GET /elarion/api/every-node``: every-node entries and the nodes that ran them."""

    @tornado.web.authenticated
    async def get(self) -> None:
        board = panel(self.application)
        found = await self.blocking(lambda: every_node_view(board))
        self.set_header("Cache-Control", "no-store")
        self.write(found)
