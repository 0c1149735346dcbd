"""Progress of long work, for a person at a terminal; Ctrl-C between batches.

:class:`Progress` draws one line on stderr and redraws it in place (``\\r``), at
most ten times a second (a ticker thread keeps the clock moving while one long
step reports nothing): what is being done, how far it got, the rate and the time
left::

    purging claims: 120,000 of ~200,000 rows (60%), 45,000 rows/s, 2s left

It draws only for a person (:func:`watching`): stdout and stderr are terminals,
there is no ``--json``, and the terminal is not ``dumb``. Otherwise it stays
silent, and the command prints its summary (one line, or one JSON object) at the
end as always. The line is erased before anything else is printed.

:class:`Interrupts`: the first Ctrl-C (SIGINT) asks the work to stop after the
batch in hand (:attr:`Interrupts.requested`; the progress line says so), the second
stops it at once (``KeyboardInterrupt``). A command stopped either way says what it
did and exits with :data:`INTERRUPTED` (130, as a shell reports SIGINT).

Used by ``purge`` and ``init-db``; any command with long work uses it the same way::

    with Interrupts() as stop, Progress(show=watching(as_json)) as progress:
        progress.stage("importing schedules", total=len(rows), unit="entries")
        for batch in batches:
            ...
            progress.advance(len(batch))
            if stop.requested:
                break
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, TextIO

from ..config.parsers import format_duration

__all__ = ["INTERRUPTED", "Interrupts", "Progress", "watching"]

#: The exit code of a command stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
INTERRUPTED = 128 + signal.SIGINT

#: Seconds between two redraws at most (ten a second).
EVERY = 0.1
#: Seconds of recent progress the rate is measured over.
RATE_WINDOW = 5.0

_ERASE = "\r\x1b[K"


def watching(as_json: bool = False) -> bool:
    """Whether a person watches the command: stdout and stderr are terminals, the
    output is not ``--json``, and the terminal can redraw a line (``TERM`` is not
    ``dumb``)."""
    if as_json or os.environ.get("TERM") == "dumb":
        return False
    return _isatty(sys.stdout) and _isatty(sys.stderr)


def _left(seconds: float) -> str:
    """A time left: whole seconds (``0s``, ``42s``, ``12m5s``), minutes past an hour."""
    return format_duration(seconds, 1) if seconds < 3600 else format_duration(
        seconds, approximate=True)


def _columns(stream: TextIO) -> int:
    """The width of the terminal *stream* writes to (``COLUMNS`` first), else 100."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(stream.fileno()).columns or 100
    except (AttributeError, ValueError, OSError):
        return 100


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by a test runner, or closed
        return False


