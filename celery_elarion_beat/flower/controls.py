"""Flower: the pause, resume and run-now buttons of the ``/elarion`` page, and its audit.

The page (:mod:`celery_elarion_beat.flower`) reads and changes the claims database through
:mod:`..operate.control`, like ``celery -A proj elarion-beat pause|resume|trigger|audit``:

* ``GET /elarion/api/controls``: JSON ``{actions, actions_reason, read_only, caller,
  jobs: [{name, task, schedule, paused}], all_paused, audit, now}`` (``actions``:
  whether this caller may act, else ``actions_reason`` says why, see
  :mod:`.operators`; ``read_only``: ``elarion_beat_flower_actions`` is False;
  ``caller``: who the audit would record; ``paused``: :meth:`Pause.as_dict` or null;
  ``audit``: the last :data:`AUDIT_ROWS` actions, newest first);
* ``POST /elarion/api/pause``, ``/resume``, ``/trigger``: form fields ``job`` (or
  ``all=1``: every job, pause and resume only), ``reason``, ``until`` (pause: an ISO
  time or a duration such as ``2h``) and ``force`` (trigger: even within
  ``elarion_beat_trigger_window`` of the last manual run). Answer JSON:
  ``{ok, message, ...}``, or ``{error}`` with 400 (bad input: the
  ConfigurationError's text), 403 (this caller may not act, see :mod:`.operators`:
  no authentication, not an operator, a read-only Flower; or the XSRF check failed),
  409 (a duplicate trigger), 502 (the broker refused the triggered run) or 503 (the
  claims database failed).

Each handler is Flower's ``BaseHandler`` with ``@authenticated``. Only ``POST``
changes anything (``GET`` on an action URL answers 405). Every write endpoint is an
:class:`ActionHandler`: before its method runs, a request that may change something
is refused with 403 unless this caller may act (:func:`.operators.refusal`), then
it must pass Tornado's own XSRF check, which Flower's ``BaseHandler`` skips under
basic auth and without auth: the page sends the token it was rendered with. With
``elarion_beat_flower_actions = False`` the page shows no buttons; a caller who may
not act sees them disabled, with the reason.

The actor recorded is the basic-auth user name, else the OAuth user, else
``anonymous@<remote address>``, followed by `` (flower)`` (:attr:`.operators.Caller.actor`).
The store is opened once per Flower process, on first use; its calls run on a small
thread pool of their own, so a slow database never holds up Flower's I/O loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import tornado.web
from celery.beat import ScheduleEntry
from flower.views import BaseHandler
from tornado.ioloop import IOLoop

from ..config.parsers import boolean
from ..config.settings import Settings
from ..exceptions import ConfigurationError, StoreError
from ..live_schedules.listing import read_live_schedule
from ..observe.fingerprint import schedule_text
from ..operate import control
from ..schedules.clock import as_utc
from ..store.interface import ClaimStore
from ..store.registry import open_store
from .operators import READ_ONLY, Caller, actor_of, caller_of, refusal

__all__ = ["ACTIONS", "AUDIT_ROWS", "READ_ONLY", "SAFE_METHODS", "ActionHandler",
           "ControlAction", "Controls", "Panel", "Refused", "actor_of", "panel"]

#: The audit rows the page shows.
AUDIT_ROWS = 30
#: The action URLs: ``/elarion/api/<action>``.
ACTIONS = ("pause", "resume", "trigger")
#: The methods that change nothing (every other one is checked: :class:`ActionHandler`).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="elarion-flower")
_ATTRIBUTE = "_elarion_panel"
_LOCK = threading.Lock()
T = TypeVar("T")


class Panel:
    """What the buttons do, for one Flower process: its settings and its claims store
    (each read or opened once, on first use). Every method blocks: the handlers call
    them on the pool."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._settings: Settings | None = None
        self._store: ClaimStore | None = None
        self._lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            try:
                self._settings = Settings.from_app(self.app)
            except ConfigurationError as exc:
                raise _Unconfigured(f"this Flower's Celery configuration: {exc}") from exc
        return self._settings

    @property
    def store(self) -> ClaimStore:
        with self._lock:
            if self._store is None:
                settings = self.settings
                try:
                    self._store = open_store(settings)
                except ConfigurationError as exc:
                    raise _Unconfigured(f"this Flower's Celery configuration: {exc}") from exc
            return self._store

    @property
    def cluster(self) -> str | None:
        """The cluster this Flower shows (``elarion_beat_cluster``); None when its
        settings are broken or name none (the page then shows every cluster)."""
        try:
            return self.settings.cluster
        except _Unconfigured:
            return None

    def refusal(self, caller: Caller) -> str | None:
        """Why *caller* may not act here (None: they may), see :mod:`.operators`."""
        settings = self.settings
        return refusal(caller, settings.flower_operators, settings.flower_actions)

    def controls(self, caller: Caller) -> dict[str, Any]:
        """The page's controls: whether *caller* may act, each job with its pause, the
        pause of every job, the audit."""
        refused = self.refusal(caller)
        now, pauses = control.active_pauses(self.store)
        own = {p.job: p for p in pauses if not p.all_jobs}
        every = next((p for p in pauses if p.all_jobs), None)
        entries, invalid = read_live_schedule(self.app, self.settings, self.store,
                                              checked=False)
        left_out = {i.job: i.reason for i in invalid}
        jobs = [_job(name, entries.get(name), own.get(name), left_out.get(name))
                for name in sorted(set(entries) | set(left_out) | set(own))]
        return {"actions": refused is None, "actions_reason": refused,
                "read_only": not self.settings.flower_actions, "caller": caller.actor,
                "jobs": jobs, "cluster": self.store.cluster,
                "all_paused": every.as_dict() if every else None, "now": _iso(now),
                "audit": [e.as_dict() for e in control.audit_log(self.store, limit=AUDIT_ROWS)]}

    def pause(self, job: str, actor: str, reason: str, until: str) -> dict[str, Any]:
        when = control.parse_until(until, self.store.clock()) if until else None
        pause = control.pause_job(self.app, self.store, job, actor=actor, until=when,
                                  reason=reason)
        return {"ok": True, "message": f"{control.job_label(job)}: {pause.describe()}",
                "pause": pause.as_dict()}

    def resume(self, job: str, actor: str) -> dict[str, Any]:
        lifted = control.resume_job(self.app, self.store, job, actor=actor)
        name = control.job_label(job)
        message = f"{name}: resumed" if lifted else f"{name} was not paused"
        return {"ok": True, "message": message,
                "pause": lifted.as_dict() if lifted else None}

    def trigger(self, job: str, actor: str, reason: str,
                force: bool) -> tuple[int, dict[str, Any]]:
        done = control.trigger_job(self.app, self.store, job, actor=actor, force=force,
                                   reason=reason, settings=self.settings)
        answer = done.as_dict()
        if done.duplicate is not None:
            dup = done.duplicate
            return 409, {**answer, "error": (
                f"{job} was run by hand at {_iso(dup.occurrence)} by {dup.node} (task "
                f"{dup.task_id}), within elarion_beat_trigger_window: not sent again; "
                "force it to send another run")}
        if not done.sent:
            return 502, {**answer, "error": f"{job}: the broker refused the run: {done.error}"}
        return 200, {**answer, "ok": True, "message": f"{job}: sent, task {done.task_id}"}


