"""The JSON log format: one object per line over the records' ``extra`` fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_elarion_beat.observe.logformat import (
    JsonFormatter,
    connect_json_logging,
    install_json_logging,
    read_json_log,
    record_time,
)
from celery_elarion_beat.observe.outcome import SkipReason

Logged = tuple[logging.Logger, io.StringIO]


@pytest.fixture
def logged() -> Iterator[Logged]:
    """A logger of its own whose one handler formats as JSON into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.unit.logformat")
    logger.handlers, logger.propagate, logger.level = [handler], False, logging.DEBUG
    try:
        yield logger, stream
    finally:
        logger.handlers, logger.propagate, logger.level = [], True, logging.NOTSET


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_gives_the_base_keys_then_its_extra_fields(logged: Logged) -> None:
    logger, stream = logged
    logger.info("beat: Skipping %s at %s: %s (winner %s)", "report", "2026-11-29T03:00:00Z",
                SkipReason.CLAIMED_ELSEWHERE, "node-b",
                extra={"action": "skipped", "job": "report",
                       "reason": SkipReason.CLAIMED_ELSEWHERE.value, "winner": "node-b",
                       "occurrence": None, "skew": 0.25, "differing": 3})
    (record,) = lines(stream)
    assert record == {
        "ts": record["ts"], "level": "INFO", "logger": "tests.unit.logformat",
        "message": "beat: Skipping report at 2026-11-29T03:00:00Z: claimed-elsewhere "
                   "(winner node-b)",
        "action": "skipped", "job": "report", "reason": "claimed-elsewhere",
        "winner": "node-b", "occurrence": None, "skew": 0.25, "differing": 3,
    }
    assert list(record)[:4] == ["ts", "level", "logger", "message"]
    # ISO 8601 in UTC, to the millisecond, and the record's own time
    parsed = datetime.strptime(str(record["ts"]), "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(parsed.replace(tzinfo=timezone.utc).timestamp() - record_time(record)) < 1e-6
    assert abs(record_time(record) - datetime.now(timezone.utc).timestamp()) < 60


def test_standard_attributes_and_arguments_are_not_written(logged: Logged) -> None:
    logger, stream = logged
    logger.warning("beat: claiming occurrences in %s", "postgresql://beat:***@db/claims")
    (record,) = lines(stream)
    assert set(record) == {"ts", "level", "logger", "message"}
    assert record["message"] == "beat: claiming occurrences in postgresql://beat:***@db/claims"


def test_an_extra_named_like_a_base_key_does_not_replace_it(logged: Logged) -> None:
    logger, stream = logged
    logger.error("boom", extra={"level": "x", "logger": "y", "ts": "z"})
    (record,) = lines(stream)
    assert (record["level"], record["logger"]) == ("ERROR", "tests.unit.logformat")
    assert record["ts"] != "z"


def test_exc_info_is_included_as_text(logged: Logged) -> None:
    logger, stream = logged
    try:
        raise ValueError("the claims database refused")
    except ValueError:
        logger.exception("beat: the claim store raised %s", "ValueError",
                         extra={"action": "publish-error", "job": "report"})
    logger.info("after", extra={"action": "dispatched"})
    first, second = lines(stream)
    assert first["message"] == "beat: the claim store raised ValueError"
    assert first["action"] == "publish-error" and first["level"] == "ERROR"
    text = str(first["exc_info"])
    assert text.startswith("Traceback (most recent call last):")
    assert text.rstrip().endswith("ValueError: the claims database refused")
    assert "exc_info" not in second


def test_values_json_cannot_hold_become_their_str(logged: Logged) -> None:
    logger, stream = logged
    when = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)

    class Node:
        def __str__(self) -> str:
            return "node-a"

    loop: list[object] = []
    loop.append(loop)
    logger.info("odd values", extra={
        "when": when, "node": Node(), "nan": float("nan"), "inf": float("inf"),
        "by_pair": {("a", "b"): 1}, "loop": loop, "reason": SkipReason.CLAIM_ERROR,
        "nested": {"b": ["node-b", 2, None, True]}, "raw": b"\x00"})
    (record,) = lines(stream)
    assert record["when"] == str(when)
    assert record["node"] == "node-a"
    assert (record["nan"], record["inf"]) == ("nan", "inf")
    assert record["by_pair"] == str({("a", "b"): 1})
    assert record["loop"] == str(loop)
    assert record["reason"] == "claim-error"  # a str enum is a string already
    assert record["nested"] == {"b": ["node-b", 2, None, True]}
    assert record["raw"] == str(b"\x00")


