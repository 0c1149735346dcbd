"""Refusing to start: one CRITICAL line an operator can act on, and an exit code.

When ``celery beat`` cannot start (a setting is wrong, the claims database refuses
this node), beat logs one line, ``beat: cannot start: <what is wrong and the fix>``,
and exits with a code an orchestrator shows (the ``sysexits.h`` codes):

* :data:`EXIT_CONFIG` (78, ``EX_CONFIG``): a setting or an entry is wrong
  (:class:`~..exceptions.ConfigurationError`), or the claims table is missing and may
  not be created (:class:`~celery_elarion_beat.exceptions.SchemaMissing`);
* :data:`EXIT_REFUSED` (77, ``EX_NOPERM``): the claims database refused this node
  (:class:`~..exceptions.StoreRefused`: wrong password, no such database or role, no
  right on the schema or table) and ``elarion_beat_startup_errors`` is ``refuse``;
* :data:`EXIT_SOFTWARE` (70, ``EX_SOFTWARE``): anything else went wrong while the
  scheduler set up (a bug: the line then carries its traceback).

The traceback follows the line of a known error only at ``--loglevel DEBUG``.

Why :class:`SystemExit`: Celery's beat logs any other exception as ``beat raised
exception`` with its traceback, then lets it reach the interpreter, which prints the
traceback again into ``sys.stderr``; beat has redirected that to its logger, so each
fragment the interpreter writes becomes a WARNING line of its own (a token per line).
A :class:`SystemExit` passes Celery's ``except Exception`` and ends the process with
its code, printing nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from ..config.settings import Settings
from ..exceptions import (
    ConfigurationError,
    ElarionBeatError,
    SchemaMissing,
    StoreRefused,
)

__all__ = ["EXIT_CONFIG", "EXIT_REFUSED", "EXIT_SOFTWARE", "built_by_beat", "exit_code",
           "one_line", "read_settings", "refuse_to_start"]

logger = logging.getLogger(__name__)

#: A setting or entry is wrong, or the claims table is missing (``EX_CONFIG``).
EXIT_CONFIG = 78
#: The claims database refused this node (``EX_NOPERM``).
EXIT_REFUSED = 77
#: An unexpected error while the scheduler set up (``EX_SOFTWARE``).
EXIT_SOFTWARE = 70


def one_line(exc: BaseException) -> str:
    """*exc*'s message on one line (libpq's span several: ``FATAL:`` then ``DETAIL:``)."""
    return " ".join(str(exc).split())


def exit_code(exc: BaseException) -> int:
    """The exit code beat refuses to start with on *exc* (raised while it set up)."""
    if isinstance(exc, (ConfigurationError, SchemaMissing)):
        return EXIT_CONFIG
    if isinstance(exc, StoreRefused):
        return EXIT_REFUSED
    return EXIT_SOFTWARE


def refuse_to_start(exc: BaseException, code: int) -> NoReturn:
    """Log ``beat: cannot start: <exc>`` (CRITICAL; the traceback too at DEBUG, or
    when *exc* is no error of ours) and exit with *code*."""
    known = isinstance(exc, ElarionBeatError)
    logger.critical("beat: cannot start: %s",
                    one_line(exc) if known else f"{type(exc).__name__}: {one_line(exc)}",
                    exc_info=exc if logger.isEnabledFor(logging.DEBUG) or not known else None,
                    extra={"action": "refused-start", "exit_code": code,
                           "error": type(exc).__name__})
    raise SystemExit(code) from exc


def built_by_beat(kwargs: Mapping[str, Any]) -> bool:
    """Whether a scheduler is being built by ``celery beat`` (its ``Service`` passes
    ``schedule_filename``), where a refusal exits; built directly (a test, an embedding
    program), the scheduler raises the error instead."""
    return "schedule_filename" in kwargs


def read_settings(app: Any, by_beat: bool,
                  lazy: bool) -> tuple[Settings, ConfigurationError | None]:
    """The settings of *app*, and the error that will stop beat, if any.

    ``celery beat`` first builds a lazy scheduler for its banner, before its logging is
    set up: a bad setting is held (the defaults stand in for the banner) and beat
    refuses to start when it builds the real scheduler, once its log lines are formatted.
    """
    try:
        settings = Settings.from_app(app)
        settings.require_cluster()  # every row and key beat writes names it
        return settings, None
    except ConfigurationError as exc:
        if not by_beat:
            raise
        if lazy:
            return Settings.from_mapping({}), exc
        refuse_to_start(exc, EXIT_CONFIG)