def panel(application: Any) -> Panel:
    """The :class:`Panel` of a Flower application (one per Flower process)."""
    with _LOCK:
        found: Panel | None = getattr(application, _ATTRIBUTE, None)
        if found is None:
            found = Panel(application.capp)
            setattr(application, _ATTRIBUTE, found)
    return found


def _job(name: str, entry: ScheduleEntry | None, pause: control.Pause | None,
         invalid: str | None = None) -> dict[str, Any]:
    """One job of the Controls card; an entry beat leaves out is shown without its
    schedule, with why (*invalid*)."""
    return {"name": name, "task": entry.task if entry is not None else None,
            "schedule": schedule_text(entry.schedule) if entry is not None else None,
            "paused": pause.as_dict() if pause else None, "invalid": invalid}


def _iso(value: Any) -> str | None:
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else None


class Refused(tornado.web.HTTPError):
    """An error answer: ``{"error": text}`` (and the fields *extra*) with *status*
    (logged by Tornado as a warning)."""

    def __init__(self, status: int, text: str, **extra: Any) -> None:
        super().__init__(status, "%s", text)
        self.text = text
        self.extra = extra


class _Unconfigured(Exception):
    """This Flower's Celery configuration does not let it reach the claims database."""


class ControlHandler(BaseHandler):
    """Errors as JSON ``{error}`` (401 stays Flower's, with its basic-auth challenge)."""

    async def blocking(self, call: Callable[[], T]) -> T:
        """Run *call* on the pool; ConfigurationError -> 400, StoreError -> 503."""
        try:
            return await IOLoop.current().run_in_executor(_EXECUTOR, call)
        except ConfigurationError as exc:
            raise Refused(400, str(exc)) from exc
        except _Unconfigured as exc:
            raise Refused(503, str(exc)) from exc
        except StoreError as exc:
            raise Refused(503, f"the claims database failed: {exc}") from exc

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if status_code == 401:
            super().write_error(status_code, **kwargs)
            return
        exc = kwargs.get("exc_info", (None, None, None))[1]
        extra: dict[str, Any] = {}
        if isinstance(exc, Refused):
            text, extra = exc.text, exc.extra
        elif isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            text = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            text = self._reason
        self.set_header("Cache-Control", "no-store")
        self.finish({"error": text, **extra})