def test_every_line_parses_with_json_loads(logged: Logged) -> None:
    logger, stream = logged
    logger.info('a message with "quotes", a newline\nand a tab\t', extra={"action": "x"})
    logger.warning("héllo ✓ %d", 3, extra={"job": "ünïcode-job"})
    try:
        {}["missing"]
    except KeyError:
        logger.error("with a multi-line traceback", exc_info=True)
    logger.debug("last", stack_info=True)
    text = stream.getvalue()
    assert text.endswith("\n")
    raw = text.splitlines()
    assert len(raw) == 4  # one line per record, whatever the message holds
    records = [json.loads(line) for line in raw]
    assert records[0]["message"] == 'a message with "quotes", a newline\nand a tab\t'
    assert records[1]["message"] == "héllo ✓ 3" and records[1]["job"] == "ünïcode-job"
    assert "KeyError: 'missing'" in records[2]["exc_info"]
    assert "stack_info" in records[3]
    assert read_json_log(text) == records


def test_the_reader_skips_what_is_not_a_json_record_and_filters_on_fields() -> None:
    formatter = JsonFormatter()

    def line(action: str, job: str) -> str:
        record = logging.LogRecord("celery_elarion_beat.scheduler", logging.INFO, __file__, 1,
                                   "beat: %s %s", (action, job), None)
        record.action, record.job = action, job
        return formatter.format(record)

    text = "\n".join([
        "celery beat v5.7.0 is starting.",
        "__    -    ... __   -        _",
        line("dispatched", "a"),
        "[2026-11-29 03:00:00,000: INFO/MainProcess] beat: Sending due task a (t) [slot x won]",
        '{"not": "a log record"}',
        "[1, 2]",
        line("skipped", "a"),
        line("dispatched", "b"),
        '{"ts": "2026-11-29T03:00:00.000Z", "level": "INFO", "logger": "x", "mess',  # unfinished
    ])
    assert [(r["action"], r["job"]) for r in read_json_log(text)] == [
        ("dispatched", "a"), ("skipped", "a"), ("dispatched", "b")]
    assert [r["job"] for r in read_json_log(text, action="dispatched")] == ["a", "b"]
    assert [r["action"] for r in read_json_log(text.splitlines(), job="a")] == \
        ["dispatched", "skipped"]
    assert read_json_log(text, action="purge") == []


@pytest.fixture
def fresh_loggers() -> Iterator[None]:
    """The root, celery and celery.task loggers with their handlers restored afterwards."""
    names = ("", "celery", "celery.task")
    saved = {name: list(logging.getLogger(name).handlers) for name in names}
    try:
        yield
    finally:
        for name, handlers in saved.items():
            logging.getLogger(name).handlers = handlers


def test_install_formats_root_and_celery_handlers_once(fresh_loggers: None) -> None:
    root, celery, task = (logging.getLogger(n) for n in ("", "celery", "celery.task"))
    text_formatter = logging.Formatter("%(message)s")
    root_handler, task_handler = logging.StreamHandler(io.StringIO()), logging.NullHandler()
    root_handler.setFormatter(text_formatter)
    root.handlers, celery.handlers, task.handlers = [root_handler], [], [task_handler]

    install_json_logging()
    first = root_handler.formatter
    assert isinstance(first, JsonFormatter)
    assert isinstance(task_handler.formatter, JsonFormatter)
    assert celery.handlers == []  # no handlers of its own: nothing to change

    install_json_logging()  # idempotent: the same formatter objects stay
    assert root_handler.formatter is first
    assert root.handlers == [root_handler] and task.handlers == [task_handler]


def test_install_on_one_logger_touches_only_its_handlers(fresh_loggers: None) -> None:
    root = logging.getLogger()
    root_handler = logging.NullHandler()
    root.handlers = [root_handler]
    own = logging.getLogger("tests.unit.logformat.own")
    own_handler = logging.NullHandler()
    own.handlers = [own_handler]
    try:
        install_json_logging(own)
        install_json_logging(own)
        assert isinstance(own_handler.formatter, JsonFormatter)
        assert root_handler.formatter is None
    finally:
        own.handlers = []


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_connect_switches_a_process_when_the_setting_says_json(fresh_loggers: None,
                                                              log_format: str) -> None:
    from celery import Celery
    from celery.signals import after_setup_logger, after_setup_task_logger

    app = Celery(f"elarion-logformat-{log_format}", set_as_current=False)
    app.conf.elarion_beat_log_format = log_format
    root, task = logging.getLogger(), logging.getLogger("celery.task")
    root_handler, task_handler = logging.NullHandler(), logging.NullHandler()
    root.handlers, task.handlers = [root_handler], [task_handler]
    connect_json_logging(app)
    connect_json_logging(app)  # once per app
    try:
        # what celery sends once it has set up a beat's or a worker's logging
        after_setup_logger.send(sender=None, logger=root, loglevel=logging.INFO,
                                logfile=None, format="", colorize=False)
        after_setup_task_logger.send(sender=None, logger=task, loglevel=logging.INFO,
                                     logfile=None, format="", colorize=False)
        json_on = log_format == "json"
        assert isinstance(root_handler.formatter, JsonFormatter) is json_on
        assert isinstance(task_handler.formatter, JsonFormatter) is json_on
    finally:
        uid = f"celery_elarion_beat.logformat.{app.main}"
        after_setup_logger.disconnect(dispatch_uid=uid)
        after_setup_task_logger.disconnect(dispatch_uid=uid)
