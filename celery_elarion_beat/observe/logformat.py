"""JSON log lines: one object per line, with the fields the code sets in ``extra``.

With ``elarion_beat_log_format = "json"`` (env ``ELARION_BEAT_LOG_FORMAT``) every
line beat logs is one JSON object::

    {"ts": "2026-11-29T03:00:00.004Z", "level": "INFO",
     "logger": "celery_elarion_beat.scheduler",
     "message": "beat: Skipping report at 2026-11-29T03:00:00Z: claimed-elsewhere (winner node-b)",
     "action": "skipped", "job": "report", "reason": "claimed-elsewhere", ...}

``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``message`` (the formatted
message, as the text format shows it) come first, then every ``extra`` field of
the record (``action``, ``job``, ``reason``, ``task_id``, ...), then ``exc_info``
(the traceback as text) when there is one. A value JSON cannot hold is written
as its ``str``. Nothing is added that the message does not already say safely:
no DSN, no task arguments.

The readers (the demo's verdict, the tests, the process harness) use
:func:`read_json_log`, which skips every line that is not one of these objects
(Celery's banner, text lines).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from celery.signals import after_setup_logger, after_setup_task_logger

from ..config.settings import Settings

__all__ = ["JsonFormatter", "connect_json_logging", "install_json_logging", "read_json_log",
           "record_time"]

#: The attributes every LogRecord has (and what Formatter.format adds): not ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}
#: The keys every line starts with; an ``extra`` field of the same name does not replace them.
_BASE_KEYS = ("ts", "level", "logger", "message")
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

#: Loggers besides the root that may hold handlers of their own in a Celery process.
_CELERY_LOGGERS = ("celery", "celery.task")


def _jsonable(value: Any) -> Any:
    """*value* if JSON holds it as it is, else its ``str``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def _timestamp(created: float) -> str:
    moment = datetime.fromtimestamp(created, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in payload:
                payload[key] = _jsonable(value)
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exc_info"] = record.exc_text
        if record.stack_info:
            payload["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(payload, default=str)


def install_json_logging(logger: logging.Logger | None = None) -> None:
    """Format every handler of *logger* as JSON lines; idempotent.

    Without *logger*: the root logger's handlers, and those of the ``celery`` and
    ``celery.task`` loggers when they have their own (a worker gives
    ``celery.task`` one). Handlers added later keep their own formatter.
    """
    if logger is not None:
        loggers = [logger]
    else:
        loggers = [logging.getLogger(), *(logging.getLogger(name) for name in _CELERY_LOGGERS)]
    for each in loggers:
        for handler in each.handlers:
            if not isinstance(handler.formatter, JsonFormatter):
                handler.setFormatter(JsonFormatter())


def connect_json_logging(app: Any) -> None:
    """Log JSON lines in every beat and worker of *app* when its settings say so.

    Call it once where the app is created. When Celery has set up a process's
    logging, its handlers are switched to JSON if ``elarion_beat_log_format`` (or
    ``ELARION_BEAT_LOG_FORMAT``) is ``json``. Beat switches itself when it sets up
    its schedule; this call adds the workers, and beat's lines before that point.
    """
    def wanted() -> bool:
        return Settings.from_app(app).log_format == "json"

    def on_logger(**_: Any) -> None:
        if wanted():
            install_json_logging()

    def on_task_logger(logger: logging.Logger | None = None, **_: Any) -> None:
        if logger is not None and wanted():
            install_json_logging(logger)

    uid = f"celery_elarion_beat.logformat.{app.main}"
    after_setup_logger.connect(on_logger, weak=False, dispatch_uid=uid)
    after_setup_task_logger.connect(on_task_logger, weak=False, dispatch_uid=uid)


def read_json_log(text: str | Iterable[str], **match: Any) -> list[dict[str, Any]]:
    """The JSON records of a log whose fields equal *match* (``action="skipped"``).

    Lines that are not a JSON object with the base keys are skipped: Celery's
    banner, text lines, and a last line still being written.
    """
    lines = text.splitlines() if isinstance(text, str) else text
    found = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not all(key in record for key in _BASE_KEYS):
            continue
        if all(record.get(key) == value for key, value in match.items()):
            found.append(record)
    return found


def record_time(record: dict[str, Any]) -> float:
    """The epoch time of a JSON record (its ``ts``)."""
    moment = datetime.strptime(record["ts"], _TS_FORMAT).replace(tzinfo=timezone.utc)
    return moment.timestamp()