class ActionHandler(ControlHandler):
    """The base of every write endpoint of the page (pause, resume, trigger, and any
    later one): a request in a method that may change something (any but
    :data:`SAFE_METHODS`) is refused with 403 before the method runs, unless this caller
    may act (:mod:`.operators`); then it must carry the page's XSRF token. A refused
    request reads no form and writes nothing."""

    async def prepare(self) -> None:
        if self.request.method in SAFE_METHODS:
            return
        if not self.current_user:
            return  # Flower's @authenticated answers (a bad password: 401 already)
        caller = caller_of(self)
        refused = await self.blocking(lambda: self.refusal(caller))
        if refused is not None:
            raise Refused(403, refused)
        # Flower's own check_xsrf_cookie lets basic auth and no auth through: ours never
        tornado.web.RequestHandler.check_xsrf_cookie(self)


    def refusal(self, caller: Caller) -> str | None:
        """Why *caller* may not send this request (None: they may); blocking (on the
        pool). The buttons' rule; the edit form adds its switches
        (:meth:`.schedule.ScheduleHandler.refusal`)."""
        return panel(self.application).refusal(caller)


class Controls(ControlHandler):
    """``GET /elarion/api/controls``: whether this caller may act, the jobs, their pauses
    and the audit (JSON)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        caller = caller_of(self)
        found = await self.blocking(lambda: panel(self.application).controls(caller))
        self.set_header("Cache-Control", "no-store")
        self.write(found)


class ControlAction(ActionHandler):
    """``POST /elarion/api/<action>``: pause, resume or trigger a job (see the module)."""

    def initialize(self, action: str) -> None:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        self.action = action

    @tornado.web.authenticated
    async def post(self) -> None:
        board = panel(self.application)  # ActionHandler.prepare let this caller act
        job = self._job()
        actor = actor_of(self)
        reason = self._field("reason")
        status = 200
        if self.action == "pause":
            until = self._field("until")
            answer = await self.blocking(lambda: board.pause(job, actor, reason, until))
        elif self.action == "resume":
            answer = await self.blocking(lambda: board.resume(job, actor))
        else:
            force = self._flag("force")
            status, answer = await self.blocking(
                lambda: board.trigger(job, actor, reason, force))
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.write(answer)

    def _field(self, name: str) -> str:
        return str(self.get_body_argument(name, "") or "").strip()

    def _flag(self, name: str) -> bool:
        text = self._field(name)
        try:
            return bool(text) and boolean(name, text)
        except ConfigurationError as exc:
            raise Refused(400, str(exc)) from exc

    def _job(self) -> str:
        job, every = self._field("job"), self._flag("all")
        if every and self.action != "trigger" and not job:
            return control.ALL_JOBS
        if job and not every:
            return job
        raise Refused(400, "name one job (job=NAME)" + (
            ", or all=1 for every job" if self.action != "trigger" else ""))
