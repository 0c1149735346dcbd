"""Flower extension: the ``/elarion`` page and the ``elarion_beat_*`` metrics, inside Flower.

Flower (2.x) receives every Celery event but only shows ``task-*`` and
``worker-*`` ones. Importing this module from Flower's configuration file adds,
in the same Flower process::

    # flowerconfig.py -- celery -A proj flower --conf=flowerconfig.py
    import celery_elarion_beat.flower

* ``/elarion``: per job the recent occurrences (time, state, winning node, task id
  linked to Flower's ``/task/<id>``, worker, lateness, runtime, skipped nodes and
  why) and a sparkline of its recent runtimes, per node the dispatched and skipped
  counts and when it was last seen; refreshed live (states: :mod:`.board`);
* ``/elarion/api/state``: the same as JSON (the page polls it);
* on the same page, a Controls card (pause, resume, run now: each job's pause, and
  buttons that change it) and an Audit card (the last operator actions), read from
  and written to the claims database: ``/elarion/api/controls`` and the ``POST``-only
  ``/elarion/api/pause``, ``/resume`` and ``/trigger`` (:mod:`.controls`);
* on the same page, with ``elarion_beat_flower_edit``, a Schedule card: the database
  entries (live schedules) and their edit form (add, edit, override, enable, disable,
  remove, each previewed before it is saved): ``/elarion/api/schedule`` and its
  ``preview``, ``history`` and ``POST``-only action URLs (:mod:`.schedule`);
* on the same page, a One-offs card: the next 50 ``schedule_once`` one-offs to be sent
  and the last 50 finished, read from the claims database on load and every
  :data:`CONTROLS_POLL_MS`: ``/elarion/api/one-offs`` (:mod:`.one_offs`);
* ``elarion_beat_occurrences_total{job,outcome,reason}``,
  ``elarion_beat_node_occurrences_total{node,outcome,reason}``,
  ``elarion_beat_drift_events_total{node}``,
  ``elarion_beat_orphan_events_total{job,action}`` and the histograms
  ``elarion_beat_lateness_seconds{job,outcome}`` and
  ``elarion_beat_runtime_seconds{job,outcome}`` on Flower's own ``/metrics`` (a
  node's series go once it sent no event for a day, see
  :class:`~..observe.metrics.OccurrenceCounters`). Runtimes and run states come from the
  workers' ``elarion-run`` events (:func:`celery_elarion_beat.install_worker`);
* ``elarion_beat_every_node_missing{job,node}`` on the same ``/metrics``: which live
  beat nodes did not run an every-node entry, read from the claims database of the app
  whose events Flower receives (:mod:`..operate.coverage_metrics`), and on the page an
  Every-node card with the same, per entry: ``/elarion/api/every-node`` (:mod:`.every_node`).

These URLs honour Flower's ``url_prefix`` and its authentication (``basic_auth``,
OAuth): the handlers are Flower's ``BaseHandler`` with ``@authenticated``, like
Flower's own pages. ``/metrics`` stays as open as Flower leaves it. Who may use the
buttons (Flower's authentication or ``FLOWER_UNAUTHENTICATED_API``, and
``elarion_beat_flower_operators``) is :mod:`.operators`.

How it hooks in (all of it at import, which Flower does when it runs its
``--conf`` file as Python, before it builds its URL handlers and starts
capturing events):

* events: ``flower.events.Events.on_event`` (the one callback that Flower's
  event receiver calls for every event, in its receiver thread) is wrapped once.
  The wrapper hands ``elarion-*`` events to the board and the counters, then
  calls Flower's own ``on_event`` with every event unchanged: Flower's state is
  not touched, and since beat's events are neither ``task-*`` nor ``worker-*``,
  Flower makes no worker and no task of them;
* pages: the URL rules are inserted into ``flower.urls.handlers`` (the list
  ``flower.app.Flower`` is built from) just before Flower's catch-all 404 rule;
* metrics: the counters are registered in ``prometheus_client``'s default
  registry, the one Flower's ``/metrics`` serves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import tornado.template
import tornado.web
from flower import urls as flower_urls
from flower.events import Events
from flower.views import BaseHandler
from tornado.escape import json_encode
from tornado.routing import URLSpec

from ..observe.events import is_elarion
from ..observe.metrics import OccurrenceCounters, counters_for
from ..operate.coverage_metrics import EveryNodeGauge
from .board import Board
from .controls import ACTIONS, ControlAction, Controls, panel
from .every_node import EveryNodeState
from .one_offs import OneOffsState
from .schedule import (
    EDIT_ACTIONS,
    ScheduleAction,
    ScheduleEntries,
    ScheduleHistory,
    SchedulePreview,
    edit_on,
)
from .templates import PAGE, PAGE_NAME, STATE_BADGES

__all__ = ["BOARD", "CONTROLS_POLL_MS", "POLL_MS", "ElarionPage", "ElarionState", "install",
           "observe"]

logger = logging.getLogger(__name__)

#: How often the page polls the JSON endpoint.
POLL_MS = 2000
#: How often the page reads the pauses and the audit again (the claims database).
CONTROLS_POLL_MS = 10000
#: The occurrences and node counts shown by the page (one per Flower process).
BOARD = Board()
_COUNTERS: OccurrenceCounters | None = None
#: ``elarion_beat_every_node_missing``: bound to the app of the first event Flower receives
_COVERAGE: EveryNodeGauge | None = None
_MARK = "_elarion_beat_hook"
#: a template path of our own: Tornado caches one loader per path
_TEMPLATE_KEY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def observe(event: Mapping[str, Any]) -> None:
    """Feed one ``elarion-*`` event to the board and the counters; never raises."""
    try:
        BOARD.observe(event)
        if _COUNTERS is not None:
            _COUNTERS.observe(event)
    except Exception:  # a bad event must never stop Flower's receiver
        logger.exception("elarion: could not process event %r", event.get("type"))


class _Loader(tornado.template.Loader):
    """Flower's templates, plus our page (so ``{% extends "base.html" %}`` works)."""

    def _create_template(self, name: str) -> tornado.template.Template:
        if name == PAGE_NAME:
            return tornado.template.Template(PAGE, name=name, loader=self)
        return super()._create_template(name)


