"""Acceptance: a stock beat left among the claiming replicas is named (issue #33).

An "old image" (:mod:`tests.acceptance.proj_old_image`, an app module that never
imports the library) runs ``celery beat`` with Celery's stock scheduler beside two
claiming beats and a worker of the app that calls ``install_worker``
(:mod:`tests.acceptance.proj_guard`): every occurrence goes out twice, and nothing of
the library runs on that replica. Celery (5.7) stamps the stock beat's messages with
``celery_beat_task`` and never with ``elarion_job``; the worker sees that, and within
two periods of the stock beat's first message:

* logs ONE ERROR for that sender (``action: foreign-beat``), naming its ``origin``
  (``gen<pid>@<host>``: the process and the host to go and stop), the task and the
  entry of the app's ``beat_schedule`` that has that task;
* sends an ``elarion-foreign-beat`` event, which the metrics count as
  ``elarion_beat_foreign_beat_messages_total{origin,task}`` (read here through the
  exporter's event listener on the run's own event exchange);
* records the sender in the claims database, so that ``celery -A proj elarion-beat
  status --since 2m --json``, from any machine, lists it in ``foreign_beats`` and
  exits 1 with the finding ``foreign-beat`` (``--fail-on`` can leave it out).
"""

from __future__ import annotations

import ast
import socket
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from celery_elarion_beat.observe.exporter import EventListener
from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.observe.metrics import OccurrenceCounters
from celery_elarion_beat.testing._harness import ChildProcess, wait_until
from tests.acceptance import proj_guard, proj_old_image
from tests.acceptance.guard import START_TIMEOUT, GuardRun, json_output

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# claiming beats, a stock beat and a tracking worker; a sender named within two periods
pytestmark += [pytest.mark.heavy]

PERIOD = proj_guard.PERIOD
METRIC = "elarion_beat_foreign_beat_messages_total"


def foreign_messages(registry: CollectorRegistry, origin: str) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples
               if s.name == METRIC and s.labels.get("origin") == origin
               and s.labels.get("task") == proj_guard.TASK)


def test_a_stock_beat_beside_the_claiming_ones_is_named_and_reported(
        tmp_path: Path, pg_dsn: str, redis_url: str) -> None:
    imported = {alias.name.split(".")[0] if isinstance(node, ast.Import) else
                str(node.module).split(".")[0]
                for node in ast.walk(ast.parse(Path(proj_old_image.__file__).read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    assert "celery_elarion_beat" not in imported and "tests" not in imported, imported
    run = GuardRun(tmp_path / "procs", pg_dsn, redis_url)
    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry)
    app = proj_guard.make_app(run.env)
    listener = EventListener(app, counters.observe)
    thread = threading.Thread(target=listener.run, daemon=True, name="guard-listener")
    thread.start()
    try:
        assert listener.ready.wait(30), "the event listener did not start"
        beats = [run.pm.beat(f"beat-{i}", env=run.node(f"claim{i}"), scheduler="elarion")
                 for i in (1, 2)]
        worker = run.pm.worker("w-track", env=run.claims)
        for beat in beats:
            beat.wait_for_record({"action": "started"}, START_TIMEOUT)
        worker.wait_for_log(r"\bready\.", START_TIMEOUT)

        old = run.old.celery("old-beat", ["beat", "-l", "INFO"])
        origin = f"gen{old.pid}@{socket.gethostname()}"
        named = worker.wait_for_record({"action": "foreign-beat"}, START_TIMEOUT)
        assert named["level"] == "ERROR", named
        assert (named["origin"], named["task"], named["entry"]) == (
            origin, proj_guard.TASK, proj_guard.JOB), named
        for words in (origin, proj_guard.TASK, proj_guard.JOB):
            assert words in named["message"], named

        # within two periods of the stock beat's first message (its own clock, sent_at)
        def stock_runs() -> list[float]:
            return sorted(r.sent_at for r in run.runs()
                          if r.origin == origin and r.job is None and r.sent_at)

        first = wait_until(stock_runs, 30, interval=0.5,
                           message=lambda: f"a run of the stock beat\n{run.tails()}")[0]
        assert record_time(named) - first <= 2 * PERIOD, (named["ts"], first)
        assert all(r.beat_header == "True" for r in run.runs() if r.origin == origin)

        # one ERROR per sender, however many messages it sends
        wait_until(lambda: len(stock_runs()) >= 3, 30, interval=0.5,
                   message=lambda: f"three runs of the stock beat\n{run.tails()}")
        assert len(worker.records(action="foreign-beat")) == 1, worker.tail()

        # the metric, from the worker's elarion-foreign-beat events
        wait_until(lambda: foreign_messages(registry, origin) >= 2, 30, interval=0.5,
                   message=lambda: f"{METRIC} for {origin}\n{worker.tail()}")

        # status, from any machine: the sender, its count, the finding, exit 1
        def status(*args: str) -> ChildProcess:
            command = run.pm.celery(f"status-{len(run.pm.processes)}", [
                "elarion-beat", "status", "--since", "2m", "--json", *args], env=run.claims)
            assert command.wait(START_TIMEOUT) is not None, command.tail()
            return command

        def reported() -> tuple[ChildProcess, dict] | None:
            command = status()
            report = json_output(command)
            return (command, report) if report["foreign_beats"] else None

        command, report = wait_until(reported, 60, interval=0.5,
                                     message=lambda: f"status naming the sender\n{run.tails()}")
        assert command.returncode == 1, command.tail()
        assert "foreign-beat" in report["findings"] and not report["healthy"], report
        senders = {s["origin"]: s for s in report["foreign_beats"]}
        assert set(senders) == {origin}, senders
        sender = senders[origin]
        assert sender["count"] >= 1 and sender["host"] == socket.gethostname(), sender
        assert [(t["task"], t["entry"]) for t in sender["tasks"]] == [
            (proj_guard.TASK, proj_guard.JOB)], sender
        assert sender["last_seen"] >= sender["first_seen"], sender
        # --fail-on chooses: without foreign-beat the same report exits 0
        quiet = status("--fail-on", "missed,drift")
        assert quiet.returncode == 0, quiet.tail()
        assert "foreign-beat" in json_output(quiet)["findings"]
    finally:
        run.close()
        listener.stop()
        thread.join(10)
        app.close()
