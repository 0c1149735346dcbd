"""The demo's child environment, its live progress and its timer.

The subprocesses themselves are started, stopped and reaped by
:mod:`celery_elarion_beat.testing`, as in the tests and the benchmarks.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from .app import DEMO_CLUSTER, ENV_BROKER, ENV_DIR, ENV_RUN


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def demo_env(workdir: Path, dsn: str, broker: str, run: str,
             table: str | None) -> dict[str, str]:
    """The variables that configure every beat and worker of the demo (but the node)."""
    # the cluster pinned: the demo's own store (the verdict) reads what its beats wrote
    env = {ENV_DIR: str(workdir), ENV_BROKER: broker, ENV_RUN: run, "ELARION_BEAT_DSN": dsn,
           "ELARION_BEAT_CLUSTER": DEMO_CLUSTER}
    if table:
        env["ELARION_BEAT_TABLE"] = table
    return env


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