class Progress:
    """One progress line on *stream* (stderr), drawn only when *show*.

    The work is a series of stages (:meth:`stage`), each with its label, the amount
    done (:meth:`advance`), an optional total (``about``: an estimate, shown with
    ``~``) and unit, and a note (:meth:`note`). Use it as a context manager: the
    ticker starts on entry, and the line is erased on exit.
    """

    def __init__(self, show: bool, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, every: float = EVERY) -> None:
        self.show = show
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.every = every
        self.label = ""
        self.unit = "rows"
        self.total: int | None = None
        self.about = False
        self.done: int | None = None
        self.extra = ""
        self._note = ""
        self._started = clock()
        self._samples: deque[tuple[float, int]] = deque()
        self._lock = threading.RLock()
        self._drawn = False
        self._last_draw = float("-inf")
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._probe: Callable[[], None] | None = None
        self._probe_every = 0.5

    # -- the work reports ------------------------------------------------------

    def stage(self, label: str, total: int | None = None, unit: str = "rows",
              about: bool = False, counted: bool = True, detail: str = "") -> None:
        """Start a stage: *label*, of *total* *unit* (an estimate when *about*);
        without *counted* it shows only its label, *detail*, note and elapsed time
        (one long statement)."""
        with self._lock:
            self.label, self.total, self.unit, self.about = label, total, unit, about
            self.done = 0 if counted else None
            self.extra = detail
            self._started = self.clock()
            self._samples = deque([(self._started, 0)])
        if self._ticker is not None and time.monotonic() - self._last_draw >= self.every:
            self.draw()  # a new stage shows at once (within the ten redraws a second)

    def advance(self, count: int) -> None:
        """*count* more done in this stage."""
        with self._lock:
            self.done = (self.done or 0) + count
            now = self.clock()
            self._samples.append((now, self.done))
            while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
                self._samples.popleft()

    def measure(self, done: int, total: int, unit: str) -> None:
        """*done* of *total* *unit* so far, as something else counted them (the
        database, for one long statement): a new unit starts the rate afresh."""
        with self._lock:
            if unit != self.unit or self.done is None or done < self.done:
                self.unit, self.done = unit, done
                self._samples = deque([(self.clock(), done)])
            self.total, self.about = total, False
            self.advance(done - (self.done or 0))

    def watch(self, probe: Callable[[], None], every: float = 0.5) -> None:
        """Call *probe* from the ticker every *every* seconds while drawing (it reads
        how far one long step got and reports it with :meth:`measure`); its errors
        are ignored."""
        self._probe, self._probe_every = probe, every

    def detail(self, text: str) -> None:
        """What the stage is at, when it counts nothing itself (a statement's phase)."""
        self.extra = text

    def note(self, text: str) -> None:
        """A note at the end of the line (``stopping after this batch``); '' for none."""
        self._note = text

    # -- what it shows ---------------------------------------------------------

    @property
    def elapsed(self) -> float:
        """Seconds since the stage started."""
        return max(0.0, self.clock() - self._started)

    @property
    def rate(self) -> float | None:
        """Units per second over the last few seconds, or None before any."""
        with self._lock:
            if self.done is None or len(self._samples) < 2:
                return None
            (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
            span = t1 - t0
            return (d1 - d0) / span if span > 0 and d1 > d0 else None

    @property
    def left(self) -> float | None:
        """Seconds left at the current rate, or None when unknown."""
        rate = self.rate
        if self.total is None or self.done is None or not rate:
            return None
        return max(0, self.total - self.done) / rate

    def line(self) -> str:
        """The line as drawn now (without the redraw codes)."""
        with self._lock:
            parts = [self.extra]
            if self.done is None:
                parts.append(format_duration(self.elapsed, 1))
            else:
                amount = f"{self.done:,}"
                if self.total is not None:
                    share = min(100, self.done * 100 // self.total) if self.total else 100
                    amount += f" of {'~' if self.about else ''}{self.total:,} {self.unit} " \
                              f"({share}%)"
                else:
                    amount += f" {self.unit}"
                parts.append(amount)
                rate = self.rate
                if rate is not None:
                    parts.append(f"{rate:,.0f} {self.unit}/s")
                left = self.left
                parts.append(f"{_left(left)} left" if left is not None
                             else format_duration(self.elapsed, 1))
            if self._note:
                parts.append(self._note)
            return f"{self.label}: " + ", ".join(p for p in parts if p)

    # -- drawing -----------------------------------------------------------------

    def draw(self) -> None:
        """Redraw the line now (the ticker does it ten times a second)."""
        if not self.show or not self.label:
            return
        text = self.line()
        width = _columns(self.stream) - 1
        if len(text) > width > 10:
            text = text[:width - 3] + "..."
        with self._lock:
            self._write(_ERASE + text)
            self._drawn = True
            self._last_draw = time.monotonic()

    def clear(self) -> None:
        """Erase the line (before the command prints anything else)."""
        with self._lock:
            if self._drawn:
                self._write(_ERASE)
                self._drawn = False

    def echo(self, text: str) -> None:
        """Print a line of *text* on the stream, under the progress line."""
        with self._lock:
            self.clear()
            self._write(text + "\n")
            if self._ticker is not None:
                self.draw()

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: keep working, silently
            self.show = False

    def _tick(self) -> None:
        probed = float("-inf")
        while not self._stop.wait(min(self.every, max(
                0.01, self._last_draw + self.every - time.monotonic()))):
            if self._probe is not None and self.clock() - probed >= self._probe_every:
                probed = self.clock()
                try:
                    self._probe()
                except Exception:  # a probe never stops the work it watches
                    pass
            if time.monotonic() - self._last_draw >= self.every:
                self.draw()

    def __enter__(self) -> Progress:
        if self.show:
            self._ticker = threading.Thread(target=self._tick, name="elarion-progress",
                                            daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        self.clear()


class Interrupts:
    """Ctrl-C as a request: the first sets :attr:`requested` (the work stops after
    the batch in hand), the second raises ``KeyboardInterrupt`` (it stops now).

    *progress*, when given, notes the request on its line. Outside the main thread
    (where no signal handler can be set) Ctrl-C keeps its default meaning.
    """

    NOTE = "stopping after this batch (Ctrl-C again to stop at once)"

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.progress is not None:
            self.progress.note(self.NOTE)  # drawn by the ticker: no I/O in a handler

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
