"""``python -m celery_elarion_beat.demo``: three real beat replicas share one schedule.

The demo starts three nodes, ``node-a``, ``node-b`` and ``node-c``, each one a real
``celery beat -S celery_elarion_beat.ClaimingScheduler`` process and a real
``celery worker --pool solo`` process that consumes the shared queue and its own
node queue. It prints a line per executed occurrence as the workers run them,
stops after ``--seconds`` (60), and ends with a table: per occurrence, which node
won its claim, which nodes skipped it and where it ran; the every-node runs per
node; and the number of duplicates. It exits 0 when there are none.

Without configuration it needs no servers: claims live in a SQLite file and the
broker is kombu's filesystem transport, both in a temporary directory that is
removed at the end. Point ``ELARION_BEAT_DSN`` at PostgreSQL (and
``CELERY_BROKER_URL`` at Redis or RabbitMQ) to run the same demo there.

This module is also the demo's Celery app: the six subprocesses run
``python -m celery -A celery_elarion_beat.demo ...`` and are configured by the
``ELARION_DEMO_*`` environment variables the demo sets for them.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

from celery import Celery
from celery.schedules import crontab

from .cron import cron
from .node_queue import consume_node_queue
from .settings import mask_dsn

NODES = ("node-a", "node-b", "node-c")
TASK = "elarion_demo.record"

#: beat_schedule entry names, which are the job names in the claims table
CRON_JOB = "report-every-2s"
INTERVAL_JOB = "poll-every-3s"
CRONTAB_JOB = "minutely-crontab"
EVERY_NODE_JOB = "refresh-cache-every-5s"

ENV_DIR = "ELARION_DEMO_DIR"        # work directory: broker folders, results, logs
ENV_BROKER = "ELARION_DEMO_BROKER"  # broker URL (default filesystem://)
ENV_RUN = "ELARION_DEMO_RUN"        # run id: queue names of this run only

RESULTS = "results.jsonl"


# -- the demo's Celery app (imported by every beat and worker subprocess) -----


def beat_schedule() -> dict[str, Any]:
    return {
        # exact slots: every node names the same instant, one node wins it
        CRON_JOB: {"task": TASK, "schedule": cron("*/2 * * * * *"),
                   "kwargs": {"entry": CRON_JOB}},
        CRONTAB_JOB: {"task": TASK, "schedule": crontab(), "kwargs": {"entry": CRONTAB_JOB}},
        # interval: a window claim, "nobody ran this within the last 3 seconds"
        INTERVAL_JOB: {"task": TASK, "schedule": timedelta(seconds=3),
                       "kwargs": {"entry": INTERVAL_JOB}},
        # never claimed: every node sends it to its own node queue
        EVERY_NODE_JOB: {"task": TASK, "schedule": cron("*/5 * * * * *"),
                         "kwargs": {"entry": EVERY_NODE_JOB},
                         "options": {"placement": "every_node"}},
    }


def filesystem_options(workdir: Path) -> dict[str, Any]:
    """kombu filesystem transport options: every process shares one folder."""
    messages = workdir / "broker" / "messages"
    return {
        "data_folder_in": str(messages),
        "data_folder_out": str(messages),
        # processed messages are moved (an atomic rename: only one worker gets each)
        # into a folder on the same file system, not the system temp dir
        "store_processed": True,
        "processed_folder": str(workdir / "broker" / "processed"),
        "control_folder": str(workdir / "broker" / "control"),
        "polling_interval": 0.25,
    }


def declare_filesystem_queues(workdir: Path, run: str) -> None:
    """Declare every queue and binding of the run once, before any worker starts.

    kombu's filesystem transport creates an exchange's binding file with
    ``open("wb")`` before it locks it: workers that start together and bind to the
    same exchange can truncate each other's bindings or read an empty file and
    crash (``JSONDecodeError``). Once the file exists, every binding takes the
    locked read-modify-write path, which is safe.
    """
    from .node_queue import node_queue
    from .settings import Settings

    demo_app = make_app({ENV_DIR: str(workdir), ENV_RUN: run})
    queues = [demo_app.amqp.queues[demo_app.conf.task_default_queue]]
    for node in NODES:
        queues.append(node_queue(Settings.from_mapping({
            "elarion_beat_node": node,
            "elarion_beat_node_queue": demo_app.conf.elarion_beat_node_queue})))
    with demo_app.connection_for_write() as conn:
        for queue in queues:
            queue(conn.default_channel).declare()


def make_app(env: Mapping[str, str]) -> Celery:
    """The demo app, configured from the ``ELARION_DEMO_*`` variables of *env*."""
    workdir = Path(env.get(ENV_DIR) or tempfile.gettempdir())
    broker = env.get(ENV_BROKER) or "filesystem://"
    run = env.get(ENV_RUN) or "local"
    queue = f"elarion-demo-{run}"
    # not the current app, and its task not shared with other apps: importing this module
    # (a test does) must not change the Celery apps of the importing process
    app = Celery("elarion_demo", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_ignore_result=True,
        result_backend=None,
        timezone="UTC",
        enable_utc=True,
        beat_max_loop_interval=1,
        beat_schedule=beat_schedule(),
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=True,
        # this run's node queues only, so a shared Redis/RabbitMQ is not polluted
        elarion_beat_node_queue=f"{queue}.node.{{node}}",
    )
    if broker.startswith("filesystem"):
        app.conf.broker_transport_options = filesystem_options(workdir)
        # Celery events go to a topic exchange nobody consumes here; on the
        # filesystem transport they would pile up as undeliverable files
        app.conf.elarion_beat_events = False
    # the claims settings (elarion_beat_dsn, _node, _table) come from ELARION_BEAT_*
    return app


app = make_app(os.environ)
consume_node_queue(app)


@app.task(bind=True, name=TASK, shared=False)  # type: ignore[untyped-decorator]
def record(self: Any, entry: str | None = None) -> None:
    """Append this execution, with the headers beat sent it with, to the results file."""
    request = self.request
    line = json.dumps({
        "entry": entry,
        "job": getattr(request, "elarion_job", None),
        "occurrence": getattr(request, "elarion_occurrence", None),
        "sent_by": getattr(request, "elarion_node", None),
        "placement": getattr(request, "elarion_placement", None),
        "claim": getattr(request, "elarion_claim", None),
        "task_id": request.id,
        "ran_on": os.environ.get("ELARION_BEAT_NODE"),
        "worker": request.hostname,
        "at": time.time(),
    }) + "\n"
    path = Path(os.environ.get(ENV_DIR) or tempfile.gettempdir()) / RESULTS
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one short O_APPEND write: lines never interleave
    finally:
        os.close(fd)


# -- what the demo reads back ---------------------------------------------------

_SEND = re.compile(r"beat: Sending due task (?P<job>\S+) \([^)]*\) "
                   r"\[(?:(?:slot|window at) (?P<occ>\S+) won|(?P<every>every node))\]")
_SKIP = re.compile(r"beat: Skipping (?P<job>\S+) at (?P<at>\S+)"
                   r"(?: \(window [^,)]*(?:, claimed at (?P<held>[^)\s]+))?\))?"
                   r": (?P<reason>[a-z-]+)(?: \(winner (?P<winner>[^)]+)\))?")


@dataclass(frozen=True)
class Decision:
    """One beat log line: a node sent or skipped an occurrence."""

    node: str
    job: str
    occurrence: str | None  # iso, as in the claims table; None for every-node sends
    sent: bool
    reason: str | None = None
    winner: str | None = None


def parse_beat_log(node: str, text: str) -> list[Decision]:
    out = []
    for line in text.splitlines():
        if m := _SEND.search(line):
            out.append(Decision(node, m["job"], m["occ"], True))
        elif m := _SKIP.search(line):
            out.append(Decision(node, m["job"], m["held"] or m["at"], False, m["reason"],
                                m["winner"] if m["winner"] != "unknown" else None))
    return out


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every execution the workers recorded (read once they have stopped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    runs = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                runs.append(json.loads(line))
            except ValueError:
                raise RuntimeError(f"{path}, line {number}, is not a result: {line[:80]!r}") \
                    from None
    return runs


@dataclass
class Row:
    """One cluster occurrence: who won, who skipped, where it ran."""

    job: str
    occurrence: str
    kind: str = "-"
    winner: str | None = None       # from the claims table
    senders: list[str] = field(default_factory=list)    # from the beat logs
    skipped_by: list[str] = field(default_factory=list)  # from the beat logs
    reasons: list[str] = field(default_factory=list)     # skip reason per skipped_by
    ran_on: list[str] = field(default_factory=list)      # from the results file


@dataclass
class Verdict:
    rows: list[Row]
    every_node: dict[str, Counter[str]]   # sending node -> executing nodes
    every_node_sent: Counter[str]
    duplicates: int
    problems: list[str]               # a broken guarantee: the demo exits 1
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.__dict__ for r in self.rows],
            "every_node": {k: dict(v) for k, v in self.every_node.items()},
            "every_node_sent": dict(self.every_node_sent),
            "duplicates": self.duplicates,
            "problems": self.problems,
            "notes": self.notes,
            "ok": self.ok,
        }


def iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_verdict(claims: Iterable[Any], decisions: Iterable[Decision],
                  runs: Iterable[Mapping[str, Any]], nodes: Iterable[str] = NODES) -> Verdict:
    """Join the claims table, the beat logs and the executions by (job, occurrence)."""
    rows: dict[tuple[str, str], Row] = {}

    def row(job: str, occurrence: str) -> Row:
        return rows.setdefault((job, occurrence), Row(job, occurrence))

    for claim in claims:
        r = row(claim.job, iso(claim.occurrence))
        r.kind, r.winner = claim.kind, claim.node
    every_sent: Counter[str] = Counter()
    for d in decisions:
        if d.sent and d.occurrence is None:
            every_sent[d.node] += 1
            continue
        r = row(d.job, d.occurrence or "?")
        if d.sent:
            r.senders.append(d.node)
        else:
            r.skipped_by.append(d.node)
            r.reasons.append(d.reason or "?")
    every_node: dict[str, Counter[str]] = defaultdict(Counter)
    for run in runs:
        if run.get("placement") == "every_node":
            every_node[run.get("sent_by") or "?"][run.get("ran_on") or "?"] += 1
        else:
            row(run.get("job") or "?", run.get("occurrence") or "?").ran_on.append(
                run.get("ran_on") or "?")
    problems = []
    duplicates = 0
    for r in rows.values():
        extra = max(len(r.ran_on), len(r.senders)) - 1
        if extra > 0:
            duplicates += extra
            problems.append(f"{r.job} at {r.occurrence} was sent by {r.senders} and ran on "
                            f"{r.ran_on}")
        if r.senders and r.winner is not None and r.senders != [r.winner]:
            problems.append(f"{r.job} at {r.occurrence}: the claims table names {r.winner}, "
                            f"the logs name {r.senders}")
    for sender, where in every_node.items():
        strays = {node: n for node, n in where.items() if node != sender}
        if strays:
            problems.append(f"every-node messages sent by {sender} ran on {strays}")
    notes = []
    missing = [n for n in nodes if not every_node.get(n)]
    if missing:
        notes.append(f"the every-node job did not run on {', '.join(missing)} (a run shorter "
                     "than its 5 s period, or a node stopped before its slot)")
    errors = Counter(reason for r in rows.values() for reason in r.reasons
                     if reason != "claimed-elsewhere")
    if errors:
        notes.append(f"skips other than claimed-elsewhere: {dict(errors)} (see the beat logs)")
    ordered = sorted(rows.values(), key=lambda r: (r.occurrence, r.job))
    return Verdict(ordered, dict(every_node), every_sent, duplicates, problems, notes)


def print_verdict(verdict: Verdict, out: TextIO, nodes: Iterable[str] = NODES) -> None:
    nodes = list(nodes)
    print("\nper occurrence (claims table + beat logs + the workers' results):\n", file=out)
    header = f"{'job':<18} {'occurrence':<21} {'claim':<6} {'winner':<7} " \
             f"{'skipped by':<16} {'ran on':<7} runs"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in verdict.rows:
        skipped = sorted(node if why == "claimed-elsewhere" else f"{node} ({why})"
                         for node, why in zip(r.skipped_by, r.reasons))
        print(f"{r.job:<18} {r.occurrence:<21} {r.kind:<6} {r.winner or '-':<7} "
              f"{', '.join(skipped) or '-':<16} "
              f"{', '.join(r.ran_on) or '-':<7} {len(r.ran_on)}", file=out)
    won = Counter(r.winner for r in verdict.rows if r.winner)
    print("\nper node:\n", file=out)
    print(f"{'node':<8} {'won':>4} {'skipped':>8} {'every-node sent':>16} "
          f"{'every-node ran here':>20}", file=out)
    for node in nodes:
        skips = sum(node in r.skipped_by for r in verdict.rows)
        ran_here = verdict.every_node.get(node, Counter()).get(node, 0)
        print(f"{node:<8} {won[node]:>4} {skips:>8} {verdict.every_node_sent[node]:>16} "
              f"{ran_here:>20}", file=out)
    slots = [r for r in verdict.rows if r.kind == "slot"]
    windows = [r for r in verdict.rows if r.kind == "window"]
    print(f"\ncluster occurrences: {len(verdict.rows)} (exact slots: {len(slots)}, "
          f"interval windows: {len(windows)}), executions: "
          f"{sum(len(r.ran_on) for r in verdict.rows)}", file=out)
    runs = {n: sum(c.values()) for n, c in sorted(verdict.every_node.items())}
    print(f"every-node runs per node: {runs}", file=out)
    for note in verdict.notes:
        print(f"note: {note}", file=out)
    for problem in verdict.problems:
        print(f"PROBLEM: {problem}", file=out)
    print(f"duplicates: {verdict.duplicates}", file=out, flush=True)


# -- the processes ---------------------------------------------------------------


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


def _interrupt(signum: int, frame: Any) -> None:
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
                                   f"({p.log_path}) ends:\n{_tail(p.log())}")
        if pending and time.monotonic() > deadline:
            names = ", ".join(p.name for p in pending)
            raise RuntimeError(f"{names} not ready after {timeout:g}s; the log of "
                               f"{pending[0].name} ends:\n{_tail(pending[0].log())}")
        time.sleep(0.2)


def _tail(text: str, n: int = 25) -> str:
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


def _iter_sleep(seconds: float, step: float = 0.2) -> Iterator[None]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))


def run(seconds: float, out: TextIO, keep: bool = False, json_path: Path | None = None) -> int:
    """Run the demo; return its exit code.

    0: no duplicates; 1: a duplicate (or another broken guarantee); 2: the demo could
    not run (a process did not start, or the claims database is unreachable);
    130: interrupted.
    """
    workdir = Path(tempfile.mkdtemp(prefix="elarion-demo-"))
    run_id = uuid.uuid4().hex[:8]
    external_dsn = os.environ.get("ELARION_BEAT_DSN")
    dsn = external_dsn or f"sqlite:///{workdir / 'claims.db'}"
    broker = os.environ.get("CELERY_BROKER_URL") or "filesystem://"
    # on a shared database, tables of this run only (dropped at the end)
    table = f"elarion_demo_{run_id}_claims" if external_dsn else None
    if broker.startswith("filesystem"):
        for folder in filesystem_options(workdir).values():
            if isinstance(folder, str):
                Path(folder).mkdir(parents=True, exist_ok=True)
        declare_filesystem_queues(workdir, run_id)
    processes: list[Process] = []
    beats: list[Process] = []
    failure: str | None = None
    # Ctrl-C and SIGTERM both stop the replicas (SIGINT explicitly: a shell starting the
    # demo in the background would have it ignored)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupted = False
    started = time.monotonic()
    try:
        print(f"celery-elarion-beat demo: 3 nodes ({', '.join(NODES)}), each a real beat "
              f"and a real worker\n  claims: {mask_dsn(dsn)}{_tables_note(table)}"
              f"\n  broker: {mask_dsn(broker)}{_queues_note(broker, run_id)}"
              f"\n  work directory: {workdir}"
              f"\n  schedule: {CRON_JOB} cron('*/2 * * * * *'), {CRONTAB_JOB} crontab(), "
              f"{INTERVAL_JOB} timedelta(seconds=3), "
              f"{EVERY_NODE_JOB} cron('*/5 * * * * *') placement every_node", file=out,
              flush=True)
        for node in NODES:
            env = child_env(workdir, node, dsn, broker, run_id, table)
            base = [sys.executable, "-m", "celery", "-A", "celery_elarion_beat.demo"]
            worker = Process(f"{node} worker", [
                *base, "worker", "-l", "INFO", "--pool", "solo", "-n", f"{node}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat"],
                env, workdir / f"{node}-worker.log", workdir / node)
            beat = Process(f"{node} beat", [
                *base, "beat", "-S", "celery_elarion_beat.ClaimingScheduler", "-l", "INFO"],
                env, workdir / f"{node}-beat.log", workdir / node)
            processes += [worker, beat]
        workers, beats = processes[0::2], processes[1::2]
        # workers first: they declare and bind the node queues before beat sends
        for p in workers:
            p.start()
        wait_for(workers, r"\bready\.", timeout=90)
        for p in beats:
            p.start()
        wait_for(beats, r"beat: claiming occurrences in", timeout=90)
        pids = ", ".join(f"{p.name} {p.proc.pid}" for p in processes if p.proc)
        print(f"  started ({time.monotonic() - started:.0f} s): {pids}\n"
              f"running for {seconds:g} s; one line per executed occurrence:", file=out,
              flush=True)
        progress = Progress(workdir / RESULTS, out)
        for _ in _iter_sleep(seconds):
            progress.poll()
            dead = [p for p in processes if not p.alive()]
            if dead:
                first = dead[0]
                code = first.proc.returncode if first.proc else None
                raise RuntimeError(
                    f"{', '.join(p.name for p in dead)} exited early (exit code {code}); "
                    f"the log of {first.name} ({first.log_path}) ends:\n{_tail(first.log())}")
        print("stopping the beats; the workers finish what was sent", file=out, flush=True)
        for p in beats:
            p.signal(signal.SIGTERM)
        for p in beats:
            p.stop(20)
        _drain(workdir, beats, progress)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the replicas", file=out, flush=True)
    except RuntimeError as exc:  # a process did not start, or died
        failure = str(exc)
        print(f"\nthe demo failed: {exc}", file=out, flush=True)
    finally:
        try:
            for p in processes:
                p.signal(signal.SIGTERM)
            for p in processes:
                p.stop(15)
        except KeyboardInterrupt:
            for p in processes:
                p.signal(signal.SIGKILL)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is not None:
        _delete_queues(broker, run_id, out)
        _cleanup(workdir, dsn, table, keep=True, out=out)  # keep the logs to look at
        return 2
    try:
        verdict, error = _verdict(workdir, beats, dsn, table)
        print_verdict(verdict, out)
        if json_path is not None:
            json_path.write_text(json.dumps(verdict.as_dict(), indent=1))
        if error:
            print(f"\nthe claims table could not be read: {error}\nThe beats failed closed: "
                  "they skipped every cluster occurrence (claim-error) and sent only the "
                  "every-node entry.", file=out, flush=True)
    finally:
        _delete_queues(broker, run_id, out)
        _cleanup(workdir, dsn, table, keep, out)
    if interrupted:
        return 130
    if error:
        return 2
    return 0 if verdict.ok else 1


def _queues_note(broker: str, run: str) -> str:
    if broker.startswith("filesystem"):
        return ""
    return f" (queues elarion-demo-{run} and elarion-demo-{run}.node.*, deleted at the end)"


def _tables_note(table: str | None) -> str:
    if not table:
        return ""
    nodes = table[: -len("_claims")] + "_nodes"
    return f" (tables {table} and {nodes}, dropped at the end)"


def _drain(workdir: Path, beats: list[Process], progress: Progress,
           timeout: float = 15.0) -> None:
    """Wait until every message the beats sent has run (or *timeout*)."""
    sent = sum(d.sent for b in beats for d in parse_beat_log(b.name.split()[0], b.log()))
    for _ in _iter_sleep(timeout):
        progress.poll()
        try:
            done = (workdir / RESULTS).read_bytes().count(b"\n")
        except FileNotFoundError:
            done = 0
        if done >= sent:
            return


def _open_store(dsn: str, table: str | None) -> Any:
    from .settings import Settings
    from .store import open_store

    values: dict[str, Any] = {"elarion_beat_dsn": dsn, "elarion_beat_node": "demo"}
    if table:
        values["elarion_beat_table"] = table
    return open_store(Settings.from_mapping(values))


def _verdict(workdir: Path, beats: list[Process], dsn: str,
             table: str | None) -> tuple[Verdict, str | None]:
    """The verdict, and why the claims table could not be read (if it could not)."""
    from .exceptions import StoreError

    decisions = [d for b in beats for d in parse_beat_log(b.name.split()[0], b.log())]
    claims: list[Any] = []
    error = None
    store = _open_store(dsn, table)
    try:
        claims = [c for c in store.find_claims(limit=1_000_000) if not c.job.startswith("elarion.")]
    except StoreError as exc:
        error = str(exc).splitlines()[0]
    finally:
        store.close()
    return build_verdict(claims, decisions, read_results(workdir / RESULTS)), error


def _delete_queues(broker: str, run: str, out: TextIO) -> None:
    """On a real broker, delete this run's queues and its exchange (not elarion.node)."""
    if broker.startswith("filesystem"):
        return
    demo_app = make_app({ENV_BROKER: broker, ENV_RUN: run})
    queue = demo_app.conf.task_default_queue
    names = [queue, *(demo_app.conf.elarion_beat_node_queue.format(node=n) for n in NODES)]
    try:
        with demo_app.connection_for_write() as conn:
            channel = conn.default_channel
            for name in names:
                channel.queue_delete(name)
            channel.exchange_delete(queue)
    except Exception as exc:  # the verdict is printed; leftover queues are not fatal
        print(f"could not delete the demo queues {', '.join(names)}: {exc}", file=out)


def _cleanup(workdir: Path, dsn: str, table: str | None, keep: bool, out: TextIO) -> None:
    if table:  # this run's tables in a shared database
        store = _open_store(dsn, table)
        try:
            engine = getattr(store, "engine", None)
            for t in (getattr(store, "table", None), getattr(store, "nodes_table", None)):
                if engine is not None and t is not None:
                    t.drop(engine, checkfirst=True)
        except Exception as exc:  # the verdict is printed; a leftover table is not fatal
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"could not drop the demo tables {table}: {reason}", file=out)
        finally:
            store.close()
    if keep:
        print(f"logs, results and broker folders kept in {workdir}", file=out, flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m celery_elarion_beat.demo",
        description="Start three real beat replicas and their workers, run them for a "
                    "while, and show that every occurrence ran once.")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long the replicas run once started (default 60)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, results, SQLite claims)")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the final table (the verdict) to FILE as JSON")
    args = parser.parse_args(argv)
    return run(args.seconds, sys.stdout, keep=args.keep, json_path=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
