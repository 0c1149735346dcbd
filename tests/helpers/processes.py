"""Real ``celery`` subprocesses for acceptance tests.

Each process runs ``python -m celery -A <app> <command> ...`` in its own
session (process group), with its own environment, and writes stdout and
stderr to one log file. :class:`ProcessManager` tears every process down
(SIGTERM, then SIGKILL of the whole group) however the test ends, and an
``atexit`` hook kills anything still left when the interpreter exits.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

__all__ = ["CeleryProcess", "ProcessManager", "ProcessError", "clean_env", "wait_until"]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Environment variables of the host that must not leak into a test process.
_LEAKY_PREFIXES = ("ELARION_", "CELERY_", "FORKED_BY_MULTIPROCESSING")

_LIVE: weakref.WeakSet[CeleryProcess] = weakref.WeakSet()
_CRUMB = re.compile(r"^\[[^]]*: WARNING/MainProcess\] [\s^~.:]*$")


class ProcessError(AssertionError):
    """A process did not do what the test waited for (message includes its log tail)."""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without ELARION_*/CELERY_* variables, plus *extra*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(extra or {})
    return env


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.2,
               message: str | Callable[[], str] = "condition") -> object:
    """Poll *predicate* until it returns a truthy value; raise after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise ProcessError(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(interval)


class CeleryProcess:
    """One ``celery`` subprocess whose output goes to *log_path*."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path,
                 cwd: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.killed_at: float | None = None  # time.time() of kill -9

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> CeleryProcess:
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
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """``kill -9`` the process (and anything it forked); no cleanup runs in it."""
        self.killed_at = time.time()
        self._signal_group(signal.SIGKILL)
        self.wait(10)

    def sigterm(self) -> None:
        """Ask for a warm shutdown without waiting (see :meth:`terminate`)."""
        if self.alive():
            self._signal_group(signal.SIGTERM)

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (warm shutdown); SIGKILL the group if still alive after *timeout*."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            if self.wait(timeout) is None:
                self._signal_group(signal.SIGKILL)
                self.wait(10)
        # stragglers of the group (a forked child) never outlive the test
        self._signal_group(signal.SIGKILL)
        return self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: pgid == pid
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    # -- output --------------------------------------------------------------

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def lines(self, *needles: str) -> list[str]:
        """Log lines containing every one of *needles*."""
        return [line for line in self.log().splitlines() if all(n in line for n in needles)]

    def tail(self, n: int = 40) -> str:
        # celery logs a redirected traceback one write() at a time: drop the "^^^" crumbs
        lines = [line for line in self.log().splitlines() if not _CRUMB.match(line)]
        head = f"----- {self.name} (pid {self.proc.pid if self.proc else '-'}, " \
               f"rc {self.returncode}) last {min(n, len(lines))} of {len(lines)} lines of " \
               f"{self.log_path} -----"
        return "\n".join([head, *lines[-n:]])

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Wait until the log matches *pattern*; fail early if the process dies."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern

        def check() -> re.Match[str] | None:
            found = regex.search(self.log())
            if found is None and not self.alive():
                found = regex.search(self.log())  # it may have written it just before exiting
                if found is None:
                    raise ProcessError(
                        f"{self.name} exited (rc {self.returncode}) before logging "
                        f"{regex.pattern!r}\n{self.tail()}")
            return found

        return wait_until(check, timeout, message=lambda: f"{self.name} to log "
                          f"{regex.pattern!r}\n{self.tail()}")  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<CeleryProcess {self.name} pid={self.proc.pid if self.proc else None}>"


class ProcessManager:
    """Starts celery processes for one test and always tears them down."""

    def __init__(self, workdir: Path, app: str, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.app = app
        self.base_env = dict(env or {})
        self.processes: list[CeleryProcess] = []

    def celery(self, name: str, args: Iterable[str], env: Mapping[str, str] | None = None,
               start: bool = True) -> CeleryProcess:
        argv = [sys.executable, "-m", "celery", "-A", self.app, *args]
        proc_env = clean_env({**self.base_env, **(env or {})})
        process = CeleryProcess(name, argv, proc_env, self.workdir / f"{name}.log",
                                self.workdir / name)
        self.processes.append(process)
        return process.start() if start else process

    def beat(self, name: str, *args: str, env: Mapping[str, str] | None = None,
             scheduler: str = "celery_elarion_beat.ClaimingScheduler",
             loglevel: str = "INFO") -> CeleryProcess:
        return self.celery(name, ["beat", "-S", scheduler, "-l", loglevel, *args], env=env)

    def worker(self, name: str, *args: str, env: Mapping[str, str] | None = None,
               loglevel: str = "INFO") -> CeleryProcess:
        return self.celery(name, [
            "worker", "-l", loglevel, "--pool", "solo", "-n", f"{name}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", *args], env=env)

    def stop_all(self, timeout: float = 20.0) -> None:
        for process in reversed(self.processes):
            process.sigterm()
        for process in reversed(self.processes):
            process.terminate(timeout)

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
            process._signal_group(signal.SIGKILL)
