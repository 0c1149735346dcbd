"""The demo's subprocesses, their environment and the live progress."""
from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from .app import ENV_BROKER, ENV_DIR, ENV_RUN


class Process:
    """One celery subprocess in its own process group, logging to a file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path,
                 cwd: Path) -> None:
        self.name, self.argv, self.env, self.log_path, self.cwd = name, argv, env, log, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        self.cwd.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, env=dict(self.env), cwd=self.cwd,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.append(self)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the group id is the pid
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float) -> None:
        if self.proc is None:
            return
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)  # the process if it hung, any child it forked
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


_LIVE: list[Process] = []


@atexit.register
def _kill_leftovers() -> None:
    for process in _LIVE:
        if process.alive():
            process.signal(signal.SIGKILL)


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def child_env(workdir: Path, node: str, dsn: str, broker: str, run: str,
              table: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELARION_", "CELERY_"))}
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.update({
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        ENV_DIR: str(workdir),
        ENV_BROKER: broker,
        ENV_RUN: run,
        "ELARION_BEAT_DSN": dsn,
        "ELARION_BEAT_NODE": node,
    })
    if table:
        env["ELARION_BEAT_TABLE"] = table
    return env


def wait_for(processes: Iterable[Process], pattern: str, timeout: float) -> None:
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    pending = list(processes)
    while pending:
        for p in list(pending):
            if regex.search(p.log()):
                pending.remove(p)
            elif not p.alive():
                raise RuntimeError(f"{p.name} exited before it was ready; its log "
                                   f"({p.log_path}) ends:\n{tail(p.log())}")
        if pending and time.monotonic() > deadline:
            names = ", ".join(p.name for p in pending)
            raise RuntimeError(f"{names} not ready after {timeout:g}s; the log of "
                               f"{pending[0].name} ends:\n{tail(pending[0].log())}")
        time.sleep(0.2)


def tail(text: str, n: int = 25) -> str:
    return "\n".join(text.splitlines()[-n:])


class Progress:
    """Prints each new line of the results file as the workers append it."""

    def __init__(self, path: Path, out: TextIO) -> None:
        self.path, self.out = path, out
        self.offset = 0
        self._stuck = 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        while (end := data.find(b"\n") + 1) > 0:
            line, data = data[:end], data[end:]
            try:
                run = json.loads(line)
            except ValueError:
                # read while a worker was still appending it: try again next poll
                self._stuck += 1
                if self._stuck < 20:
                    return
                print(f"  (unreadable results line skipped: {line[:60]!r})", file=self.out)
            else:
                self._print(run)
            self._stuck = 0
            self.offset += end

    def _print(self, run: dict[str, Any]) -> None:
        at = datetime.fromtimestamp(run["at"], timezone.utc).strftime("%H:%M:%S")
        if run["placement"] == "every_node":
            what = "every node"
        else:
            what = f"{run['claim']} {(run['occurrence'] or '?')[11:19]}"
        print(f"  {at}  {run['job']:<22} {what:<15} sent by {run['sent_by']}  "
              f"ran on {run['ran_on']}", file=self.out, flush=True)


def iter_sleep(seconds: float, step: float = 0.2) -> Iterator[None]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))
