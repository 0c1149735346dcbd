"""Harness of the live-control acceptance tests (issue #14): the cluster of :mod:`~.runs`
on the app :mod:`tests.acceptance.proj_control`, and the operator's ``celery
elarion-beat`` commands run as real processes.

What :class:`ControlCluster` adds to :class:`~.runs.RunsCluster`:

* :meth:`~ControlCluster.cli` runs ``celery -A tests.acceptance.proj_control
  elarion-beat <command>`` processes, several at once, and tells when each returned;
  with ``barrier=True`` each process imports everything first and waits at a barrier
  (a file), and the test releases them all at one instant, so their database work
  starts together (a race, not a queue);
* one worker runs the every-node entry of every beat (it consumes each beat's node
  queue too: ``ELARION_ACC_CONSUME_NODES``);
* the pauses and audit tables are read straight from the database;
* each run's ``elarion_manual`` header (the runs table's ``manual`` column).

Run as a module, this file is the barrier side of :meth:`~ControlCluster.cli`:
``python -m tests.acceptance.control GO_FILE -A app elarion-beat ...`` imports
Celery, the app and the command, touches ``GO_FILE.<pid>``, waits for ``GO_FILE``,
then runs the command as ``celery`` would.
"""

from __future__ import annotations

import getpass
import importlib
import json
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager, clean_env, wait_until
from tests.acceptance import proj_control
from tests.acceptance.cluster import START_TIMEOUT
from tests.acceptance.runs import RunsCluster

APP = "tests.acceptance.proj_control"

#: the beats of the cluster, and so the node queues the one worker consumes too
NODES = ("node-1", "node-2", "node-3")


def cli_node() -> str:
    """The OS user at this host: the node of a claims row the CLI wrote."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def cli_actor() -> str:
    """Who the CLI says ran it (the audit's actor)."""
    return f"{cli_node()} (cli)"


@dataclass(frozen=True)
class CliRun:
    """One ``elarion-beat`` command, run to its end (or killed after a time-out)."""

    args: tuple[str, ...]
    rc: int | None
    output: str
    started: float   # time.time() when started (released, with the barrier)
    returned: float  # time.time() when it was seen to have exited

    def __str__(self) -> str:
        return (f"`elarion-beat {' '.join(self.args)}` rc {self.rc}:\n"
                f"{self.output.strip()[-3000:]}")


def json_lines(output: str) -> list[dict[str, Any]]:
    """The JSON objects of *output*, one a line (``--json`` of ``audit``); Celery's
    warnings and other lines are skipped."""
    found = []
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


class ControlCluster(RunsCluster):
    """Beats ``node-1`` .. ``node-3`` and one worker of :mod:`tests.acceptance.proj_control`."""

    proj = proj_control

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str,
                 beats: int = len(NODES)) -> None:
        super().__init__(workdir, pg_dsn=pg_dsn, broker_url=broker_url, schedule="",
                         beats=beats)
        self.pm = ProcessManager(workdir, APP, self.env)
        settings = Settings.from_mapping({"elarion_beat_table": self.claims_table})
        self.pauses_table = settings.pauses_table
        self.audit_table = settings.audit_table
        self._clis = 0

    def start_control_worker(self) -> ChildProcess:
        """The one worker: it runs the cluster's entries and every beat's every-node runs,
        and records each run on its claim row."""
        return self.start_worker("w1", env={"ELARION_ACC_CONSUME_NODES": ",".join(NODES)})

    # -- the operator's commands ------------------------------------------------------

    def cli(self, *commands: Sequence[str], barrier: bool = False,
            env: Mapping[str, str] | None = None,
            timeout: float = START_TIMEOUT) -> list[CliRun]:
        """Run each of *commands* (``elarion-beat`` arguments) as its own process, all at
        once; what each printed and when it returned, in the order given."""
        go = self.pm.workdir / f"go-{self._clis}"
        processes = []
        for args in commands:
            self._clis += 1
            name = f"cli-{self._clis}-{args[0]}"
            cmd = ["-A", APP, "elarion-beat", *args]
            if barrier:
                argv = [sys.executable, "-m", "tests.acceptance.control", str(go), *cmd]
            else:
                argv = [sys.executable, "-m", "celery", *cmd]
            process = ChildProcess(name, argv, clean_env({**self.env, **(env or {})}),
                                   self.pm.workdir / f"{name}.log", self.pm.workdir / name)
            self.pm.processes.append(process)
            processes.append(process.start())
        started = {p.name: time.time() for p in processes}
        if barrier:
            ready = [Path(f"{go}.{p.pid}") for p in processes]
            for process, marker in zip(processes, ready, strict=True):
                process.wait_ready(marker.exists, timeout, "waiting at the barrier")
            released = time.time()
            go.touch()
            started = {p.name: released for p in processes}
        returned: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(returned) < len(processes) and time.monotonic() < deadline:
            for process in processes:
                if process.name not in returned and not process.alive():
                    returned[process.name] = time.time()
            time.sleep(0.02)
        runs = []
        for args, process in zip(commands, processes, strict=True):
            rc = process.terminate(timeout=1.0) if process.name not in returned \
                else process.returncode
            runs.append(CliRun(tuple(args), rc, process.log(), started[process.name],
                               returned.get(process.name, time.time())))
        return runs

    def cli_ok(self, *commands: Sequence[str], barrier: bool = False) -> list[CliRun]:
        """:meth:`cli`, failing the test (with the output) unless each command exits 0."""
        runs = self.cli(*commands, barrier=barrier)
        failed = [str(run) for run in runs if run.rc != 0]
        assert not failed, "\n".join(failed)
        return runs

    # -- data ----------------------------------------------------------------------------

    def rows(self, table: str, order: str) -> list[dict[str, Any]]:
        """Every row of *table* (none if it does not exist), ordered by *order*."""
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", [table]).fetchone()
            if not exists or exists[0] is None:
                return []
            cursor = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(
                sql.Identifier(table), sql.Identifier(order)))
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor]

    def pauses(self) -> list[dict[str, Any]]:
        return self.rows(self.pauses_table, "job_name")

    def audit(self) -> list[dict[str, Any]]:
        return self.rows(self.audit_table, "id")

    def manual_headers(self) -> dict[str, int | None]:
        """task id -> the ``elarion_manual`` header its run came with."""
        return {row["task_id"]: row["manual"] for row in self.rows(self.runs_table, "id")}

    def wait_for(self, what: str, check: Any, timeout: float = 20.0) -> Any:
        """Poll *check()* until truthy; the failure names *what* and ends with the logs."""
        return wait_until(check, timeout, interval=0.3,
                          message=lambda: f"{what}\n{self.tails()}")


def _barrier_main(argv: list[str]) -> None:
    """``GO_FILE -A app elarion-beat ...``: import, touch GO_FILE.<pid>, wait, run."""
    import os

    from celery.bin.celery import main as celery_main

    go, args = Path(argv[0]), argv[1:]
    importlib.import_module(args[args.index("-A") + 1])
    importlib.import_module("celery_elarion_beat.cli")
    Path(f"{go}.{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.001)
    sys.argv = ["celery", *args]
    celery_main()


if __name__ == "__main__":
    _barrier_main(sys.argv[1:])
