"""The progress line of long CLI work (``cli/progress.py``): what it says, how often it
redraws, when it stays quiet, and Ctrl-C between batches.

The commands themselves are driven on real terminals in
``tests/operate/test_cli_terminal.py``.
"""

from __future__ import annotations

import io
import os
import signal
import time

import pytest

from celery_elarion_beat.cli.progress import INTERRUPTED, Interrupts, Progress, watching
from celery_elarion_beat.testing._harness import frames


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_says_rows_done_of_about_how_many_the_rate_and_the_time_left() -> None:
    clock = Clock()
    progress = Progress(show=False, clock=clock)
    progress.stage("purging claims", total=200_000, about=True)
    assert progress.line() == "purging claims: 0 of ~200,000 rows (0%), 0s"
    for _ in range(4):
        clock.now += 0.5
        progress.advance(15_000)
    assert progress.rate == pytest.approx(30_000)
    assert progress.line() == ("purging claims: 60,000 of ~200,000 rows (30%), 30,000 rows/s, "
                               "5s left")
    clock.now += 120
    progress.advance(0)
    assert progress.left is None  # nothing deleted for the last seconds: unknown
    assert progress.line().endswith("rows (30%), 2m2s")  # the time spent instead


def test_without_a_total_it_shows_rows_the_rate_and_the_time_spent() -> None:
    clock = Clock()
    progress = Progress(show=False, clock=clock)
    progress.stage("purging one-offs", unit="one-offs")
    clock.now += 90
    progress.advance(900)
    assert progress.line() == "purging one-offs: 900 one-offs, 10 one-offs/s, 90s"


def test_a_long_statement_shows_what_it_does_its_phase_counts_and_the_time() -> None:
    clock = Clock()
    progress = Progress(show=False, clock=clock)
    progress.stage("upgrading the tables (2 of 3)", counted=False)
    progress.detail("creating index ix_claims_pending")
    clock.now += 3725
    assert progress.line() == ("upgrading the tables (2 of 3): creating index ix_claims_pending, "
                               "1h2m5s")
    progress.measure(1000, 4000, "blocks")
    clock.now += 2
    progress.measure(3000, 4000, "blocks")
    assert progress.line() == ("upgrading the tables (2 of 3): creating index ix_claims_pending, "
                               "3,000 of 4,000 blocks (75%), 1,000 blocks/s, 1s left")
    progress.measure(10, 50_000, "tuples")  # a new phase counts afresh
    assert progress.line().endswith("10 of 50,000 tuples (0%), 1h2m7s")


def test_a_statement_s_first_frame_already_says_what_it_does() -> None:
    """A stage drawn at once shows its statement (drawn before a separate detail
    call could set it, a statement shorter than a redraw showed only its number)."""
    stream = Terminal()
    with Progress(show=True, stream=stream) as progress:
        progress.stage("upgrading the tables (3 of 4)", counted=False,
                       detail="creating index ix_claims_pending")
        progress.stage("upgrading the tables (4 of 4)", counted=False,
                       detail="creating index ix_claims_job_claimed")
    assert frames(stream.getvalue())[0] == (
        "upgrading the tables (3 of 4): creating index ix_claims_pending, 0s")


def test_a_note_ends_the_line() -> None:
    progress = Progress(show=False)
    progress.stage("purging claims")
    progress.note(Interrupts.NOTE)
    assert progress.line().endswith(", stopping after this batch (Ctrl-C again to stop at once)")


def test_it_redraws_in_place_at_most_ten_times_a_second_and_erases_itself() -> None:
    stream = Terminal()
    with Progress(show=True, stream=stream) as progress:
        progress.stage("purging claims", total=1_000_000)
        deadline = time.monotonic() + 0.65
        while time.monotonic() < deadline:
            progress.advance(1)  # far more updates than redraws
    text = stream.getvalue()
    drawn = frames(text)
    assert 3 <= len(drawn) <= 8, drawn
    assert all(line.startswith("purging claims: ") for line in drawn)
    assert "\n" not in text and text.endswith("\r\x1b[K")  # nothing left on the screen


def test_a_line_wider_than_the_terminal_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    stream = Terminal()
    progress = Progress(show=True, stream=stream)
    progress.stage("upgrading the tables (1 of 3)", counted=False)
    progress.detail("creating index ix_a_rather_long_table_name_pending")
    progress.draw()
    (line,) = frames(stream.getvalue())
    assert len(line) == 39 and line.endswith("...")


def test_quiet_it_writes_nothing() -> None:
    stream = Terminal()
    with Progress(show=False, stream=stream) as progress:
        progress.stage("purging claims", total=10)
        progress.advance(10)
        progress.draw()
    assert stream.getvalue() == ""


def test_a_person_watches_only_when_stdout_and_stderr_are_terminals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr("sys.stdout", Terminal())
    monkeypatch.setattr("sys.stderr", Terminal())
    assert watching() is True
    assert watching(as_json=True) is False
    monkeypatch.setenv("TERM", "dumb")
    assert watching() is False
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr("sys.stdout", io.StringIO())  # `elarion-beat purge | tee log`
    assert watching() is False
    monkeypatch.setattr("sys.stdout", Terminal())
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert watching() is False


def test_ctrl_c_asks_once_then_stops_at_once_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    progress = Progress(show=False)
    with Interrupts(progress) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and progress.line().endswith(Interrupts.NOTE)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    assert INTERRUPTED == 130
