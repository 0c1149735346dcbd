"""Flower: the pause, resume and run-now buttons of the ``/elarion`` page, and its audit.

The page (:mod:`.flower`) reads and changes the claims database through
:mod:`.control`, like ``celery -A proj elarion-beat pause|resume|trigger|audit``:

* ``GET /elarion/api/controls``: JSON ``{actions, jobs: [{name, task, schedule,
  paused}], all_paused, audit, now}`` (``paused``: :meth:`Pause.as_dict` or null;
  ``audit``: the last :data:`AUDIT_ROWS` actions, newest first);
* ``POST /elarion/api/pause``, ``/resume``, ``/trigger``: form fields ``job`` (or
  ``all=1``: every job, pause and resume only), ``reason``, ``until`` (pause: an ISO
  time or a duration such as ``2h``) and ``force`` (trigger: even within
  ``elarion_beat_trigger_window`` of the last manual run). Answer JSON:
  ``{ok, message, ...}``, or ``{error}`` with 400 (bad input: the
  ConfigurationError's text), 403 (read-only, or the XSRF check failed), 409 (a
  duplicate trigger), 502 (the broker refused the triggered run) or 503 (the claims
  database failed).

Each handler is Flower's ``BaseHandler`` with ``@authenticated``. Only ``POST``
changes anything (``GET`` on an action URL answers 405), and every ``POST`` passes
Tornado's own XSRF check, which Flower's ``BaseHandler`` skips under basic auth and
without auth: the page sends the token it was rendered with. With
``elarion_beat_flower_actions = False`` the page shows no buttons and every action
answers 403.

The actor recorded is the basic-auth user name, else the OAuth user, else
``anonymous@<remote address>``, followed by `` (flower)``. The store is opened once
per Flower process, on first use; its calls run on a small thread pool of their own,
so a slow database never holds up Flower's I/O loop.
"""

from __future__ import annotations

import binascii
import threading
from base64 import b64decode
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import tornado.web
from celery.schedules import maybe_schedule
from flower.views import BaseHandler
from tornado.ioloop import IOLoop

from . import control
from .clock import as_utc
from .exceptions import ConfigurationError, StoreError
from .fingerprint import describe_schedule
from .parsers import boolean
from .settings import Settings
from .store import ClaimStore, open_store

__all__ = ["ACTIONS", "AUDIT_ROWS", "READ_ONLY", "ControlAction", "Controls", "Panel", "Refused",
           "actor_of", "panel"]

#: The audit rows the page shows.
AUDIT_ROWS = 30
#: The answer to an action while ``elarion_beat_flower_actions`` is False.
READ_ONLY = ("this Flower is read-only: elarion_beat_flower_actions is False in its Celery "
             "configuration; use `celery -A proj elarion-beat pause|resume|trigger` instead")
#: The action URLs: ``/elarion/api/<action>``.
ACTIONS = ("pause", "resume", "trigger")
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

    def actions(self) -> bool:
        """Whether the buttons are offered (``elarion_beat_flower_actions``)."""
        return bool(self.settings.flower_actions)

    def controls(self) -> dict[str, Any]:
        """The page's controls: each job with its pause, the pause of every job, the audit."""
        now, pauses = control.active_pauses(self.store)
        own = {p.job: p for p in pauses if not p.all_jobs}
        every = next((p for p in pauses if p.all_jobs), None)
        schedule = dict(getattr(self.app.conf, "beat_schedule", None) or {})
        jobs = [_job(name, schedule.get(name), self.app, own.get(name))
                for name in sorted(set(schedule) | set(own))]
        return {"actions": self.actions(), "jobs": jobs,
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


def actor_of(handler: BaseHandler) -> str:
    """Who pressed the button: ``bob (flower)``, ``anonymous@10.0.0.7 (flower)``."""
    options = handler.application.options
    user = None
    if options.basic_auth:
        user = _basic_user(handler.request.headers.get("Authorization", ""))
    elif options.auth and handler.current_user:
        user = str(handler.current_user)
    return f"{user or f'anonymous@{handler.request.remote_ip}'} (flower)"


def _basic_user(header: str) -> str | None:
    scheme, _, credentials = header.partition(" ")
    if scheme != "Basic":
        return None
    try:
        decoded = b64decode(credentials.strip().encode(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0] or None


def _job(name: str, entry: Any, app: Any, pause: control.Pause | None) -> dict[str, Any]:
    task, schedule = None, None
    if isinstance(entry, dict):
        task = entry.get("task")
        try:
            schedule = describe_schedule(maybe_schedule(entry.get("schedule"), app=app))
        except Exception:  # an entry beat itself refuses: shown without its schedule
            schedule = None
    return {"name": name, "task": task, "schedule": schedule,
            "paused": pause.as_dict() if pause else None}


def _iso(value: Any) -> str | None:
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else None


class Refused(tornado.web.HTTPError):
    """An error answer: ``{"error": text}`` with *status* (logged by Tornado as a warning)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(status, "%s", text)
        self.text = text


class _Unconfigured(Exception):
    """This Flower's Celery configuration does not let it reach the claims database."""


class _ControlHandler(BaseHandler):
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
        if isinstance(exc, Refused):
            text = exc.text
        elif isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            text = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            text = self._reason
        self.set_header("Cache-Control", "no-store")
        self.finish({"error": text})


class Controls(_ControlHandler):
    """``GET /elarion/api/controls``: the jobs, their pauses and the audit (JSON)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        found = await self.blocking(panel(self.application).controls)
        self.set_header("Cache-Control", "no-store")
        self.write(found)


class ControlAction(_ControlHandler):
    """``POST /elarion/api/<action>``: pause, resume or trigger a job (see the module)."""

    def initialize(self, action: str) -> None:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        self.action = action

    @tornado.web.authenticated
    async def post(self) -> None:
        # Flower's own check_xsrf_cookie lets basic auth and no auth through: ours never
        tornado.web.RequestHandler.check_xsrf_cookie(self)
        board = panel(self.application)
        if not await self.blocking(board.actions):
            raise Refused(403, READ_ONLY)
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
