"""Child processes for the tests, the demo and the benchmarks: start, wait, stop, reap.

A :class:`ChildProcess` runs in a session (process group) of its own, with the
environment :func:`clean_env` scrubs, and writes stdout and stderr to one log
file. It waits for a log pattern, a JSON log record (``elarion_beat_log_format =
"json"``) or any other condition, and fails early, with the tail of its log, when
it exits instead. Stopping it sends SIGTERM, then SIGKILL to the whole group after
a timeout; an ``atexit`` hook kills whatever is still running when the
interpreter exits.
:class:`ProcessManager` starts ``celery`` beats and workers of one app in one
work directory and stops them all, however the caller ends.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

from ...config.parsers import format_duration
from ...exceptions import ElarionBeatError
from ...observe.logformat import read_json_log

__all__ = ["ChildProcess", "ProcessError", "ProcessManager", "clean_env", "sleep_until",
           "stop_all", "wait_until"]

T = TypeVar("T")
P = TypeVar("P", bound="ChildProcess")

#: The directory that holds the ``celery_elarion_beat`` package (the repository root
#: in a development install): children import the package, and the repository's test
#: and benchmark apps, from it.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]

#: Variables of the parent's environment that must not leak into a child.
_LEAKY_PREFIXES = ("ELARION_", "CELERY_", "FORKED_BY_MULTIPROCESSING", "PYTEST_CURRENT_TEST")
#: ... except these (see :func:`clean_env`).
_INHERITED = ("ELARION_BEAT_CLUSTER",)

#: celery logs a redirected traceback one write() at a time: lines of only "^~" crumbs
_CRUMB = re.compile(r"^\[[^]]*: WARNING/MainProcess\] [\s^~.:]*$")

_LIVE: set[ChildProcess] = set()


class ProcessError(ElarionBeatError, AssertionError):
    """A child process did not do what was waited for."""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ELARION_*/CELERY_* variables, plus *extra*.

    ``ELARION_BEAT_CLUSTER`` passes: a run that pins the cluster (the test suite does,
    so its stores read what its children wrote) pins it for its children too."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LEAKY_PREFIXES) or k in _INHERITED}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def wait_until(predicate: Callable[[], T | None], timeout: float, interval: float = 0.2,
               message: str | Callable[[], str] = "condition") -> T:
    """Poll *predicate* until it returns a truthy value, and return that value.

    Raises :class:`ProcessError` after *timeout* seconds (``time.monotonic``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise ProcessError(f"timed out after {format_duration(timeout)} waiting for {text}")
        time.sleep(interval)


def sleep_until(ts: float) -> None:
    """Sleep until the wall-clock instant *ts* (``time.time()``: a slot is a wall-clock time)."""
    while (left := ts - time.time()) > 0:
        time.sleep(min(left, 0.2))


class ChildProcess:
    """One child process in a session of its own, writing its output to *log_path*."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str],
                 log_path: Path, cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.killed_at: float | None = None  # time.time() of kill -9

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> ChildProcess:
        self.cwd.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.time()
        _LIVE.add(self)
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProcessError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send *sig* to the process group (the process and anything it forked)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the group id is the pid
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def sigterm(self) -> None:
        """Ask for a warm shutdown without waiting (see :meth:`terminate`)."""
        if self.alive():
            self.signal(signal.SIGTERM)

    def kill9(self) -> None:
        """``kill -9`` the group; no cleanup runs in it."""
        self.killed_at = time.time()
        self.signal(signal.SIGKILL)
        self.wait(10)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the process still runs after *timeout* seconds."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout: float = 20.0, sigterm: bool = True) -> int | None:
        """SIGTERM (warm shutdown; not again with *sigterm* False: the caller sent it, and
        a second one in the middle of a shutdown interrupts the interpreter's exit);
        SIGKILL the group if still alive after *timeout*."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if sigterm:
                self.signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.signal(signal.SIGKILL)
                self.wait(10)
        self.signal(signal.SIGKILL)  # stragglers of the group never outlive their leader
        if self.proc.poll() is not None:
            _LIVE.discard(self)
        return self.proc.poll()

    # -- output --------------------------------------------------------------

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def lines(self, *needles: str) -> list[str]:
        """Log lines containing every one of *needles*."""
        return [line for line in self.log().splitlines() if all(n in line for n in needles)]

    def records(self, **match: Any) -> list[dict[str, Any]]:
        """The JSON log records (``elarion_beat_log_format = "json"``) whose fields equal
        *match*; the other lines are skipped."""
        return read_json_log(self.log(), **match)

    def tail(self, n: int = 40) -> str:
        lines = [line for line in self.log().splitlines() if not _CRUMB.match(line)]
        pid = self.proc.pid if self.proc else "-"
        head = (f"----- {self.name} (pid {pid}, rc {self.returncode}) last "
                f"{min(n, len(lines))} of {len(lines)} lines of {self.log_path} -----")
        return "\n".join([head, *lines[-n:]])

    # -- readiness -----------------------------------------------------------

    def wait_ready(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        """Wait until *check* returns a truthy value; fail early if the process exits.

        *what* names the condition in the error, which ends with the log's tail.
        """
        def probe() -> T | None:
            found = check()
            if not found and not self.alive():
                found = check()  # it may have got there just before exiting
                if not found:
                    raise ProcessError(f"{self.name} exited (rc {self.returncode}) before "
                                       f"{what}\n{self.tail()}")
            return found

        return wait_until(probe, timeout, message=lambda: f"{self.name}: {what}\n{self.tail()}")

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Wait until the log matches *pattern*; the match."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        return self.wait_ready(lambda: regex.search(self.log()), timeout,
                               f"logging {regex.pattern!r}")

    def wait_for_record(self, match: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Wait for a JSON log record whose fields equal *match*; the first one."""
        def first() -> dict[str, Any] | None:
            return next(iter(self.records(**match)), None)

        return self.wait_ready(first, timeout, f"logging a record with {dict(match)}")

    def __repr__(self) -> str:
        return f"<ChildProcess {self.name} pid={self.proc.pid if self.proc else None}>"


def stop_all(processes: Iterable[ChildProcess], timeout: float = 20.0) -> None:
    """SIGTERM every one of *processes* at once, then wait for each (SIGKILL after
    *timeout*): one SIGTERM each."""
    processes = list(processes)
    for process in processes:
        process.sigterm()
    for process in processes:
        process.terminate(timeout, sigterm=False)


class ProcessManager:
    """Starts ``celery -A <app>`` processes in *workdir* and always stops them."""

    def __init__(self, workdir: Path, app: str, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.app = app
        self.base_env = dict(env or {})
        self.processes: list[ChildProcess] = []

    @overload
    def celery(self, name: str, args: Iterable[str], env: Mapping[str, str] | None = None,
               start: bool = True) -> ChildProcess: ...

    @overload
    def celery(self, name: str, args: Iterable[str], env: Mapping[str, str] | None = None,
               start: bool = True, *, kind: type[P], **options: Any) -> P: ...

    def celery(self, name: str, args: Iterable[str], env: Mapping[str, str] | None = None,
               start: bool = True, *, kind: type[ChildProcess] = ChildProcess,
               **options: Any) -> ChildProcess:
        """``python -m celery -A <app> <args>``, logging to ``<workdir>/<name>.log``; a
        :class:`ChildProcess`, or a *kind* of it made with *options* (a
        :class:`~.terminal.TerminalProcess`: the command on terminals)."""
        argv = [sys.executable, "-m", "celery", "-A", self.app, *args]
        make: Any = kind
        process: ChildProcess = make(name, argv, clean_env({**self.base_env, **(env or {})}),
                                     self.workdir / f"{name}.log", self.workdir / name,
                                     **options)
        self.processes.append(process)
        return process.start() if start else process

    def beat(self, name: str, *args: str, env: Mapping[str, str] | None = None,
             scheduler: str = "celery_elarion_beat.ClaimingScheduler",
             loglevel: str = "INFO") -> ChildProcess:
        return self.celery(name, ["beat", "-S", scheduler, "-l", loglevel, *args], env=env)

    def worker(self, name: str, *args: str, env: Mapping[str, str] | None = None,
               loglevel: str = "INFO") -> ChildProcess:
        """A solo-pool worker named ``<name>@%h``, without gossip, mingle and heartbeat."""
        return self.celery(name, [
            "worker", "-l", loglevel, "--pool", "solo", "-n", f"{name}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", *args], env=env)

    def stop_all(self, timeout: float = 20.0) -> None:
        """Stop every process, the last started first."""
        stop_all(reversed(self.processes), timeout)

    def tails(self, n: int = 40) -> str:
        return "\n".join(p.tail(n) for p in self.processes)

    def __enter__(self) -> ProcessManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_LIVE):
        if process.alive():
            process.signal(signal.SIGKILL)
