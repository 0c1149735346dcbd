"""Bad input, in process: a broken ``beat_schedule`` entry among good ones.

Stock beat builds every entry of ``beat_schedule`` in one go: one entry that is
not a mapping, has an unknown key or a schedule that is not a schedule stops beat
at start with a bare ``TypeError`` or ``AttributeError`` that names nothing, and
an entry without a ``task``, with ``args`` that are not a list or with an interval
of zero seconds gets past the start and fails later (a message with task ``None``,
an orphaned claim and a failed heartbeat each second, a busy loop). Here each such
entry is left out at start with one ERROR that names it, says what is wrong and
how to fix it; the good entries run. The real-process proof is
tests/fault/test_bad_input.py; docs/bad-input.md lists every input.
"""

from __future__ import annotations

import ast
import logging
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_elarion_beat import ClaimingScheduler, cron

GOOD = "rapport-été-✓-日本"
TASK = "bad_input.ok"

#: entry name -> (its fields, words the ERROR about it must hold)
BROKEN: dict[str, tuple[Any, tuple[str, ...]]] = {
    "not-a-mapping": (5, ("not a mapping", "dict")),
    "unknown-key": ({"task": TASK, "schedule": 1.0, "shedule": 3}, ("shedule",)),
    "schedule-is-text": ({"task": TASK, "schedule": "every minute"},
                         ("'every minute'", "schedule")),
    "schedule-is-none": ({"task": TASK, "schedule": None}, ("None", "schedule")),
    "no-task": ({"schedule": 1.0}, ("no 'task'",)),
    "args-not-a-list": ({"task": TASK, "schedule": 1.0, "args": 5}, ("'args'", "list")),
    "kwargs-not-a-dict": ({"task": TASK, "schedule": 1.0, "kwargs": [1]},
                          ("'kwargs'", "dict")),
    "options-not-a-dict": ({"task": TASK, "schedule": 1.0, "options": "fast"},
                           ("'options'", "dict")),
    "zero-interval": ({"task": TASK, "schedule": 0}, ("0 seconds", "longer than 0")),
    "negative-interval": ({"task": TASK, "schedule": timedelta(seconds=-5)},
                          ("-5", "longer than 0")),
}


def make_app(schedule: dict[str, Any]) -> Celery:
    app = Celery("bad_input", broker="memory://", set_as_current=False)
    app.conf.update(elarion_beat_dsn="memory://bad-input", beat_schedule=schedule,
                    timezone="UTC", enable_utc=True, beat_max_loop_interval=1)
    app.task(name=TASK, shared=False)(ok)
    return app


def ok(*args: Any, **kwargs: Any) -> None:
    """The task of every entry (never run: beat only sends it)."""


def errors_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR and repr(name) in r.getMessage()]


def test_broken_entries_are_left_out_naming_each_and_the_good_ones_run(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_elarion_beat")
    schedule = {GOOD: {"task": TASK, "schedule": 1.0},
                **{name: fields for name, (fields, _) in BROKEN.items()}}
    beat = ClaimingScheduler(make_app(schedule), lazy=False)
    try:
        assert list(beat.schedule) == [GOOD]
        for name, (_, words) in BROKEN.items():
            found = errors_about(caplog, name)
            assert len(found) == 1, (name, found)
            assert "beat_schedule entry" in found[0] and "left out" in found[0], found
            for word in words:
                assert word in found[0], (name, word, found[0])
        records = [r for r in caplog.records if getattr(r, "action", None) == "invalid-entry"]
        assert sorted(r.job for r in records) == sorted(BROKEN)
        beat.tick()
        assert not [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
    finally:
        beat.close()


def test_an_entry_object_is_kept() -> None:
    """What stock beat accepts besides a dict stays accepted: a ``ScheduleEntry``,
    rebuilt for the app as stock beat does."""
    from celery.beat import ScheduleEntry

    entry = ScheduleEntry(name="as-object", task=TASK, schedule=timedelta(seconds=5))
    beat = ClaimingScheduler(make_app({"as-object": entry, GOOD: {"task": TASK,
                                                                  "schedule": 2.5}}), lazy=False)
    try:
        assert sorted(beat.schedule) == sorted(["as-object", GOOD])
        assert beat.schedule["as-object"].app is beat.app
    finally:
        beat.close()


def test_a_zero_interval_is_no_busy_loop() -> None:
    """Before: an interval of 0 s was due on every tick and failed to be named on
    each, so beat spun at a full core writing a traceback per tick."""
    beat = ClaimingScheduler(make_app({
        GOOD: {"task": TASK, "schedule": 1.0},
        "zero-interval": {"task": TASK, "schedule": 0}}), lazy=False)
    try:
        ticks, cpu = 0, time.process_time()
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            time.sleep(min(beat.tick(), 0.5))
            ticks += 1
        assert ticks <= 10, ticks  # one tick a second, at most a few more on a slow box
        assert time.process_time() - cpu < 1.0
    finally:
        beat.close()


def test_a_schedule_that_never_fires_keeps_beat_and_its_neighbours_going(
        caplog: pytest.LogCaptureFixture) -> None:
    """``cron("0 0 30 2 *")`` (30 February) builds but can never say when it is due:
    beat logs Celery's ERROR naming the entry at each wake-up and sends the others."""
    caplog.set_level(logging.INFO)
    beat = ClaimingScheduler(make_app({
        GOOD: {"task": TASK, "schedule": 1.0},
        "february-30": {"task": TASK, "schedule": cron("0 0 30 2 *")}}), lazy=False)
    try:
        assert set(beat.schedule) == {GOOD, "february-30"}
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            time.sleep(min(beat.tick(), 0.5))
        assert any("Cannot calculate the next run of 'february-30'" in r.getMessage()
                   for r in caplog.records)
        assert any("Sending due task" in r.getMessage() and GOOD in r.getMessage()
                   for r in caplog.records)
    finally:
        beat.close()


ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def test_every_row_of_the_bad_input_page_names_tests_that_exist() -> None:
    """docs/bad-input.md: each row of the table cites at least one test, and each
    cited ``tests/<path>.py::<test>`` is a test function of that file."""
    rows = [line for line in (ROOT / "docs" / "bad-input.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| input")]
    assert len(rows) >= 12
    for row in rows:
        refs = REFERENCE.findall(row.rsplit(" | ", 1)[-1])
        assert refs, row[:80]
        for path, test in refs:
            tree = ast.parse((ROOT / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert test in names, f"{path}::{test}"
