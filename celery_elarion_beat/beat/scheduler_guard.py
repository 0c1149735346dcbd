"""The scheduler guard: a beat of an app that uses the library claims, or does not start.

The promise (one send per occurrence) holds only among beats that run
:class:`~.scheduler.ClaimingScheduler`. A beat that runs another scheduler beside
them (Celery's stock one, after ``celery worker -B -S elarion``: on ``celery
worker``, ``-S`` is ``--statedb``) sends every occurrence again, and nothing else
would say so. So in an app that uses the library (:func:`~..config.usage.uses_library`:
it names a claims database, or calls ``install_worker``), such a beat refuses to
start: one CRITICAL line, ``beat: cannot start: ...``, naming the class it got and the
fix (``-S elarion`` for ``celery beat``, ``--scheduler elarion`` for ``celery worker
-B``, or ``beat_scheduler = "elarion"`` in the configuration), and exit code 78
(:data:`~.startup.EXIT_CONFIG`). ``elarion_beat_allow_other_scheduler = True`` lets
it start, with a WARNING.

Where it runs, before anything is sent (the ``celery`` command loads the library's
``celery.commands`` entry point, which imports this package, in every process):

* ``celery beat``: Celery's ``beat_init`` signal, which ``Service.start`` sends before
  its first tick (logging is set up by then);
* ``celery worker -B``: the ``celeryd_after_setup`` signal, sent once the worker set
  up its logging and built its steps (the embedded beat among them) and before any
  step starts: the whole worker stops with code 78, before its pool, its consumer or
  its beat run. A worker without ``-B`` is left alone;
* the embedded beat itself (a child process, or a thread), through ``beat_init``: a
  last line for a worker built without Celery's program (which sends no
  ``celeryd_after_setup``). The embedded beat then exits (78) without sending, and
  the worker runs on without a beat.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from typing import Any

from celery import signals
from celery.utils.imports import load_extension_class_names, symbol_by_name

from ..config.settings import allows_other_scheduler
from ..config.usage import uses_library
from ..exceptions import ConfigurationError
from .scheduler import ClaimingScheduler
from .startup import EXIT_CONFIG, refuse_to_start

__all__ = ["EMBEDDED", "STANDALONE", "WORKER", "check_scheduler", "connect_scheduler_guard",
           "scheduler_class", "scheduler_problem"]

logger = logging.getLogger(__name__)

#: Where a beat runs: ``celery beat``; ``celery worker -B`` (checked in the worker);
#: the embedded beat's own process or thread.
STANDALONE, WORKER, EMBEDDED = "celery beat", "celery worker -B", "embedded beat"

#: Celery's entry point group of scheduler aliases (``elarion`` is ours).
_ALIASES = "celery.beat_schedulers"
#: The name Celery gives the embedded beat's process or thread.
_EMBEDDED_NAME = "Beat"


def scheduler_class(scheduler: Any) -> type | None:
    """The class *scheduler* names (a class, ``module:Class``, ``module.Class`` or an
    alias of Celery's ``celery.beat_schedulers`` entry points), or None when it names
    nothing importable (Celery then reports that itself)."""
    if isinstance(scheduler, type):
        return scheduler
    try:
        found = symbol_by_name(str(scheduler),
                               aliases=dict(load_extension_class_names(_ALIASES)))
    except Exception:
        return None
    return found if isinstance(found, type) else None


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def scheduler_problem(app: Any, scheduler: Any, where: str,
                      statedb: str | None = None) -> tuple[str, bool] | None:
    """What is wrong with a beat of *app* running *scheduler* (*where* it runs), and
    whether ``elarion_beat_allow_other_scheduler`` allows it; None when nothing is: the
    scheduler claims (a :class:`ClaimingScheduler`), or the app does not use the
    library. Raises :class:`ConfigurationError` when the allowing setting is wrong."""
    cls = scheduler_class(scheduler)
    if cls is None or issubclass(cls, ClaimingScheduler):
        return None
    reason = uses_library(app)
    if reason is None:
        return None
    allowed = allows_other_scheduler(app)
    runs = (f"this `celery beat` runs {_name(cls)}" if where == STANDALONE else
            f"the embedded beat of this `celery worker -B` would run {_name(cls)}")
    what = (f"this app uses celery-elarion-beat ({reason}), but {runs}, which claims "
            "nothing: beside the claiming beats of the other replicas it sends every "
            "occurrence again")
    if allowed:
        return (f"{what}; elarion_beat_allow_other_scheduler = True lets it run"), True
    if where == STANDALONE:
        flag = "start it with `-S elarion`"
    else:
        trap = (f": -S {statedb!r} named a state file, not the scheduler" if statedb
                else ", not the scheduler")
        flag = (f"start the worker with `--scheduler elarion` (on `celery worker`, "
                f"-S is --statedb{trap})")
    return (f"{what}; {flag}, or set beat_scheduler = \"elarion\" in the configuration "
            "(then no flag can be forgotten); set elarion_beat_allow_other_scheduler = "
            "True only for a beat that is meant to run apart"), False


def check_scheduler(app: Any, scheduler: Any, where: str, statedb: str | None = None,
                    warn: bool = True) -> None:
    """Refuse to start (``beat: cannot start: ...``, CRITICAL, exit 78) when a beat of
    *app* would run another scheduler than ClaimingScheduler (see the module); when
    the setting allows it, log one WARNING (with *warn*)."""
    try:
        problem = scheduler_problem(app, scheduler, where, statedb)
    except ConfigurationError as exc:
        refuse_to_start(exc, EXIT_CONFIG)
    if problem is None:
        return
    message, allowed = problem
    if not allowed:
        refuse_to_start(ConfigurationError(message), EXIT_CONFIG)
    if warn:
        logger.warning("beat: %s", message,
                       extra={"action": "other-scheduler", "scheduler": str(scheduler)})


def _on_beat_init(sender: Any = None, **_: Any) -> None:
    """``beat_init``: ``celery beat``, or the embedded beat's own process or thread."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    embedded = _EMBEDDED_NAME in (multiprocessing.current_process().name,
                                  threading.current_thread().name)
    # the worker checked (and warned) before it started its embedded beat
    check_scheduler(app, getattr(sender, "scheduler_cls", None),
                    EMBEDDED if embedded else STANDALONE, warn=not embedded)


def _on_worker_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celeryd_after_setup``: a worker with an embedded beat (``-B``)."""
    if instance is None or getattr(instance, "beat", None) is None:
        return
    check_scheduler(instance.app, getattr(instance, "scheduler", None), WORKER,
                    statedb=getattr(instance, "statedb", None) or None)


def connect_scheduler_guard() -> None:
    """Connect the guard to Celery's signals (once, however often it is called)."""
    signals.beat_init.connect(_on_beat_init, weak=False,
                              dispatch_uid="celery_elarion_beat.scheduler_guard.beat")
    signals.celeryd_after_setup.connect(
        _on_worker_setup, weak=False, dispatch_uid="celery_elarion_beat.scheduler_guard.worker")