class ElarionPage(BaseHandler):
    """``/elarion``: the beat cluster's occurrences, styled like Flower's pages."""

    def get_template_path(self) -> str:
        return _TEMPLATE_KEY

    def create_template_loader(self, template_path: str) -> tornado.template.BaseLoader:
        settings = self.application.settings
        kwargs = {key: settings[key] for key in ("autoescape", "template_whitespace")
                  if key in settings}
        return _Loader(settings["template_path"], **kwargs)

    @tornado.web.authenticated
    def get(self) -> None:
        cluster = panel(self.application).cluster
        self.render(PAGE_NAME, state_url=self.reverse_url("elarion-state"),
                    task_url=self.reverse_url("task", "__TASK_ID__"),
                    cluster=cluster or "(every cluster)",
                    initial=json_encode(BOARD.snapshot(cluster)), poll_ms=POLL_MS,
                    state_badges=json_encode(STATE_BADGES),
                    controls_url=self.reverse_url("elarion-controls"),
                    one_offs_url=self.reverse_url("elarion-one-offs"),
                    every_node_url=self.reverse_url("elarion-every-node"),
                    action_urls=json_encode({action: self.reverse_url(f"elarion-{action}")
                                             for action in ACTIONS}),
                    controls_poll_ms=CONTROLS_POLL_MS, xsrf=self.xsrf_token.decode(),
                    schedule_edit=edit_on(self.application),
                    schedule_urls=json_encode(_schedule_urls(self)))


def _schedule_urls(handler: BaseHandler) -> dict[str, str]:
    urls = {"entries": handler.reverse_url("elarion-schedule"),
            "preview": handler.reverse_url("elarion-schedule-preview"),
            "history": handler.reverse_url("elarion-schedule-history")}
    urls.update({action: handler.reverse_url(f"elarion-schedule-{action}")
                 for action in EDIT_ACTIONS})
    return urls


class ElarionState(BaseHandler):
    """``/elarion/api/state``: the page's data as JSON (same authentication as the page)."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.write(BOARD.snapshot(panel(self.application).cluster))


def _hook_events() -> None:
    original = Events.on_event
    if getattr(original, _MARK, False):
        return

    def on_event(self: Any, event: Any) -> None:
        if isinstance(event, Mapping) and is_elarion(event):
            observe(event)
            if _COVERAGE is not None and _COVERAGE.app is None:
                _COVERAGE.bind(getattr(self, "capp", None))
        original(self, event)

    setattr(on_event, _MARK, True)
    on_event.__wrapped__ = original  # type: ignore[attr-defined]
    Events.on_event = on_event


def _add_handlers() -> None:
    handlers: list[Any] = flower_urls.handlers
    if any(getattr(h, "name", None) == "elarion" for h in handlers):
        return
    ours = [tornado.web.url(r"/elarion", ElarionPage, name="elarion"),
            tornado.web.url(r"/elarion/api/state", ElarionState, name="elarion-state"),
            tornado.web.url(r"/elarion/api/controls", Controls, name="elarion-controls"),
            tornado.web.url(r"/elarion/api/one-offs", OneOffsState, name="elarion-one-offs"),
            tornado.web.url(r"/elarion/api/every-node", EveryNodeState,
                            name="elarion-every-node")]
    ours += [tornado.web.url(f"/elarion/api/{action}", ControlAction, {"action": action},
                             name=f"elarion-{action}") for action in ACTIONS]
    ours += [tornado.web.url(r"/elarion/api/schedule", ScheduleEntries,
                             name="elarion-schedule"),
             tornado.web.url(r"/elarion/api/schedule/preview", SchedulePreview,
                             name="elarion-schedule-preview"),
             tornado.web.url(r"/elarion/api/schedule/history", ScheduleHistory,
                             name="elarion-schedule-history")]
    ours += [tornado.web.url(f"/elarion/api/schedule/{action}", ScheduleAction,
                             {"action": action}, name=f"elarion-schedule-{action}")
             for action in EDIT_ACTIONS]
    at = next((i for i, h in enumerate(handlers) if _pattern(h) in (".*", r".*$")), len(handlers))
    handlers[at:at] = ours


def _pattern(handler: Any) -> str:
    if isinstance(handler, URLSpec):
        return str(handler.regex.pattern)
    return str(handler[0])


def install() -> None:
    """Hook into Flower (idempotent). Importing this module calls it."""
    global _COUNTERS, _COVERAGE
    if _COUNTERS is None:
        _COUNTERS = counters_for()
    if _COVERAGE is None:
        from prometheus_client import REGISTRY

        _COVERAGE = EveryNodeGauge()
        REGISTRY.register(_COVERAGE)
    _add_handlers()
    _hook_events()


install()
