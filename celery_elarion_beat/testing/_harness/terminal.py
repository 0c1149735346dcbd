"""A child process run as a person runs it: on a terminal.

:class:`TerminalProcess` is a :class:`~.processes.ChildProcess` whose stdout and
stderr are each a pseudo-terminal of its own (a test tells them apart, and both
answer ``isatty()``), or, with ``stdout_tty=False``, whose stdout is a pipe (as in
``cmd | less``: stderr stays a terminal). Its stdin is a terminal too, and the
controlling terminal of its session: :meth:`TerminalProcess.ctrl_c` types Ctrl-C
there, and the terminal sends SIGINT to the process, as it would for a person.

What it wrote is kept raw, carriage returns and escape codes included
(:meth:`~TerminalProcess.stdout`, :meth:`~TerminalProcess.stderr`), and copied to
its log file; :func:`frames` splits a progress line's redraws out of it. The
terminals translate ``\\n`` to ``\\r\\n`` on output, as terminals do.

Start one with ``ProcessManager.celery(name, args, kind=TerminalProcess)``.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .processes import _LIVE, ChildProcess

__all__ = ["TerminalProcess", "frames", "plain"]

#: What a progress line writes before each redraw: go to the line's start, erase it.
_REDRAW = re.compile(r"\r\x1b\[K")
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def frames(text: str) -> list[str]:
    """The redraws of a progress line in *text* (each drawn after ``\\r`` + erase),
    non-empty ones only, in order."""
    out = []
    for chunk in _REDRAW.split(text)[1:]:
        line = chunk.split("\r\n")[0].split("\n")[0]
        if line.strip():
            out.append(line)
    return out


def plain(text: str) -> str:
    """*text* as a terminal leaves it on screen, line by line: each redrawn line
    reduced to what was drawn last, escape codes dropped, ``\\r\\n`` as ``\\n``."""
    lines = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        shown = _REDRAW.split(raw)[-1].split("\r")[-1]
        lines.append(_ESCAPE.sub("", shown))
    return "\n".join(lines)


def _controlling_terminal() -> None:  # pragma: no cover - runs in the child
    """In the child, after ``setsid()``: stdin becomes the session's controlling
    terminal, so Ctrl-C typed on it sends SIGINT to the child's process group."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class TerminalProcess(ChildProcess):
    """One child process on terminals (see the module docstring), *columns* wide."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str],
                 log_path: Path, cwd: Path, stdout_tty: bool = True, columns: int = 160) -> None:
        super().__init__(name, argv, env, log_path, cwd)
        self.stdout_tty = stdout_tty
        self.columns = columns
        self._out = bytearray()
        self._err = bytearray()
        self._lock = threading.Lock()
        self._keyboard: int | None = None
        self._readers: list[threading.Thread] = []

    def start(self) -> TerminalProcess:
        self.cwd.mkdir(parents=True, exist_ok=True)
        keyboard, tty_in = pty.openpty()
        err_master, err_slave = pty.openpty()
        if self.stdout_tty:
            out_master, out_slave = keyboard, os.dup(tty_in)
        else:
            out_master, out_slave = os.pipe()
        for fd in (tty_in, err_slave, out_slave):
            if os.isatty(fd):
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, self.columns, 0, 0))
        try:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=tty_in, stdout=out_slave,
                stderr=err_slave, start_new_session=True, preexec_fn=_controlling_terminal)
        finally:
            for fd in {tty_in, out_slave, err_slave}:
                os.close(fd)
        self.started_at = time.time()
        self._keyboard = keyboard
        _LIVE.add(self)
        self._readers = [threading.Thread(target=self._read, args=(fd, buf), daemon=True,
                                          name=f"{self.name}-{what}")
                         for fd, buf, what in ((out_master, self._out, "stdout"),
                                               (err_master, self._err, "stderr"))]
        if not self.stdout_tty:
            # stdin's terminal is read too: a child that writes to it must not block
            self._readers.append(threading.Thread(target=self._read, daemon=True,
                                                  args=(keyboard, bytearray())))
        for reader in self._readers:
            reader.start()
        return self

    def _read(self, fd: int, into: bytearray) -> None:
        with open(self.log_path, "ab") as log:
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: every end of the terminal's child side is closed
                    break
                if not data:
                    break
                with self._lock:
                    into.extend(data)
                log.write(data)
                log.flush()
        if fd != self._keyboard:
            os.close(fd)

    def ctrl_c(self) -> None:
        """Type Ctrl-C on the child's terminal: SIGINT to its foreground process group."""
        if self._keyboard is not None:
            os.write(self._keyboard, b"\x03")

    def finish(self, timeout: float) -> int | None:
        """Wait for the exit and for the last of the output; the exit code, or None."""
        code = self.wait(timeout)
        if code is not None:
            for reader in self._readers:
                reader.join(timeout=5)
            if self._keyboard is not None:
                try:
                    os.close(self._keyboard)
                except OSError:
                    pass
                self._keyboard = None
        return code

    def stdout(self) -> str:
        with self._lock:
            return self._out.decode(errors="replace")

    def stderr(self) -> str:
        with self._lock:
            return self._err.decode(errors="replace")

    def log(self) -> str:
        return self.stdout() + self.stderr()
