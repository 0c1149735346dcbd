"""Run the demo: start the replicas, wait, stop them, print the verdict."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from ..config.dsn import mask_dsn
from ..config.parsers import format_duration
from ..testing._harness.processes import (
    ChildProcess,
    ProcessError,
    ProcessManager,
    stop_all,
)
from ..testing._harness.tables import claims_tables, drop_tables
from .app import (
    CRON_JOB,
    CRONTAB_JOB,
    DEMO_CLUSTER,
    ENV_BROKER,
    ENV_RUN,
    EVERY_NODE_JOB,
    INTERVAL_JOB,
    NODES,
    RESULTS,
    declare_filesystem_queues,
    filesystem_options,
    make_app,
)
from .processes import Progress, demo_env, interrupt, iter_sleep
from .verdict import (
    Verdict,
    build_verdict,
    parse_beat_log,
    print_verdict,
    read_results,
)


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
    pm = ProcessManager(workdir, "celery_elarion_beat.demo",
                        demo_env(workdir, dsn, broker, run_id, table))
    beats: dict[str, ChildProcess] = {}
    failure: str | None = None
    # Ctrl-C and SIGTERM both stop the replicas (SIGINT explicitly: a shell starting the
    # demo in the background would have it ignored)
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupted = False
    try:
        _announce(out, dsn, broker, table, run_id, workdir)
        beats = _start_replicas(pm, seconds, out)
        progress = _run_for(pm, seconds, workdir, out)
        print("stopping the beats; the workers finish what was sent", file=out, flush=True)
        stop_all(beats.values(), 20)
        _drain(workdir, beats, progress)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the replicas", file=out, flush=True)
    except ProcessError as exc:  # a process did not start, or died
        failure = str(exc)
        print(f"\nthe demo failed: {exc}", file=out, flush=True)
    finally:
        try:
            pm.stop_all(15)
        except KeyboardInterrupt:
            for p in pm.processes:
                p.signal(signal.SIGKILL)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is not None:
        _delete_queues(broker, run_id, out)
        _cleanup(workdir, dsn, table, keep=True, out=out)  # keep the logs to look at
        return 2
    try:
        code = _report(workdir, beats, dsn, table, out, json_path)
    finally:
        _delete_queues(broker, run_id, out)
        _cleanup(workdir, dsn, table, keep, out)
    return 130 if interrupted else code


def _announce(out: TextIO, dsn: str, broker: str, table: str | None, run_id: str,
              workdir: Path) -> None:
    print(f"celery-elarion-beat demo: 3 nodes ({', '.join(NODES)}), each a real beat "
          f"and a real worker\n  claims: {mask_dsn(dsn)}{_tables_note(table)}"
          f"\n  broker: {mask_dsn(broker)}{_queues_note(broker, run_id)}"
          f"\n  work directory: {workdir}"
          f"\n  schedule: {CRON_JOB} cron('*/2 * * * * *'), {CRONTAB_JOB} crontab(), "
          f"{INTERVAL_JOB} timedelta(seconds=3), "
          f"{EVERY_NODE_JOB} cron('*/5 * * * * *') placement every_node", file=out,
          flush=True)


def _start_replicas(pm: ProcessManager, seconds: float, out: TextIO) -> dict[str, ChildProcess]:
    """Start every node's worker, then its beat; return the beats once all are up."""
    started = time.monotonic()
    # workers first: they declare and bind the node queues before beat sends
    workers = [pm.worker(f"{node}-worker", env={"ELARION_BEAT_NODE": node}) for node in NODES]
    for worker in workers:
        worker.wait_for_log(r"\bready\.", 90)
    beats = {node: pm.beat(f"{node}-beat", env={"ELARION_BEAT_NODE": node}) for node in NODES}
    for beat in beats.values():
        beat.wait_for_log(r"beat: claiming occurrences in", 90)
    pids = ", ".join(f"{p.name} {p.pid}" for p in pm.processes)
    print(f"  started ({format_duration(time.monotonic() - started, 1)}): {pids}\n"
          f"running for {format_duration(seconds)}; one line per executed occurrence:",
          file=out, flush=True)
    return beats


def _run_for(pm: ProcessManager, seconds: float, workdir: Path, out: TextIO) -> Progress:
    """Let the replicas run, printing each execution; fail if one of them dies."""
    progress = Progress(workdir / RESULTS, out)
    for _ in iter_sleep(seconds):
        progress.poll()
        dead = [p for p in pm.processes if not p.alive()]
        if dead:
            raise ProcessError(f"{', '.join(p.name for p in dead)} exited early\n"
                               f"{dead[0].tail(25)}")
    return progress


def _report(workdir: Path, beats: dict[str, ChildProcess], dsn: str, table: str | None,
            out: TextIO, json_path: Path | None) -> int:
    """Print (and write) the verdict; 0 when sound, 1 when a guarantee broke, 2 when the
    claims could not be read."""
    verdict, error = _verdict(workdir, beats, dsn, table)
    print_verdict(verdict, out)
    if json_path is not None:
        json_path.write_text(json.dumps(verdict.as_dict(), indent=1))
    if error:
        print(f"\nthe claims table could not be read: {error}\nThe beats failed closed: "
              "they skipped every cluster occurrence (claim-error) and sent only the "
              "every-node entry.", file=out, flush=True)
        return 2
    return 0 if verdict.ok else 1


def _queues_note(broker: str, run: str) -> str:
    if broker.startswith("filesystem"):
        return ""
    return f" (queues elarion-demo-{run} and elarion-demo-{run}.node.*, deleted at the end)"


def _tables_note(table: str | None) -> str:
    if not table:
        return ""
    return f" (tables {', '.join(claims_tables(table))}, dropped at the end)"


def _drain(workdir: Path, beats: dict[str, ChildProcess], progress: Progress,
           timeout: float = 15.0) -> None:
    """Wait until every message the beats sent has run (or *timeout*)."""
    sent = sum(d.sent for node, b in beats.items() for d in parse_beat_log(node, b.log()))
    for _ in iter_sleep(timeout):
        progress.poll()
        try:
            done = (workdir / RESULTS).read_bytes().count(b"\n")
        except FileNotFoundError:
            done = 0
        if done >= sent:
            return


def _open_store(dsn: str, table: str | None) -> Any:
    from ..config.settings import Settings
    from ..store.registry import open_store

    values: dict[str, Any] = {"elarion_beat_dsn": dsn, "elarion_beat_node": "demo",
                              "elarion_beat_cluster": DEMO_CLUSTER}
    if table:
        values["elarion_beat_table"] = table
    return open_store(Settings.from_mapping(values))


def _verdict(workdir: Path, beats: dict[str, ChildProcess], dsn: str,
             table: str | None) -> tuple[Verdict, str | None]:
    """The verdict, and why the claims table could not be read (if it could not)."""
    from ..exceptions import StoreError

    decisions = [d for node, b in beats.items() for d in parse_beat_log(node, b.log())]
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
        try:
            drop_tables(dsn, *claims_tables(table))
        except Exception as exc:  # the verdict is printed; a leftover table is not fatal
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"could not drop the demo tables {table}: {reason}", file=out)
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
